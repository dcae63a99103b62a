"""KV handoff: a self-drafter starts each sequence from the target's prefill K/V.

A drafter exported from the target's own checkpoint has the target's layer/head geometry,
so the K/V the target computed for the prompt can replace the drafter's prefill. The K/V
leaves the target's pool as a protocol block (device -> host through the staging pool),
travels as one inline Block message, and is validated, converted from the pool layout to
the drafter's [layers, 2, heads, tokens, dim] and from the target's dtype to float32.
"""

import torch

from orchestrator.drafters.base import DraftProposal, Drafter
from orchestrator.drafters.onnx_drafter import OnnxDrafter
from orchestrator.kv_transfer import check_geometry, describe_kv, stage_kv
from orchestrator.profiler.spans import HOST_TRACK, Tracer, drafter_track, target_track
from orchestrator.target import TargetRunner
from protocol import codec, inline
from protocol.pb import blocks_pb2 as pb
from protocol.staging import StagingPool

_OFF = Tracer(enabled=False)


class KvHandoffDrafter(Drafter):
    """Wraps an ONNX self-drafter; `start` takes the prompt's K/V from the target."""

    def __init__(self, inner: OnnxDrafter, target: TargetRunner, staging: StagingPool | None = None):
        self.inner = inner
        self.target = target
        self.staging = staging or StagingPool(target.device)
        self.name = f"{inner.name}+kv-handoff"
        self.bytes_sent = 0
        # the engine's timelines, so these spans land beside its own
        self._target_track = target_track(target.device)
        self._host_track = HOST_TRACK
        self._drafter_track = drafter_track(self)

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        """Called after the target's prefill: its pool holds K/V for the whole prompt.

        Four spans on the engine's tracer: d2h (pool -> staging buffer), serialize (describe,
        checksum, Block message), deserialize (validate, checksum, layout/dtype conversion),
        h2d (into the drafter's KV buffers); a flow links serialize to deserialize.
        """
        tracer = self.tracer or _OFF
        staged = None
        try:
            with tracer.span("d2h", self._target_track, request=seq_id):
                staged = stage_kv(self.target, seq_id, self.staging)
                host = staged.wait()  # [L, 2, num_blocks, block_size, H, D]
            flow = tracer.new_flow()
            with tracer.span("serialize", self._host_track, request=seq_id, flow_out=flow) as span:
                block = inline.to_block(describe_kv(self.target, seq_id, host))  # what a remote drafter gets
                if span is not None:
                    span.args["nbytes"] = len(block.data)
        finally:
            if staged is not None:
                staged.release()
        self.bytes_sent += len(block.data)
        with tracer.span("deserialize", self._host_track, request=seq_id, flow_in=(flow,)):
            d, payload = inline.from_block(block)
            check_geometry(d, self.target.model_id, self.inner.num_layers, self.inner.num_kv_heads, self.inner.head_dim)
            kv = codec.decode(d, payload, layout=pb.LAYOUT_KV_SEQ, dtype=torch.float32, verified=True)
        with tracer.span("h2d", self._drafter_track, request=seq_id):
            self.inner.start_with_kv(seq_id, prompt_ids, kv[:, :, :, :len(prompt_ids)])  # [L, 2, H, T, D]

    def propose(self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                generator: torch.Generator | None = None) -> DraftProposal:
        return self.inner.propose(seq_id, k, temperature, top_k, top_p, generator)

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        self.inner.extend(seq_id, token_ids)

    def rollback(self, seq_id: int, n: int) -> None:
        self.inner.rollback(seq_id, n)

    def finish(self, seq_id: int) -> None:
        self.inner.finish(seq_id)

    def close(self) -> None:
        self.inner.close()
