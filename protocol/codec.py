"""Tensors <-> blocks: encode a host tensor into a descriptor + payload view, decode back.

Encoding is zero-copy for dense and strided tensors (the payload is a view over the
tensor's memory); quantized encodings build a new buffer. Decoding validates every field
and the checksum first, then reinterprets the payload, converting dtype and layout when
the receiver asks for others.
"""

from dataclasses import dataclass

import numpy as np
import torch

from protocol import quant
from protocol.dtypes import TORCH_OF, wire_dtype
from protocol.errors import BlockError
from protocol.pb import blocks_pb2 as pb
from protocol.validate import DEFAULT_LIMITS, Limits, checksum, validate_descriptor, validate_payload

_TOKEN_AXIS = {pb.LAYOUT_TOKENS_HIDDEN: 0, pb.LAYOUT_TOKENS_VOCAB: 0, pb.LAYOUT_KV_SEQ: 3}


@dataclass
class Encoded:
    """A descriptor without a locator, and its payload (a byte view that keeps its owner alive)."""

    descriptor: pb.BlockDescriptor
    payload: memoryview


def byte_view(t: torch.Tensor) -> memoryview:
    """A flat uint8 memoryview over a contiguous host tensor's memory (no copy)."""
    t = t.detach()
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16; the bits are what travel
        t = t.view(torch.int16)
    return memoryview(t.numpy()).cast("B")


def encode(tensor: "torch.Tensor | np.ndarray", *, kind: int, layout: int = pb.LAYOUT_CONTIGUOUS, model_id: str = "",
           layers: tuple[int, int] = (0, 0), heads: tuple[int, int] = (0, 0), sequence_id: int = 0,
           tokens: tuple[int, int] | None = None, block_size: int = 0, source_device: str = "cpu:0",
           quantize: tuple[int, int] | None = None,
           checksum_algorithm: int = pb.CHECKSUM_ALGORITHM_XXH3_64) -> Encoded:
    """Describe a host tensor or numpy array. `quantize=(scheme, group_size)` compresses it group-wise on the wire."""
    if isinstance(tensor, np.ndarray):
        tensor = torch.from_numpy(tensor)  # shares the array's memory
    if tensor.device.type != "cpu":
        raise ValueError("encode takes host tensors; stage device tensors through protocol.staging first")
    if tokens is None:
        axis = _TOKEN_AXIS.get(layout)
        tokens = (0, tensor.shape[axis]) if axis is not None else (0, 0)
    kind_, _, index = source_device.partition(":")
    d = pb.BlockDescriptor(
        protocol_version=pb.PROTOCOL_VERSION_1, kind=kind, model_id=model_id, layers=_r(layers),
        heads=_r(heads), sequence_id=sequence_id, tokens=_r(tokens), shape=list(tensor.shape), layout=layout,
        block_size=block_size, source_device=pb.DeviceRef(type=kind_, index=int(index or 0)),
        checksum_algorithm=checksum_algorithm)
    if quantize is not None:
        payload = _quantized_payload(d, tensor, *quantize)
    elif layout == pb.LAYOUT_STRIDED:
        d.dtype, d.strides[:] = wire_dtype(tensor.dtype), list(tensor.stride())
        span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
        payload = byte_view(tensor.as_strided((span,), (1,), tensor.storage_offset()))
    else:
        d.dtype = wire_dtype(tensor.dtype)
        payload = byte_view(tensor.contiguous())
    d.byte_length = payload.nbytes
    d.checksum = checksum(checksum_algorithm, payload)
    return Encoded(d, payload)


def _r(pair: tuple[int, int]) -> pb.Range:
    return pb.Range(start=pair[0], end=pair[1])


def _quantized_payload(d: pb.BlockDescriptor, x: torch.Tensor, scheme: int, group_size: int) -> memoryview:
    x = x.contiguous()
    if scheme == pb.QUANT_SCHEME_INT8_SYMMETRIC:
        codes, scales = quant.quantize_int8(x, group_size)
        d.dtype, parts = pb.DTYPE_INT8, [codes.reshape(-1).view(torch.uint8), scales.view(torch.uint8)]
    elif scheme == pb.QUANT_SCHEME_UINT4_ASYMMETRIC:
        packed, scales, zeros = quant.quantize_uint4(x, group_size)
        d.dtype, parts = pb.DTYPE_UINT4, [packed, scales.view(torch.uint8), zeros]
    else:
        raise ValueError(f"unknown quantization scheme {scheme}")
    data_bytes = parts[0].numel()
    d.quantization.CopyFrom(pb.Quantization(
        scheme=scheme, group_size=group_size, scales_offset=data_bytes,
        zero_points_offset=data_bytes + parts[1].numel() if len(parts) == 3 else 0))
    return byte_view(torch.cat(parts))


def decode(d: pb.BlockDescriptor, payload, *, dtype: torch.dtype | None = None, layout: int | None = None,
           limits: Limits = DEFAULT_LIMITS, verified: bool = False) -> torch.Tensor:
    """Validate, then turn a payload back into a tensor (optionally another dtype / layout).

    `verified=True` skips the length + checksum pass when a transport already did it.
    The result aliases `payload` when it is writable; read-only buffers are copied once.
    """
    validate_descriptor(d, limits)
    if not verified:
        validate_payload(d, payload)
    view = memoryview(payload)
    raw = torch.frombuffer(bytearray(view) if view.readonly else view, dtype=torch.uint8)
    t = _interpret(d, raw)
    if layout is not None and layout != d.layout:
        t = convert_layout(t, d, layout)
    return t if dtype is None else t.to(dtype)


def _interpret(d: pb.BlockDescriptor, raw: torch.Tensor) -> torch.Tensor:
    shape, q = tuple(d.shape), d.quantization
    if q.scheme == pb.QUANT_SCHEME_INT8_SYMMETRIC:
        scales = raw[q.scales_offset:].view(torch.float32)
        return quant.dequantize_int8(raw[:q.scales_offset].view(torch.int8).reshape(shape), scales, q.group_size)
    if q.scheme == pb.QUANT_SCHEME_UINT4_ASYMMETRIC:
        scales = raw[q.scales_offset:q.zero_points_offset].view(torch.float32)
        return quant.dequantize_uint4(raw[:q.scales_offset], scales, raw[q.zero_points_offset:], q.group_size, shape)
    flat = raw[: d.byte_length].view(TORCH_OF[d.dtype])
    if d.layout == pb.LAYOUT_STRIDED:
        return flat.as_strided(shape, tuple(d.strides))
    return flat.reshape(shape)


def convert_layout(t: torch.Tensor, d: pb.BlockDescriptor, layout: int) -> torch.Tensor:
    """KV_POOL [L, 2, blocks, block_size, H, D] <-> KV_SEQ [L, 2, H, T, D]; dense <-> strided."""
    tokens = d.tokens.end - d.tokens.start
    if d.layout == pb.LAYOUT_KV_POOL and layout == pb.LAYOUT_KV_SEQ:
        return pool_to_seq(t, tokens)
    if d.layout in (pb.LAYOUT_STRIDED, pb.LAYOUT_CONTIGUOUS) and layout in (pb.LAYOUT_STRIDED, pb.LAYOUT_CONTIGUOUS):
        return t.contiguous()
    raise BlockError("layout", f"cannot convert {pb.Layout.Name(d.layout)} to {pb.Layout.Name(layout)}")


def pool_to_seq(t: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """[L, 2, blocks, block_size, H, D] -> [L, 2, H, num_tokens, D] (contiguous)."""
    L, two, nb, bs, H, D = t.shape
    return t.reshape(L, two, nb * bs, H, D)[:, :, :num_tokens].permute(0, 1, 3, 2, 4).contiguous()


def seq_to_pool(t: torch.Tensor, block_size: int) -> torch.Tensor:
    """[L, 2, H, T, D] -> [L, 2, ceil(T / block_size), block_size, H, D], zero-padded."""
    L, two, H, T, D = t.shape
    nb = -(-T // block_size)
    out = t.new_zeros(L, two, nb * block_size, H, D)
    out[:, :, :T] = t.permute(0, 1, 3, 2, 4)
    return out.reshape(L, two, nb, block_size, H, D)
