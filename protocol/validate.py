"""Check every descriptor field before any byte is touched; reject with the field's name.

All arithmetic is on Python ints with early bounds, so an absurd shape is rejected
without allocating or overflowing anything.
"""

import re
import zlib
from dataclasses import dataclass

import xxhash

from protocol.dtypes import BITS
from protocol.errors import BlockError
from protocol.pb import blocks_pb2 as pb

SEGMENT_NAME = re.compile(r"hetspec_[0-9]{1,10}_[0-9a-f]{8,32}")
KV_KINDS = (pb.TENSOR_KIND_KV_KEY, pb.TENSOR_KIND_KV_VALUE, pb.TENSOR_KIND_KV)
_NAMED = {  # layout -> (rank, kinds allowed)
    pb.LAYOUT_KV_POOL: (6, KV_KINDS),
    pb.LAYOUT_KV_SEQ: (5, KV_KINDS),
    pb.LAYOUT_TOKENS_HIDDEN: (2, (pb.TENSOR_KIND_HIDDEN_STATE,)),
    pb.LAYOUT_TOKENS_VOCAB: (2, (pb.TENSOR_KIND_DRAFT_PROBS,)),
}
_QUANT_OF_DTYPE = {
    pb.DTYPE_FLOAT32: (pb.QUANT_SCHEME_NONE,),
    pb.DTYPE_FLOAT16: (pb.QUANT_SCHEME_NONE,),
    pb.DTYPE_BFLOAT16: (pb.QUANT_SCHEME_NONE,),
    pb.DTYPE_INT8: (pb.QUANT_SCHEME_NONE, pb.QUANT_SCHEME_INT8_SYMMETRIC),
    pb.DTYPE_UINT4: (pb.QUANT_SCHEME_UINT4_ASYMMETRIC,),
}


@dataclass(frozen=True)
class Limits:
    """What a receiver is prepared to accept."""

    max_bytes: int = 1 << 30  # one block's payload
    max_rank: int = 8
    max_dim: int = 1 << 31
    max_layers: int = 1024
    max_heads: int = 1024
    max_tokens: int = 1 << 24
    max_chunks: int = 1 << 16
    max_model_id: int = 128
    max_device_index: int = 1024
    device_kinds: tuple[str, ...] = ("cpu", "cuda", "npu")


DEFAULT_LIMITS = Limits()


def _check(ok: bool, field: str, message: str) -> None:
    if not ok:
        raise BlockError(field, message)


def _enum(value: int, enum, field: str, allow_zero: bool = False) -> None:
    _check(value in enum.values() and (allow_zero or value != 0), field,
           f"unknown or unspecified value {value}")


def _range(r, field: str, bound: int, required: bool) -> int:
    """Validate a Range; return its length."""
    _check(r.end >= r.start, field, f"end {r.end} < start {r.start}")
    _check(r.end <= bound, field, f"end {r.end} exceeds the limit {bound}")
    _check(not required or r.end > r.start, field, "empty range where one is required")
    return r.end - r.start


def validate_descriptor(d: pb.BlockDescriptor, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise BlockError naming the first field that is missing, unknown, inconsistent or out of bounds."""
    _check(d.protocol_version == pb.PROTOCOL_VERSION_1, "protocol_version",
           f"unsupported version {d.protocol_version} (this receiver speaks 1)")
    _enum(d.kind, pb.TensorKind, "kind")
    _enum(d.dtype, pb.DType, "dtype")
    _enum(d.layout, pb.Layout, "layout")
    _enum(d.checksum_algorithm, pb.ChecksumAlgorithm, "checksum_algorithm")
    _check(len(d.model_id) <= limits.max_model_id and d.model_id.isprintable(), "model_id",
           f"must be printable and at most {limits.max_model_id} characters")
    _check(d.source_device.type in limits.device_kinds, "source_device.type",
           f"{d.source_device.type!r} is not one of {', '.join(limits.device_kinds)}")
    _check(d.source_device.index < limits.max_device_index, "source_device.index", "out of range")
    kv = d.kind in KV_KINDS
    _range(d.layers, "layers", limits.max_layers, required=kv)
    _range(d.heads, "heads", limits.max_heads, required=kv)
    _range(d.tokens, "tokens", limits.max_tokens, required=False)
    numel = _validate_shape(d, limits)
    _validate_layout(d)
    data_bytes = _validate_strides(d, numel)
    expected = data_bytes + _quant_table_bytes(d, data_bytes)
    _check(expected <= limits.max_bytes, "byte_length", f"{expected} bytes exceeds the limit {limits.max_bytes}")
    _check(d.byte_length == expected, "byte_length", f"is {d.byte_length}, shape x dtype needs {expected}")
    _validate_locator(d, limits)


def _validate_shape(d, limits: Limits) -> int:
    _check(1 <= len(d.shape) <= limits.max_rank, "shape", f"rank {len(d.shape)} not in [1, {limits.max_rank}]")
    numel = 1
    for i, n in enumerate(d.shape):
        _check(1 <= n <= limits.max_dim, f"shape[{i}]", f"dimension {n} not in [1, {limits.max_dim}]")
        numel *= n
        _check(numel * BITS[d.dtype] // 8 <= limits.max_bytes, "shape",
               f"more than {limits.max_bytes} bytes of {pb.DType.Name(d.dtype)}")
    return numel


def _validate_layout(d) -> None:
    shape, tokens = list(d.shape), d.tokens.end - d.tokens.start
    _check(d.layout == pb.LAYOUT_KV_POOL or d.block_size == 0, "block_size", "set for a layout without blocks")
    if d.layout not in _NAMED:
        return
    rank, kinds = _NAMED[d.layout]
    name = pb.Layout.Name(d.layout)
    _check(d.kind in kinds, "kind", f"{pb.TensorKind.Name(d.kind)} cannot use {name}")
    _check(len(shape) == rank, "shape", f"{name} has rank {rank}, got {len(shape)}")
    if d.kind in KV_KINDS:
        _check(shape[1] == (2 if d.kind == pb.TENSOR_KIND_KV else 1), "shape[1]",
               f"{pb.TensorKind.Name(d.kind)} needs {2 if d.kind == pb.TENSOR_KIND_KV else 1} on the key/value axis")
        _check(shape[0] == d.layers.end - d.layers.start, "layers", f"covers {d.layers.end - d.layers.start}, shape[0] is {shape[0]}")
    if d.layout == pb.LAYOUT_KV_POOL:
        _check(d.block_size == shape[3], "block_size", f"is {d.block_size}, shape[3] is {shape[3]}")
        _check(shape[4] == d.heads.end - d.heads.start, "heads", f"covers {d.heads.end - d.heads.start}, shape[4] is {shape[4]}")
        capacity = shape[2] * shape[3]
        _check(capacity - shape[3] < tokens <= capacity, "tokens",
               f"{tokens} tokens do not fill the last of {shape[2]} blocks of {shape[3]}")
    elif d.layout == pb.LAYOUT_KV_SEQ:
        _check(shape[2] == d.heads.end - d.heads.start, "heads", f"covers {d.heads.end - d.heads.start}, shape[2] is {shape[2]}")
        _check(shape[3] == tokens, "tokens", f"covers {tokens}, shape[3] is {shape[3]}")
    else:
        _check(shape[0] == tokens, "tokens", f"covers {tokens}, shape[0] is {shape[0]}")


def _validate_strides(d, numel: int) -> int:
    """Bytes of the data region: the dense size, or the strided span."""
    bits = BITS[d.dtype]
    if d.layout != pb.LAYOUT_STRIDED:
        _check(len(d.strides) == 0, "strides", "only LAYOUT_STRIDED carries strides")
        _check((numel * bits) % 8 == 0, "shape", "packed 4-bit data must fill whole bytes")
        return numel * bits // 8
    _check(d.dtype != pb.DTYPE_UINT4, "layout", "packed 4-bit data cannot be strided")
    _check(len(d.strides) == len(d.shape), "strides", f"{len(d.strides)} strides for rank {len(d.shape)}")
    span = 1 + sum((n - 1) * s for n, s in zip(d.shape, d.strides))
    _check(span * bits // 8 <= 1 << 40, "strides", "span too large")
    return span * bits // 8


def _quant_table_bytes(d, data_bytes: int) -> int:
    q = d.quantization
    _enum(q.scheme, pb.QuantScheme, "quantization.scheme", allow_zero=True)
    _check(q.scheme in _QUANT_OF_DTYPE[d.dtype], "quantization.scheme",
           f"{pb.QuantScheme.Name(q.scheme)} does not go with {pb.DType.Name(d.dtype)}")
    if q.scheme == pb.QUANT_SCHEME_NONE:
        _check(q.group_size == 0 and q.scales_offset == 0 and q.zero_points_offset == 0, "quantization",
               "group fields set without a scheme")
        return 0
    last = d.shape[-1]
    _check(d.layout != pb.LAYOUT_STRIDED, "layout", "quantized data must be dense")
    _check(0 < q.group_size <= last and last % q.group_size == 0, "quantization.group_size",
           f"{q.group_size} must divide the last dimension {last}")
    _check(d.dtype != pb.DTYPE_UINT4 or q.group_size % 2 == 0, "quantization.group_size", "must be even for 4-bit")
    groups = data_bytes * 8 // BITS[d.dtype] // q.group_size
    _check(q.scales_offset == data_bytes, "quantization.scales_offset", f"must be {data_bytes} (right after the codes)")
    zeros = groups if q.scheme == pb.QUANT_SCHEME_UINT4_ASYMMETRIC else 0
    want_zeros = data_bytes + 4 * groups if zeros else 0
    _check(q.zero_points_offset == want_zeros, "quantization.zero_points_offset", f"must be {want_zeros}")
    return 4 * groups + zeros


def _validate_locator(d, limits: Limits) -> None:
    where = d.locator.WhichOneof("where")
    _check(where is not None, "locator", "missing (inline or shm)")
    if where == "inline":
        _check(d.locator.inline.num_chunks <= limits.max_chunks, "locator.inline.num_chunks",
               f"more than {limits.max_chunks}")
        return
    shm = d.locator.shm
    _check(SEGMENT_NAME.fullmatch(shm.segment) is not None, "locator.shm.segment", f"bad segment name {shm.segment!r}")
    _check(shm.generation > 0 and shm.generation % 2 == 0, "locator.shm.generation", "must be even and > 0")
    _check(shm.offset <= limits.max_bytes << 4, "locator.shm.offset", "out of range")


def checksum(algorithm: int, payload) -> int:
    """The checksum of `payload` (any buffer) with the descriptor's algorithm."""
    if algorithm == pb.CHECKSUM_ALGORITHM_XXH3_64:
        return xxhash.xxh3_64_intdigest(payload)
    if algorithm == pb.CHECKSUM_ALGORITHM_CRC32:
        return zlib.crc32(payload)
    raise BlockError("checksum_algorithm", f"unknown algorithm {algorithm}")


def validate_payload(d: pb.BlockDescriptor, payload) -> None:
    """The payload's length and checksum match the (already validated) descriptor."""
    n = memoryview(payload).nbytes
    _check(n == d.byte_length, "data", f"{n} bytes, descriptor says {d.byte_length}")
    _check(checksum(d.checksum_algorithm, payload) == d.checksum, "checksum", "payload does not match")
