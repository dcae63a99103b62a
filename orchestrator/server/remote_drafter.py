"""A drafter in another process or host, over the `hetspec.v1.Drafter` session stream.

To the engine it is a drafter like any other. Underneath, it keeps a mirror of every
sequence's committed tokens, so the remote side can always be rebuilt: when the drafter
dies, stalls past `timeout_s`, or answers with something malformed, the session is dropped,
every step runs target-only (empty drafts marked `unavailable`; greedy output is unchanged),
and once the channel is ready again a new session re-opens the live sequences from the
mirror and speculation resumes. Reconnects back off exponentially, and a new session is used
only once the drafter has answered a probe, so one that is still busy or stalled keeps the
engine target-only instead of holding up another step for `timeout_s`.

Frames per engine step: new sequences as OpenSequence frames (opened lazily, at their first
draft, so a sampled request's seed can travel with them), then one ProposeBatch carrying the
verify results since the last step and this step's draft requests; answers come back in
order, and only the proposals are waited for. Usually that is one frame and one answer.

For an MTP drafter (`reads_hidden`) the mirror also keeps the target's hidden states of every
committed position; the rows the drafter has not had travel as HIDDEN_STATE blocks (float16 on the
wire, split to fit a message) in hidden-only verify results of the next batch, and a re-opened
sequence gets all of them again.

The session itself (channel, probe, backoff, and a resolver when a drafter pool picks the
address) is kept by `remote_link.SessionLink`.
"""

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import torch

import protocol
from orchestrator.config import RemoteDrafterConfig
from orchestrator.drafters import DrafterContext
from orchestrator.engine import CatchUp, Drafter, DrafterStatus, DraftProposal, DraftRequest
from orchestrator.engine.swap import export_kv
from orchestrator.models import TargetRunner
from orchestrator.server.channels import ChannelOptions, token_from_env
from orchestrator.server.remote_hidden import HiddenRows
from orchestrator.server.remote_link import SessionLink
from orchestrator.server.remote_session import V1, DrafterFailure, check_answer
from orchestrator.tracing import Span, Tracer, Track
from protocol import BlockError
from protocol.pb import drafter_pb2 as pb

log = logging.getLogger(__name__)

KV_FIELD = "open.kv_blocks"  # a drafter that refuses our K/V names this field


@dataclass
class _Mirror:
    committed: list[int]
    opened: bool = False  # open in the current session
    last_draft: list[int] = field(default_factory=list)
    hidden: HiddenRows = field(default_factory=HiddenRows)  # the target's states (an MTP drafter)


class RemoteDrafter(SessionLink, Drafter):
    """The Drafter interface over gRPC, with failover to target-only and reconnection."""

    name = "remote"

    def __init__(self, address: str | None, channel_options: ChannelOptions | None = None, timeout_s: float = 5.0,
                 vocab_size: int | None = None, backoff_s: tuple[float, float] = (0.5, 30.0),
                 prefill_allowance_s_per_token: float = 0.005, connect_timeout_s: float | None = None,
                 kv_source: TargetRunner | None = None, staging: protocol.StagingPool | None = None,
                 transport: str = "inline", tracer: Tracer | None = None, reads_hidden: bool = False,
                 model_id: str = "", resolve: Callable[[], str | None] | None = None):
        if address is None and resolve is None:
            raise ValueError("a remote drafter needs an address or a resolver")
        SessionLink.__init__(self, address, channel_options, timeout_s, backoff_s, resolve)
        self.reads_hidden = reads_hidden  # an MTP drafter: the target's hidden states go with every batch
        self.model_id = model_id  # the target's, on the hidden-state blocks
        self._hidden_packer = protocol.BlockPacker("inline")
        # each propose round trip less the drafter's own compute is recorded as a `wire` span
        self.tracer = tracer or Tracer(enabled=False)
        self._wire_track = Track(address or "drafter pool", "wire")
        # KV handoff: the target whose prefill K/V open each sequence on a remote self-drafter
        self.kv_source = kv_source
        self._staging = staging or (protocol.StagingPool(kv_source.device) if kv_source is not None else None)
        self._packer = protocol.BlockPacker(transport)
        self.blocks_in = protocol.BlockUnpacker()  # the drafter's probability blocks
        # a KV block must fit a message with room to spare; longer prompts open without one
        self._max_kv_bytes = (channel_options or ChannelOptions()).max_message_bytes // 2
        self.vocab_size = vocab_size  # the target's: draft ids are checked against it
        self.prefill_allowance = prefill_allowance_s_per_token
        self._seqs: dict[int, _Mirror] = {}
        self._verify: list[pb.VerifyResult] = []  # since the last flush: one VerifyBatch
        self._expect: list[int] = []  # request ids sent and not yet answered, in order
        self.num_failures = 0
        self.last_error = ""
        # accounting: wall time of propose round trips vs the drafter's own compute time; of the wire
        # time (round trip less compute), what the engine waited for (not a pre-draft's, hidden by a verify)
        self.num_batches = 0
        self.round_trip_s = 0.0
        self.compute_s = 0.0
        self.critical_wire_s = 0.0
        self._ahead = False  # within propose_ahead (on the engine's pre-draft worker)
        if address is None:
            if not self._resolve(wait=True):  # no drafter up yet: asked again at later steps
                return
        else:
            self._connect(address)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout_s or timeout_s)
            self._open_session()
            self._probe.done.wait()  # at start-up the first steps may wait for the drafter
            self._take_probe()
        except grpc.FutureTimeoutError:
            self._fail(DrafterFailure(f"not reachable within {connect_timeout_s or timeout_s:.1f} s"))

    @property
    def state(self) -> str:
        if self._session is not None:  # a session the drafter ended is noticed at the next step
            return "unavailable" if self._session.call.done() else "connected"
        return "connecting" if self._probe is not None else "unavailable"

    @property
    def opens_caught_up(self) -> bool:
        """Sequences open at their first draft with the target's K/V of all but the newest token (KV handoff)."""
        return self.kv_source is not None

    def status(self) -> DrafterStatus:
        return DrafterStatus(state=self.state, num_reconnects=self.num_reconnects)

    # ---- the Drafter interface ------------------------------------------------------------

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        self._seqs[seq_id] = _Mirror(committed=list(prompt_ids))  # opened at its first draft

    def propose(self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None, min_confidence: float = 0.0) -> DraftProposal:
        """(The session protocol carries no confidence: `min_confidence` is not applied remotely.)"""
        return self.propose_batch([DraftRequest(seq_id, k, temperature, top_k, top_p, generator)])[seq_id]

    def propose_batch(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        self.last_catch_up = None  # until an answer says
        if self._session is None:
            self._maybe_reconnect()
        if self._session is not None:
            try:
                return self._propose(requests)
            except (DrafterFailure, BlockError) as e:
                self._fail(e)
        return {r.seq_id: DraftProposal(draft_ids=[], unavailable=True) for r in requests}

    def propose_ahead(self, requests: list[DraftRequest], assumed: dict[int, list[int]]) -> dict[int, DraftProposal]:
        self._ahead = True  # the engine never calls the drafter from two threads at once
        try:
            return super().propose_ahead(requests, assumed)
        finally:
            self._ahead = False

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        m = self._seqs[seq_id]
        ids = [int(t) for t in token_ids]
        if m.opened:
            accepted = 0
            while accepted < min(len(ids), len(m.last_draft)) and ids[accepted] == m.last_draft[accepted]:
                accepted += 1
            r = pb.VerifyResult(sequence_id=seq_id, num_accepted=accepted, rollback_to=len(m.committed),
                                append_ids=ids[accepted + 1:])
            if accepted < len(ids):
                r.bonus_token_id = ids[accepted]
            self._verify.append(r)
        m.committed.extend(ids)
        m.last_draft = []

    def accept_hidden(self, seq_id: int, block) -> None:
        """Kept in the mirror; the rows go out with the next batch (`HiddenRows.results`)."""
        d, payload = self.blocks_in.unpack(block)
        if d.kind != protocol.TensorKind.HIDDEN_STATE:
            raise BlockError("kind", "expected a HIDDEN_STATE block")
        self._seqs[seq_id].hidden.add(d.tokens.start, protocol.decode(d, payload, dtype=torch.float16, verified=True))

    def rollback(self, seq_id: int, n: int) -> None:
        m = self._seqs[seq_id]
        if not 0 <= n <= len(m.committed):
            raise ValueError(f"cannot roll back {n} of {len(m.committed)} tokens")
        del m.committed[len(m.committed) - n:]
        m.hidden.trim(len(m.committed))
        if m.opened:
            self._verify.append(pb.VerifyResult(sequence_id=seq_id, rollback_to=len(m.committed)))
        m.last_draft = []

    def finish(self, seq_id: int) -> None:
        m = self._seqs.pop(seq_id, None)
        if m is None or not m.opened or self._session is None:
            return
        try:  # sent now (answers are read with the next proposals): the drafter frees it at once
            self._flush_verify()
            self._send(pb.DrafterRequest(close=pb.CloseSequence(sequence_id=seq_id)))
        except DrafterFailure as e:
            self._fail(e)

    def close(self) -> None:
        self._drop_sessions()
        if self._asker is not None:
            self._asker.shutdown(wait=False)
        if self._channel is not None:
            self._channel.close()
        self._packer.close()
        self._hidden_packer.close()
        self.blocks_in.close()

    # ---- one round trip ---------------------------------------------------------------------

    def _propose(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        t0 = time.perf_counter()
        opened_tokens = 0
        opens = []
        for r in requests:
            m = self._seqs[r.seq_id]
            if not m.opened:
                open_ = pb.OpenSequence(sequence_id=r.seq_id, prompt_ids=m.committed)
                if r.generator is not None:
                    open_.seed = r.generator.initial_seed() & ((1 << 64) - 1)
                opens.append(open_)
                m.opened = True
                opened_tokens += len(m.committed)
        if self.kv_source is not None:
            self._attach_kv(opens)
        for open_ in opens:
            self._send(pb.DrafterRequest(open=open_))
        if self.reads_hidden:  # the states each drafting sequence's drafter lacks, before its drafts
            for r in requests:
                m = self._seqs[r.seq_id]
                self._verify += m.hidden.results(r.seq_id, len(m.committed), self.model_id, self._max_kv_bytes,
                                                 self._hidden_packer)
        batch = pb.ProposeBatch(results=self._verify, requests=[
            pb.DraftRequest(sequence_id=r.seq_id, num_draft=r.k, want_probs=r.temperature > 0,
                            temperature=r.temperature, top_k=r.top_k, top_p=r.top_p) for r in requests])
        self._verify = []
        self._send(pb.DrafterRequest(propose=batch))
        # opening sequences makes the drafter prefill them: allow for it
        deadline = time.perf_counter() + self.timeout_s + self.prefill_allowance * opened_tokens
        response = None
        while self._expect:
            response = self._session.receive(deadline - time.perf_counter())
            want = self._expect.pop(0)
            check_answer(response, want, "ack" if self._expect else None)
        if response is None or response.WhichOneof("body") != "proposals":
            raise DrafterFailure("the answer to a propose batch carries no proposals")
        drafts = self._read_proposals(requests, response.proposals)
        self.num_batches += 1
        round_trip = time.perf_counter() - t0
        batch = response.proposals
        compute = batch.compute_ns / 1e9
        # never more than the drafter says it computed, whatever its catch-up field holds
        self.last_catch_up = CatchUp(min(batch.catch_up_ns / 1e9, compute), batch.catch_up_tokens) \
            if batch.HasField("catch_up_ns") and batch.HasField("catch_up_tokens") else None
        self.round_trip_s += round_trip
        self.compute_s += compute
        wire = max(0.0, round_trip - compute)
        if not self._ahead:
            self.critical_wire_s += wire
        self.tracer.add(Span("wire", self._wire_track, int(t0 * 1e9), wire * 1e3,
                             args={"round_trip_ms": round_trip * 1e3, "compute_ms": compute * 1e3,
                                   "sequences": len(requests), "ahead": self._ahead}))
        self._backoff = self.backoff_s[0]
        return drafts

    def _read_proposals(self, requests: list[DraftRequest], batch: pb.ProposalBatch) -> dict[int, DraftProposal]:
        """Every proposal checked: order, length, token range, and the probability block."""
        if len(batch.proposals) != len(requests):
            raise DrafterFailure(f"{len(batch.proposals)} proposals for {len(requests)} requests")
        out = {}
        for i, (r, p) in enumerate(zip(requests, batch.proposals)):
            where = f"proposals[{i}]"
            if p.sequence_id != r.seq_id:
                raise BlockError(f"{where}.sequence_id", f"is {p.sequence_id}, expected {r.seq_id}")
            ids = list(p.draft_ids)
            if len(ids) > r.k:
                raise BlockError(f"{where}.draft_ids", f"{len(ids)} tokens for k={r.k}")
            if any(t < 0 or (self.vocab_size is not None and t >= self.vocab_size) for t in ids):
                raise BlockError(f"{where}.draft_ids", f"token ids must be in [0, {self.vocab_size})")
            probs = None
            # without a block the drafts are one-hot (a greedy drafter such as n-gram), as locally
            if r.temperature > 0 and ids and p.HasField("draft_probs"):
                probs = self._probs(p.draft_probs, len(ids), f"{where}.draft_probs")
            self._seqs[r.seq_id].last_draft = ids
            out[r.seq_id] = DraftProposal(draft_ids=ids, draft_probs=probs)
        return out

    def _probs(self, block, num_draft: int, where: str) -> torch.Tensor:
        d, payload = self.blocks_in.unpack(block)  # validates every field and the checksum
        if d.kind != protocol.TensorKind.DRAFT_PROBS or d.layout != protocol.Layout.TOKENS_VOCAB:
            raise BlockError(f"{where}.kind", "expected DRAFT_PROBS in LAYOUT_TOKENS_VOCAB")
        want = [num_draft, self.vocab_size] if self.vocab_size is not None else [num_draft, d.shape[-1]]
        if list(d.shape) != want:
            raise BlockError(f"{where}.shape", f"is {list(d.shape)}, expected {want}")
        probs = protocol.decode(d, payload, dtype=torch.float32, verified=True)
        sums = probs.sum(dim=-1)
        if not bool(torch.isfinite(probs).all()) or bool((probs < 0).any()) or \
                not bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-3)):
            raise BlockError(where, "rows are not probability distributions")
        return probs

    def _attach_kv(self, opens: list[pb.OpenSequence]) -> None:
        """The target's K/V of each opening sequence (all but the newest token) as one KV_POOL block.

        Packed as one batch: shared-memory blocks stay valid until the next step's batch, and the
        drafter has read them once it answers this step's frames.
        """
        target, kvs, with_kv = self.kv_source, [], []
        try:
            for open_ in opens:
                n = target.kv_length(open_.sequence_id)
                if not 0 < n < len(open_.prompt_ids):  # preempted (no K/V in the pool), or nothing to hand off
                    continue
                kv = export_kv(target, open_.sequence_id, self._staging)
                kvs.append(kv)
                if kv.encoded.descriptor.byte_length <= self._max_kv_bytes:
                    with_kv.append((open_, kv.encoded))
            blocks = self._packer.pack_batch([enc for _, enc in with_kv])
            for (open_, _), block in zip(with_kv, blocks):
                open_.kv_blocks.append(block)
        finally:
            for kv in kvs:
                kv.release()

    # ---- frames -----------------------------------------------------------------------------

    def _send(self, frame: pb.DrafterRequest) -> None:
        frame.protocol_version = V1
        frame.request_id = next(self._ids)
        self._expect.append(frame.request_id)
        self._session.send(frame)

    def _flush_verify(self) -> None:
        if self._verify:
            results, self._verify = self._verify, []
            self._send(pb.DrafterRequest(verify=pb.VerifyBatch(results=results)))

    # ---- failure and reconnection ----------------------------------------------------------------

    def _fail(self, e: Exception) -> None:
        self.num_failures += 1
        self.last_error = str(e)
        if self.kv_source is not None and getattr(e, "field", "").startswith(KV_FIELD):
            log.warning("drafter at %s does not take this target's K/V; opening sequences from tokens", self.address)
            self.kv_source = None
        log.warning("drafter at %s: %s; continuing target-only, reconnecting in %.1f s",
                    self.address, e, self._backoff)
        self._drop_sessions()
        self._expect.clear()
        self._verify.clear()
        for m in self._seqs.values():  # the next session re-opens them from the mirror
            m.opened = False
            m.last_draft = []
            m.hidden.sent = 0
        self._next_attempt = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, self.backoff_s[1])


def build_remote_drafter(config: RemoteDrafterConfig, ctx: DrafterContext,
                         resolve: Callable[[], str | None] | None = None,
                         backoff_s: tuple[float, float] = (0.5, 30.0)) -> RemoteDrafter:
    """The registry's builder for the remote kind: channel, token and KV source from the assembly
    (with `resolve`, a pool picks the address and `config.address` is not used)."""
    channel = ChannelOptions(tls=config.tls or config.ca_file is not None, ca_file=config.ca_file,
                             cert_file=config.cert_file, key_file=config.key_file,
                             token=token_from_env(config.token_env, "drafters.*.token_env"),
                             max_message_bytes=ctx.max_message_bytes)
    target = ctx.target
    return RemoteDrafter(None if resolve else config.address, channel, timeout_s=config.timeout_s,
                         resolve=resolve, backoff_s=backoff_s,
                         vocab_size=target.vocab_size if target is not None else None,
                         kv_source=target if config.kv_handoff else None, staging=ctx.staging,
                         transport=ctx.transport, tracer=ctx.tracer, reads_hidden=config.hidden_states,
                         model_id=ctx.target_ckpt.key)
