"""Round trips through the block codec and every transport; layout, dtype and quantized forms."""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol import BlockError, codec, inline, shm
from protocol.pb import blocks_pb2 as pb
from protocol.validate import validate_descriptor

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8]


@pytest.fixture(scope="module")
def shm_pair():
    writer, reader = shm.ShmWriter(num_slots=2), shm.ShmReader()
    yield writer, reader
    writer.close()
    reader.close()


def _tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, generator=g, dtype=torch.int8)
    return (torch.randn(shape, generator=g) * 3).to(dtype)


def _send(enc: codec.Encoded, transport: str, pair) -> tuple[pb.BlockDescriptor, bytes | bytearray]:
    """Through one transport and back: (validated descriptor, received payload)."""
    if transport == "inline":
        wire = pb.Block.FromString(inline.to_block(enc).SerializeToString())
        return inline.from_block(wire)
    if transport == "chunked":
        chunks = [pb.BlockChunk.FromString(c.SerializeToString()) for c in inline.to_chunks(enc, chunk_bytes=97)]
        return inline.assemble(chunks)
    d = pb.BlockDescriptor.FromString(pair[0].write(enc).SerializeToString())
    validate_descriptor(d)
    return d, pair[1].read(d)


shapes = st.lists(st.integers(1, 7), min_size=1, max_size=4).map(tuple)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dtype=st.sampled_from(DTYPES), shape=shapes, strided=st.booleans(),
       transport=st.sampled_from(["inline", "chunked", "shm"]), seed=st.integers(0, 1000))
def test_round_trip_is_exact(shm_pair, dtype, shape, strided, transport, seed):
    x = _tensor(dtype, shape, seed)
    layout = pb.LAYOUT_CONTIGUOUS
    if strided and len(shape) >= 2:  # a transposed view travels without a copy
        x, layout = x.transpose(0, -1), pb.LAYOUT_STRIDED
    enc = codec.encode(x, kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=layout, source_device="cpu")
    sent = enc.payload.tobytes()
    d, payload = _send(enc, transport, shm_pair)
    assert bytes(payload) == sent
    y = codec.decode(d, payload)
    assert y.dtype == x.dtype and y.shape == x.shape
    assert torch.equal(y, x)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layers=st.integers(1, 3), heads=st.integers(1, 3), tokens=st.integers(1, 40), block_size=st.sampled_from([1, 4, 16]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]),
       transport=st.sampled_from(["inline", "chunked", "shm"]))
def test_kv_pool_layout_converts_to_the_drafters_layout(shm_pair, layers, heads, tokens, block_size, dtype, transport):
    head_dim = 8
    seq = _tensor(dtype, (layers, 2, heads, tokens, head_dim), tokens)  # [L, 2, H, T, D]
    pool = codec.seq_to_pool(seq, block_size)  # [L, 2, blocks, block_size, H, D]
    enc = codec.encode(pool, kind=pb.TENSOR_KIND_KV, layout=pb.LAYOUT_KV_POOL, layers=(0, layers),
                       heads=(0, heads), tokens=(0, tokens), block_size=block_size, model_id="m")
    d, payload = _send(enc, transport, shm_pair)
    back = codec.decode(d, payload, layout=pb.LAYOUT_KV_SEQ, dtype=torch.float32)
    assert back.shape == (layers, 2, heads, tokens, head_dim)
    assert torch.equal(back, seq.float())


@pytest.mark.parametrize("scheme, dtype, tolerance", [
    (pb.QUANT_SCHEME_INT8_SYMMETRIC, pb.DTYPE_INT8, 1 / 254),
    (pb.QUANT_SCHEME_UINT4_ASYMMETRIC, pb.DTYPE_UINT4, 1 / 30),
])
@pytest.mark.parametrize("transport", ["inline", "chunked", "shm"])
def test_quantized_blocks_keep_their_bytes_and_bound_the_error(shm_pair, scheme, dtype, tolerance, transport):
    x = _tensor(torch.float32, (6, 64), 1)
    enc = codec.encode(x, kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=pb.LAYOUT_TOKENS_HIDDEN, quantize=(scheme, 32))
    assert enc.descriptor.dtype == dtype
    sent = enc.payload.tobytes()
    d, payload = _send(enc, transport, shm_pair)
    assert bytes(payload) == sent
    y = codec.decode(d, payload)
    group_range = x.reshape(-1, 32).amax(1) - x.reshape(-1, 32).amin(1)  # error is at most half a step
    worst = ((y - x).abs().reshape(-1, 32).amax(1) / group_range).max()
    assert worst <= tolerance + 1e-6
    assert enc.payload.nbytes < x.numel() * 4 / (2 if dtype == pb.DTYPE_UINT4 else 1.5)


def test_receiver_asks_for_another_dtype():
    x = _tensor(torch.float32, (4, 16), 0)
    enc = codec.encode(x, kind=pb.TENSOR_KIND_DRAFT_PROBS, layout=pb.LAYOUT_TOKENS_VOCAB)
    d, payload = inline.from_block(inline.to_block(enc))
    y = codec.decode(d, payload, dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16 and torch.equal(y, x.bfloat16())


def test_encode_is_zero_copy_for_dense_tensors():
    x = torch.arange(12, dtype=torch.float32)
    enc = codec.encode(x, kind=pb.TENSOR_KIND_HIDDEN_STATE)
    x[0] = 42.0  # the payload is a view over the tensor's memory
    assert enc.payload[:4].cast("f")[0] == 42.0


def test_impossible_layout_conversion_is_refused():
    enc = codec.encode(torch.zeros(2, 3), kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=pb.LAYOUT_TOKENS_HIDDEN)
    d, payload = inline.from_block(inline.to_block(enc))
    with pytest.raises(BlockError, match="layout"):
        codec.decode(d, payload, layout=pb.LAYOUT_KV_SEQ)


def test_numpy_arrays_encode_like_tensors():
    a = np.arange(24, dtype=np.float16).reshape(4, 6)
    enc = codec.encode(a, kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=pb.LAYOUT_TOKENS_HIDDEN)
    assert enc.descriptor.dtype == pb.DTYPE_FLOAT16
    d, payload = inline.from_block(inline.to_block(enc))
    assert np.array_equal(codec.decode(d, payload).numpy(), a)
