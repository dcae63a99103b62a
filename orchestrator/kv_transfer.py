"""A sequence's K/V as protocol blocks: swap out of the pool to host memory and back, or hand off.

The pool's blocks of one sequence travel as one KV block in LAYOUT_KV_POOL
([layers, 2, num_blocks, block_size, kv_heads, head_dim]), copied device -> host through
the pinned staging pool. Receivers validate the descriptor and checksum before use.
"""

from dataclasses import dataclass

import torch

from orchestrator.target import TargetRunner
from protocol import codec
from protocol.errors import BlockError
from protocol.pb import blocks_pb2 as pb
from protocol.staging import Staged, StagingPool


@dataclass
class HostKv:
    """A sequence's K/V held in a staging buffer, described as a block."""

    encoded: codec.Encoded  # payload aliases `staged.host`
    staged: Staged

    def release(self) -> None:
        self.staged.release()


def export_kv(target: TargetRunner, seq_id: int, staging: StagingPool) -> HostKv:
    """Copy the sequence's K/V blocks to host memory and describe them (the pool keeps its copy)."""
    staged = stage_kv(target, seq_id, staging)
    return HostKv(describe_kv(target, seq_id, staged.wait()), staged)


def stage_kv(target: TargetRunner, seq_id: int, staging: StagingPool) -> Staged:
    """Start the device -> host copy of the sequence's blocks [L, 2, num_blocks, block_size, H, D]."""
    return staging.to_host(target.pool.read_blocks(seq_id))


def describe_kv(target: TargetRunner, seq_id: int, host: torch.Tensor) -> codec.Encoded:
    """A KV_POOL block over host-resident blocks (zero-copy; the checksum is computed here)."""
    L, _, _, block_size, H, _ = host.shape
    enc = codec.encode(host, kind=pb.TENSOR_KIND_KV, layout=pb.LAYOUT_KV_POOL, model_id=target.model_id,
                       layers=(0, L), heads=(0, H), sequence_id=seq_id, tokens=(0, target.kv_length(seq_id)),
                       block_size=block_size, source_device=_device_name(target.device))
    enc.descriptor.locator.inline.num_chunks = 0  # held in this process: the payload travels as is
    return enc


def swap_out(target: TargetRunner, seq_id: int, staging: StagingPool) -> HostKv:
    """Move a sequence's K/V to host memory and free its blocks in the pool."""
    kv = export_kv(target, seq_id, staging)
    target.free(seq_id)
    return kv


def swap_in(target: TargetRunner, seq_id: int, kv: HostKv) -> None:
    """Validate the block and put its K/V back into (new) pool blocks; releases the host copy."""
    d = kv.encoded.descriptor
    s = target.model.spec
    check_geometry(d, target.model_id, s.num_layers, s.num_kv_heads, s.head_dim)
    if d.block_size != target.pool.block_size:
        raise BlockError("block_size", f"is {d.block_size}, the pool uses {target.pool.block_size}")
    blocks = codec.decode(d, kv.encoded.payload)  # [L, 2, num_blocks, block_size, H, D]
    target.pool.write_blocks(seq_id, blocks, d.tokens.end)
    kv.release()


def check_geometry(d: pb.BlockDescriptor, model_id: str, num_layers: int, num_kv_heads: int, head_dim: int) -> None:
    """A KV block fits a receiver with this model and geometry (all layers and heads)."""
    if d.model_id != model_id:
        raise BlockError("model_id", f"block is from model {d.model_id!r}, receiver runs {model_id!r}")
    if (d.layers.start, d.layers.end) != (0, num_layers):
        raise BlockError("layers", f"covers [{d.layers.start}, {d.layers.end}), receiver needs [0, {num_layers})")
    if (d.heads.start, d.heads.end) != (0, num_kv_heads):
        raise BlockError("heads", f"covers [{d.heads.start}, {d.heads.end}), receiver needs [0, {num_kv_heads})")
    if d.shape[-1] != head_dim:
        raise BlockError("shape", f"head_dim {d.shape[-1]}, receiver needs {head_dim}")


def _device_name(device: torch.device) -> str:
    return f"{device.type}:{device.index or 0}"
