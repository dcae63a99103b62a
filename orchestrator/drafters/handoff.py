"""KV handoff: a self-drafter starts each sequence from the target's prefill K/V.

A drafter exported from the target's own checkpoint has the target's layer/head geometry,
so the K/V the target computed for the prompt can replace the drafter's prefill. The K/V
leaves the target's pool as a protocol block (device -> host through the staging pool),
travels as one Block message (inline or in shared memory, by the transport kind), and is
validated, converted from the pool layout to the drafter's [layers, 2, heads, tokens, dim]
and from the target's dtype to float32.
"""

import torch

import protocol
from orchestrator.drafters.onnx_drafter import OnnxDrafter
from orchestrator.engine import Drafter, DraftProposal, DraftRequest
from orchestrator.engine.swap import describe_kv
from orchestrator.models import TargetRunner
from orchestrator.tracing import HOST_TRACK, Tracer, drafter_track, target_track


class KvHandoffDrafter(Drafter):
    """Wraps an ONNX self-drafter; a sequence's first draft takes its K/V from the target.

    Lazily: `start` only notes the tokens, and the hand-off happens when the sequence is first
    asked for drafts, with the K/V of every committed token the target has run (the prompt and
    any steps decoded without drafts), so a sequence that never drafts costs nothing and one
    that starts drafting late has nothing to catch up. Its transfer spans (d2h, serialize,
    deserialize, h2d) go to `tracer`, the engine's, so they land beside the engine's own.
    """

    opens_caught_up = True  # the first draft finds every committed token but the newest in the drafter

    def __init__(self, inner: OnnxDrafter, target: TargetRunner, tracer: Tracer | None = None,
                 staging: protocol.StagingPool | None = None, transport: str = "inline"):
        self.inner = inner
        self.target = target
        self.tracer = tracer or Tracer(enabled=False)
        self.staging = staging or protocol.StagingPool(target.device)
        self.packer = protocol.BlockPacker(transport)
        self.unpacker = protocol.BlockUnpacker()
        self.name = f"{inner.name}+kv-handoff"
        self.device = inner.device
        self.batched = inner.batched  # the cost model's prior: one run drafts a position for every sequence
        self.overlaps = inner.overlaps
        self.stops_early = inner.stops_early
        self.bytes_sent = 0
        self._pending: dict[int, list[int]] = {}  # started, not handed off yet: committed tokens
        self._target_track = target_track(target.device)
        self._drafter_track = drafter_track(self.device, self.name)

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        self._pending[seq_id] = list(prompt_ids)

    def hand_off(self, seq_ids) -> None:
        """Open the given sequences (those not yet open) from the target's K/V of their committed tokens.

        The engine calls it (as `prepare`) before its draft span, so the transfer spans sit beside the
        drafting, not inside it; `propose` opens any sequence still pending. A flow links each serialize
        span to its deserialize span.
        """
        for seq_id in seq_ids:
            ids = self._pending.pop(seq_id, None)
            if ids is not None:
                self._hand_off(seq_id, ids)

    prepare = hand_off

    def _hand_off(self, seq_id: int, ids: list[int]) -> None:
        tracer, target = self.tracer, self.target
        if not 0 < target.kv_length(seq_id) <= len(ids):  # preempted (no K/V in the pool): the drafter's own prefill
            self.inner.start(seq_id, ids)
            return
        staged = None
        try:
            with tracer.span("d2h", self._target_track, request=seq_id):
                staged = self.staging.to_host(target.pool.read_blocks(seq_id))
                host = staged.wait()  # [L, 2, num_blocks, block_size, H, D]
            flow = tracer.new_flow()
            with tracer.span("serialize", HOST_TRACK, request=seq_id, flow_out=flow) as span:
                block = self.packer.pack(describe_kv(target, seq_id, host))  # what a remote drafter gets
                nbytes = block.descriptor.byte_length
                if span is not None:
                    span.args["nbytes"] = nbytes
        finally:
            if staged is not None:
                staged.release()
        self.bytes_sent += nbytes
        with tracer.span("deserialize", HOST_TRACK, request=seq_id, flow_in=(flow,)):
            d, payload = self.unpacker.unpack(block)
            inner = self.inner
            kv = protocol.read_kv(d, payload, model_id=target.model_id, num_layers=inner.num_layers,
                                  num_kv_heads=inner.num_kv_heads, head_dim=inner.head_dim)  # [L, 2, H, T, D]
        with tracer.span("h2d", self._drafter_track, request=seq_id):
            inner.start_with_kv(seq_id, ids, kv)

    def propose(self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None, min_confidence: float = 0.0) -> DraftProposal:
        self.hand_off([seq_id])
        return self.inner.propose(seq_id, k, temperature, top_k, top_p, generator, min_confidence)

    def propose_batch(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        self.hand_off(r.seq_id for r in requests)
        return self.inner.propose_batch(requests)  # batched: one run per draft position for all sequences

    def propose_ahead(self, requests: list[DraftRequest], assumed: dict[int, list[int]]) -> dict[int, DraftProposal]:
        # only sequences that drafted this step are drafted ahead: handed off already (the target is
        # verifying meanwhile, so its pool must not be read here)
        for r in requests:
            if r.seq_id in self._pending:
                self.inner.start(r.seq_id, self._pending.pop(r.seq_id))
        return self.inner.propose_ahead(requests, assumed)

    @property
    def last_catch_up(self):
        return self.inner.last_catch_up

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        if seq_id in self._pending:
            self._pending[seq_id] += token_ids
        else:
            self.inner.extend(seq_id, token_ids)

    def rollback(self, seq_id: int, n: int) -> None:
        if seq_id in self._pending:
            del self._pending[seq_id][len(self._pending[seq_id]) - n:]
        else:
            self.inner.rollback(seq_id, n)

    def finish(self, seq_id: int) -> None:
        if self._pending.pop(seq_id, None) is None:
            self.inner.finish(seq_id)

    def close(self) -> None:
        self.packer.close()
        self.unpacker.close()
        self.inner.close()
