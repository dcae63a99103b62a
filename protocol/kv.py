"""K/V blocks: a sequence's slice of a paged KV pool as one block, and the receiver's checks.

The pool's blocks of one sequence travel as one KV block in LAYOUT_KV_POOL
([layers, 2, num_blocks, block_size, kv_heads, head_dim]); a receiver checks that it was made by
the model it runs and fits its geometry, then reads it in the layout and dtype it wants.
"""

import torch

from protocol import codec
from protocol.errors import BlockError
from protocol.pb import blocks_pb2 as pb


def encode_kv_pool(blocks: torch.Tensor, *, model_id: str, sequence_id: int, num_tokens: int,
                   source_device: str) -> codec.Encoded:
    """Describe host-resident pool blocks [L, 2, num_blocks, block_size, H, D] holding `num_tokens`."""
    L, _, _, block_size, H, _ = blocks.shape
    enc = codec.encode(blocks, kind=pb.TENSOR_KIND_KV, layout=pb.LAYOUT_KV_POOL, model_id=model_id,
                       layers=(0, L), heads=(0, H), sequence_id=sequence_id, tokens=(0, num_tokens),
                       block_size=block_size, source_device=source_device)
    enc.descriptor.locator.inline.num_chunks = 0  # held in this process until a transport places it
    return enc


def check_kv_geometry(d: pb.BlockDescriptor, model_id: str, num_layers: int, num_kv_heads: int,
                      head_dim: int) -> None:
    """A KV block fits a receiver with this model and geometry (all layers and heads)."""
    if d.kind != pb.TENSOR_KIND_KV or d.layout not in (pb.LAYOUT_KV_POOL, pb.LAYOUT_KV_SEQ):
        raise BlockError("kind", "expected a KV block in LAYOUT_KV_POOL or LAYOUT_KV_SEQ")
    if d.model_id != model_id:
        raise BlockError("model_id", f"block is from model {d.model_id!r}, receiver runs {model_id!r}")
    if (d.layers.start, d.layers.end) != (0, num_layers):
        raise BlockError("layers", f"covers [{d.layers.start}, {d.layers.end}), receiver needs [0, {num_layers})")
    if (d.heads.start, d.heads.end) != (0, num_kv_heads):
        raise BlockError("heads", f"covers [{d.heads.start}, {d.heads.end}), receiver needs [0, {num_kv_heads})")
    if d.shape[-1] != head_dim:
        raise BlockError("shape", f"head_dim {d.shape[-1]}, receiver needs {head_dim}")


def read_kv(d: pb.BlockDescriptor, payload, *, model_id: str, num_layers: int, num_kv_heads: int,
            head_dim: int) -> torch.Tensor:
    """A received (validated, checksum-verified) KV block as float32 [L, 2, H, T, D], T = tokens covered."""
    check_kv_geometry(d, model_id, num_layers, num_kv_heads, head_dim)
    return codec.decode(d, payload, layout=pb.LAYOUT_KV_SEQ, dtype=torch.float32, verified=True)
