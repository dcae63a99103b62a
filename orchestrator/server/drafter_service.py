"""`hetspec.v1.Drafter`: a local drafter served to remote target engines, one session per stream.

Each Session stream belongs to one target engine. Frames are answered in order; sequence
ids are the engine's and are mapped to ids unique in this process, so several engines can
share one drafter. When a stream ends (closed, cancelled, broken), its sequences are freed.
A malformed frame ends the stream with INVALID_ARGUMENT naming the field.
"""

import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import grpc
import torch

import protocol
from orchestrator.config import MAX_SPECULATIVE_TOKENS, check_sampling
from orchestrator.engine import Drafter
from orchestrator.errors import InvalidRequestError
from orchestrator.server.one_thread import OneThread
from orchestrator.server.parsing import lenient
from protocol import BlockError
from protocol.pb import drafter_pb2 as pb

SERVICE = "hetspec.v1.Drafter"
MAX_DRAFT = MAX_SPECULATIVE_TOKENS
MAX_SEQUENCES_PER_SESSION = 1024


@dataclass
class _Seq:
    local_id: int
    num_committed: int
    last_draft: list[int] = field(default_factory=list)
    generator: torch.Generator | None = None
    pending_probs: torch.Tensor | None = None  # [num_draft, vocab]: this step's q, until packed


class DrafterServicer:
    """Serves one local drafter (ONNX, torch, n-gram) to any number of sessions."""

    def __init__(self, drafter: Drafter, vocab_size: int | None, max_prompt_tokens: int = 1 << 16,
                 model_id: str | None = None, transport: str = "inline"):
        self.drafter = drafter
        self.transport = transport  # how probability blocks go back: inline | shared_memory
        self.blocks_in = protocol.BlockUnpacker()  # K/V handed off by targets
        self.vocab_size = vocab_size
        self.max_prompt_tokens = max_prompt_tokens
        # set for a self-drafter that can start from the target's K/V (KV handoff): blocks must
        # come from this model (the target's checkpoint key) and fit the drafter's geometry
        self.model_id = model_id if hasattr(drafter, "start_with_kv") else None
        self.num_kv_opens = 0
        self._lock = threading.Lock()  # the sessions' bookkeeping
        # the drafter's state is not thread-safe: its calls run one at a time, on the handler threads,
        # or, replaced by a `OneThread()` that something runs (`hetspec drafter serve`: the main thread,
        # where torch loaded the model), on that thread
        self.drafter_thread = OneThread(hand_over=False)
        self._ids = itertools.count()
        self.num_sessions = 0  # ever opened
        self._live: dict[int, dict] = {}  # open sessions' sequences, by session number

    def register(self, server: grpc.Server) -> str:
        handler = grpc.stream_stream_rpc_method_handler(
            self.Session, request_deserializer=lenient(pb.DrafterRequest),
            response_serializer=pb.DrafterResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"Session": handler}),))
        return SERVICE

    def Session(self, requests: Iterator[pb.DrafterRequest], context: grpc.ServicerContext) -> Iterator[pb.DrafterResponse]:
        seqs: dict[int, _Seq] = {}
        # one packer per session: its shared-memory blocks live until the session's next batch
        packer = protocol.BlockPacker(self.transport)
        with self._lock:
            number = self.num_sessions
            self.num_sessions += 1
            self._live[number] = seqs
        try:
            for frame in requests:
                if frame.protocol_version != protocol.PROTOCOL_VERSION:
                    raise InvalidRequestError(f"protocol_version: {frame.protocol_version} is not supported "
                                              f"(expected PROTOCOL_VERSION_1)", "protocol_version")
                yield self._answer(frame, seqs, packer)
        finally:
            with self._lock:
                del self._live[number]
            self.drafter_thread.call(lambda: [self.drafter.finish(seq.local_id) for seq in seqs.values()])
            packer.close()

    def load(self) -> tuple[int, int]:
        """(open sessions, open sequences): what a pool routes new sessions by."""
        with self._lock:
            return len(self._live), sum(len(seqs) for seqs in self._live.values())

    def _answer(self, frame: pb.DrafterRequest, seqs: dict[int, _Seq],
                packer: protocol.BlockPacker) -> pb.DrafterResponse:
        return self.drafter_thread.call(lambda: self._answer_here(frame, seqs, packer))

    def _answer_here(self, frame: pb.DrafterRequest, seqs: dict[int, _Seq],
                     packer: protocol.BlockPacker) -> pb.DrafterResponse:
        body = frame.WhichOneof("body")
        reply = pb.DrafterResponse(protocol_version=protocol.PROTOCOL_VERSION, request_id=frame.request_id)
        if body == "propose":
            for i, r in enumerate(frame.propose.results):
                self._verify(r, seqs, f"propose.results[{i}]")
            t0 = time.perf_counter_ns()
            catch_ups = []
            proposals = []
            for i, r in enumerate(frame.propose.requests):
                proposals.append(self._propose(r, seqs, f"propose.requests[{i}]"))
                catch_ups.append(self.drafter.last_catch_up)
            self._attach_probs(proposals, seqs, packer)
            reply.proposals.proposals.extend(proposals)
            reply.proposals.compute_ns = time.perf_counter_ns() - t0
            if catch_ups and None not in catch_ups:
                reply.proposals.catch_up_ns = int(sum(c.seconds for c in catch_ups) * 1e9)
                reply.proposals.catch_up_tokens = sum(c.tokens for c in catch_ups)
        elif body == "verify":
            for i, r in enumerate(frame.verify.results):
                self._verify(r, seqs, f"verify.results[{i}]")
            reply.ack.SetInParent()
        elif body == "open":
            reply.ack.num_tokens = self._open(frame.open, seqs)
        elif body == "close":
            seq = seqs.pop(frame.close.sequence_id, None)
            if seq is not None:
                self.drafter.finish(seq.local_id)
            reply.ack.SetInParent()
        else:
            raise InvalidRequestError("body: empty frame (expected open, propose, verify or close)", "body")
        return reply

    def _open(self, m: pb.OpenSequence, seqs: dict[int, _Seq]) -> int:
        if m.sequence_id in seqs:
            raise InvalidRequestError(f"open.sequence_id: {m.sequence_id} is already open in this session")
        if len(seqs) >= MAX_SEQUENCES_PER_SESSION:
            raise InvalidRequestError(f"open: a session holds at most {MAX_SEQUENCES_PER_SESSION} sequences")
        ids = list(m.prompt_ids)
        if not 1 <= len(ids) <= self.max_prompt_tokens:
            raise InvalidRequestError(f"open.prompt_ids: needs 1..{self.max_prompt_tokens} tokens, got {len(ids)}")
        self._check_ids(ids, "open.prompt_ids")
        seq = _Seq(local_id=next(self._ids), num_committed=len(ids))
        if m.HasField("seed"):
            seq.generator = torch.Generator().manual_seed(m.seed)
        if m.kv_blocks:
            self._start_with_kv(seq.local_id, ids, m.kv_blocks)
        else:
            self.drafter.start(seq.local_id, ids)
        seqs[m.sequence_id] = seq
        return len(ids)

    def _start_with_kv(self, local_id: int, ids: list[int], blocks) -> None:
        """KV handoff: the prompt's K/V from the target replace the drafter's prefill over them."""
        where = "open.kv_blocks"
        if self.model_id is None:
            raise InvalidRequestError(f"{where}: this drafter does not take KV blocks; send prompt_ids only", where)
        if len(blocks) != 1:
            raise InvalidRequestError(f"{where}: expected one KV block, got {len(blocks)}", where)
        drafter = self.drafter
        try:
            d, payload = self.blocks_in.unpack(blocks[0])  # every field validated, checksum verified
            n = d.tokens.end
            if d.tokens.start != 0 or not 0 < n < len(ids):
                raise BlockError("tokens", f"must cover [0, n) with 0 < n < {len(ids)} prompt tokens, "
                                           f"got [{d.tokens.start}, {n})")
            kv = protocol.read_kv(d, payload, model_id=self.model_id, num_layers=drafter.num_layers,
                                  num_kv_heads=drafter.num_kv_heads, head_dim=drafter.head_dim)  # [L, 2, H, n, D]
        except BlockError as e:
            raise InvalidRequestError(f"{where}[0].{e}", f"{where}[0].{e.field}") from None
        drafter.start_with_kv(local_id, ids, kv)
        self.num_kv_opens += 1

    def _propose(self, r: pb.DraftRequest, seqs: dict[int, _Seq], where: str) -> pb.DraftProposal:
        seq = self._seq(r.sequence_id, seqs, where)
        if not 1 <= r.num_draft <= MAX_DRAFT:
            raise InvalidRequestError(f"{where}.num_draft: must be in [1, {MAX_DRAFT}], got {r.num_draft}",
                                      f"{where}.num_draft")
        top_p = r.top_p or 1.0  # proto3 default 0 reads as "off"
        check_sampling(r.temperature, r.top_k, top_p, where=f"{where}.")
        draft = self.drafter.propose(seq.local_id, r.num_draft, r.temperature, r.top_k, top_p, seq.generator)
        seq.last_draft = list(draft.draft_ids)
        seq.pending_probs = draft.draft_probs if r.want_probs else None
        return pb.DraftProposal(sequence_id=r.sequence_id, draft_ids=draft.draft_ids)

    def _attach_probs(self, proposals: list[pb.DraftProposal], seqs: dict[int, _Seq],
                      packer: protocol.BlockPacker) -> None:
        """The wanted draft distributions q as DRAFT_PROBS blocks, packed as one batch."""
        wanted = []
        for out in proposals:
            seq = seqs[out.sequence_id]
            if seq.pending_probs is not None:
                probs = seq.pending_probs.to(torch.float32).contiguous()  # [num_draft, vocab]
                tokens = (seq.num_committed, seq.num_committed + len(out.draft_ids))
                wanted.append((out, protocol.encode(probs, kind=protocol.TensorKind.DRAFT_PROBS,
                                                    layout=protocol.Layout.TOKENS_VOCAB,
                                                    sequence_id=out.sequence_id, tokens=tokens)))
                seq.pending_probs = None
        for (out, _), block in zip(wanted, packer.pack_batch([enc for _, enc in wanted])):
            out.draft_probs.CopyFrom(block)

    def _verify(self, r: pb.VerifyResult, seqs: dict[int, _Seq], where: str) -> None:
        seq = self._seq(r.sequence_id, seqs, where)
        if r.rollback_to > seq.num_committed:
            raise InvalidRequestError(f"{where}.rollback_to: {r.rollback_to} is past the {seq.num_committed} "
                                      f"committed tokens")
        if r.num_accepted > len(seq.last_draft):
            raise InvalidRequestError(f"{where}.num_accepted: {r.num_accepted} exceeds the last proposal's "
                                      f"{len(seq.last_draft)} tokens")
        append = seq.last_draft[:r.num_accepted] + ([r.bonus_token_id] if r.HasField("bonus_token_id") else [])
        append += list(r.append_ids)
        self._check_ids(append, f"{where}.bonus_token_id/append_ids")
        if r.rollback_to < seq.num_committed:
            self.drafter.rollback(seq.local_id, seq.num_committed - r.rollback_to)
        if r.rollback_to == 0 and not append:
            raise InvalidRequestError(f"{where}: would leave the sequence without tokens")
        if append:
            self.drafter.extend(seq.local_id, append)
        seq.num_committed = r.rollback_to + len(append)
        seq.last_draft = []
        if r.HasField("hidden_states"):
            self._hidden(seq, r.hidden_states, f"{where}.hidden_states")

    def _hidden(self, seq: _Seq, block, where: str) -> None:
        """The target's hidden states for an MTP drafter; it checks model, size and token range."""
        if not self.drafter.reads_hidden:
            raise InvalidRequestError(f"{where}: this drafter does not read hidden states", where)
        try:
            self.drafter.accept_hidden(seq.local_id, block)
        except BlockError as e:
            raise InvalidRequestError(f"{where}.{e}", f"{where}.{e.field}") from None

    def _seq(self, sequence_id: int, seqs: dict[int, _Seq], where: str) -> _Seq:
        try:
            return seqs[sequence_id]
        except KeyError:
            raise InvalidRequestError(f"{where}.sequence_id: {sequence_id} is not open in this session") from None

    def _check_ids(self, ids: list[int], where: str) -> None:
        limit = self.vocab_size
        if any(t < 0 or (limit is not None and t >= limit) for t in ids):
            raise InvalidRequestError(f"{where}: token ids must be in [0, {limit})")
