"""A sequence's K/V out of the target's pool to host memory and back (preemption by swapping).

The K/V leaves the device as a protocol block (LAYOUT_KV_POOL, copied device -> host through
the pinned staging pool) and is validated and checksum-verified before it goes back in.
"""

from dataclasses import dataclass

import protocol
from orchestrator.models import TargetRunner


@dataclass
class HostKv:
    """A sequence's K/V held in a staging buffer, described as a block."""

    encoded: protocol.Encoded  # payload aliases `staged.host`
    staged: protocol.Staged

    @property
    def nbytes(self) -> int:
        return self.staged.host.nbytes

    def release(self) -> None:
        self.staged.release()


def export_kv(target: TargetRunner, seq_id: int, staging: protocol.StagingPool) -> HostKv:
    """Copy the sequence's K/V blocks to host memory and describe them (the pool keeps its copy)."""
    staged = staging.to_host(target.pool.read_blocks(seq_id))  # [L, 2, num_blocks, block_size, H, D]
    return HostKv(describe_kv(target, seq_id, staged.wait()), staged)


def describe_kv(target: TargetRunner, seq_id: int, host) -> protocol.Encoded:
    """A KV_POOL block over host-resident blocks (zero-copy; the checksum is computed here)."""
    device = target.device
    return protocol.encode_kv_pool(host, model_id=target.model_id, sequence_id=seq_id,
                                   num_tokens=target.kv_length(seq_id),
                                   source_device=f"{device.type}:{device.index or 0}")


def swap_out(target: TargetRunner, seq_id: int, staging: protocol.StagingPool) -> HostKv:
    """Move a sequence's K/V to host memory and free its blocks in the pool."""
    kv = export_kv(target, seq_id, staging)
    target.free(seq_id)
    return kv


def swap_in(target: TargetRunner, seq_id: int, kv: HostKv) -> None:
    """Validate the block and put its K/V back into (new) pool blocks; releases the host copy."""
    d = kv.encoded.descriptor
    s = target.model.spec
    protocol.check_kv_geometry(d, target.model_id, s.num_layers, s.num_kv_heads, s.head_dim)
    if d.block_size != target.pool.block_size:
        raise protocol.BlockError("block_size", f"is {d.block_size}, the pool uses {target.pool.block_size}")
    blocks = protocol.decode(d, kv.encoded.payload)  # [L, 2, num_blocks, block_size, H, D]
    target.pool.write_blocks(seq_id, blocks, d.tokens.end)
    kv.release()
