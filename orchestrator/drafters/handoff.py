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
    """Wraps an ONNX self-drafter; `start` takes the prompt's K/V from the target.

    Its transfer spans (d2h, serialize, deserialize, h2d) go to `tracer`, the engine's, so
    they land beside the engine's own on the same timelines.
    """

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
        self.prompt_cached = True
        self.bytes_sent = 0
        self._target_track = target_track(target.device)
        self._drafter_track = drafter_track(self.device, self.name)

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        """Called after the target's prefill: its pool holds K/V for the whole prompt.

        A flow links the serialize span to the deserialize span.
        """
        tracer = self.tracer
        staged = None
        try:
            with tracer.span("d2h", self._target_track, request=seq_id):
                staged = self.staging.to_host(self.target.pool.read_blocks(seq_id))
                host = staged.wait()  # [L, 2, num_blocks, block_size, H, D]
            flow = tracer.new_flow()
            with tracer.span("serialize", HOST_TRACK, request=seq_id, flow_out=flow) as span:
                block = self.packer.pack(describe_kv(self.target, seq_id, host))  # what a remote drafter gets
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
            kv = protocol.read_kv(d, payload, model_id=self.target.model_id, num_layers=inner.num_layers,
                                  num_kv_heads=inner.num_kv_heads, head_dim=inner.head_dim)  # [L, 2, H, T, D]
        with tracer.span("h2d", self._drafter_track, request=seq_id):
            inner.start_with_kv(seq_id, prompt_ids, kv)

    def propose(self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None, min_confidence: float = 0.0) -> DraftProposal:
        return self.inner.propose(seq_id, k, temperature, top_k, top_p, generator, min_confidence)

    def propose_batch(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        return self.inner.propose_batch(requests)  # batched: one run per draft position for all sequences

    def propose_ahead(self, requests: list[DraftRequest], assumed: dict[int, list[int]]) -> dict[int, DraftProposal]:
        return self.inner.propose_ahead(requests, assumed)

    @property
    def last_catch_up(self):
        return self.inner.last_catch_up

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        self.inner.extend(seq_id, token_ids)

    def rollback(self, seq_id: int, n: int) -> None:
        self.inner.rollback(seq_id, n)

    def finish(self, seq_id: int) -> None:
        self.inner.finish(seq_id)

    def close(self) -> None:
        self.packer.close()
        self.unpacker.close()
        self.inner.close()
