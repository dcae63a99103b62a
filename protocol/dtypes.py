"""Wire dtypes <-> torch dtypes, and the size of each element on the wire."""

import torch

from protocol.pb import blocks_pb2 as pb

TORCH_OF = {
    pb.DTYPE_FLOAT32: torch.float32,
    pb.DTYPE_FLOAT16: torch.float16,
    pb.DTYPE_BFLOAT16: torch.bfloat16,
    pb.DTYPE_INT8: torch.int8,
}
WIRE_OF = {v: k for k, v in TORCH_OF.items()}

# Bits per element of the data region.
BITS = {pb.DTYPE_FLOAT32: 32, pb.DTYPE_FLOAT16: 16, pb.DTYPE_BFLOAT16: 16, pb.DTYPE_INT8: 8, pb.DTYPE_UINT4: 4}


def wire_dtype(dtype: torch.dtype) -> int:
    """The DType enum value for a torch dtype (fp32, fp16, bf16, int8)."""
    try:
        return WIRE_OF[dtype]
    except KeyError:
        raise ValueError(f"no wire dtype for {dtype}; use float32/float16/bfloat16/int8 or quantize") from None
