"""Malformed descriptors, blocks and chunk streams: every one rejected with a BlockError naming a field."""

import random
import time

import pytest
import torch

from protocol import BlockError, codec, inline, shm
from protocol.pb import blocks_pb2 as pb
from protocol.validate import validate_descriptor

HUGE = (1 << 64) - 1


def _valid_blocks() -> list[pb.Block]:
    """One valid block per kind/layout/dtype/quantization family."""
    g = torch.Generator().manual_seed(0)
    kv = torch.randn(2, 2, 3, 4, 2, 8, generator=g)  # [L, 2, blocks, block_size, H, D]
    encs = [
        codec.encode(kv, kind=pb.TENSOR_KIND_KV, layout=pb.LAYOUT_KV_POOL, layers=(0, 2), heads=(0, 2),
                     tokens=(0, 10), block_size=4, model_id="smollm2"),
        codec.encode(torch.randn(2, 1, 2, 5, 8).half(), kind=pb.TENSOR_KIND_KV_KEY, layout=pb.LAYOUT_KV_SEQ,
                     layers=(3, 5), heads=(0, 2), tokens=(0, 5)),
        codec.encode(torch.randn(3, 16).bfloat16(), kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=pb.LAYOUT_TOKENS_HIDDEN),
        codec.encode(torch.softmax(torch.randn(4, 32), -1), kind=pb.TENSOR_KIND_DRAFT_PROBS,
                     layout=pb.LAYOUT_TOKENS_VOCAB, checksum_algorithm=pb.CHECKSUM_ALGORITHM_CRC32),
        codec.encode(torch.randn(4, 6).t(), kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=pb.LAYOUT_STRIDED),
        codec.encode(torch.randn(4, 64), kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=pb.LAYOUT_TOKENS_HIDDEN,
                     quantize=(pb.QUANT_SCHEME_UINT4_ASYMMETRIC, 32)),
        codec.encode(torch.randn(4, 64), kind=pb.TENSOR_KIND_HIDDEN_STATE,
                     quantize=(pb.QUANT_SCHEME_INT8_SYMMETRIC, 16)),
    ]
    return [inline.to_block(e) for e in encs]


def _field_mutations(rng: random.Random):
    """Functions that make a valid descriptor invalid, each by construction."""
    bad_enum = lambda: rng.choice([0, 7, 99, 12345, -1 & 0x7FFFFFFF])  # noqa: E731
    return [
        lambda d: setattr(d, "protocol_version", rng.choice([0, 2, 3, 1000])),
        lambda d: setattr(d, "kind", bad_enum()),
        lambda d: setattr(d, "dtype", bad_enum()),
        lambda d: setattr(d, "layout", rng.choice([0, 7, 99])),
        lambda d: setattr(d, "checksum_algorithm", rng.choice([0, 3, 77])),
        lambda d: setattr(d, "byte_length", d.byte_length + rng.choice([-1, 1, 4, HUGE - d.byte_length])),
        lambda d: d.shape.__setitem__(rng.randrange(len(d.shape)), rng.choice([0, HUGE, 1 << 40, 1 << 31 + 1])),
        lambda d: d.shape.extend([1] * rng.randint(8, 20)),
        lambda d: d.shape.__delitem__(slice(None)),
        lambda d: d.strides.extend([rng.randint(0, 9)] * (len(d.shape) + rng.choice([-1, 1, 2]) if d.strides else 1)),
        lambda d: setattr(d.tokens, "start", d.tokens.end + rng.randint(1, 1 << 30)),
        lambda d: setattr(d.tokens, "end", rng.choice([HUGE, 1 << 25])),
        lambda d: setattr(d.layers, "end", rng.choice([HUGE, 1 << 20])),
        lambda d: setattr(d.heads, "start", d.heads.end + 1),
        lambda d: setattr(d, "model_id", rng.choice(["x" * 129, "bad\x00id", "tab\tid", "\u202e"])),
        lambda d: setattr(d.source_device, "type", rng.choice(["tpu", "", "CUDA", "cpu0", "../cuda"])),
        lambda d: setattr(d.source_device, "index", rng.choice([1024, 1 << 31])),
        lambda d: setattr(d, "checksum", d.checksum ^ (1 << rng.randrange(64))),
        lambda d: d.ClearField("locator"),
        lambda d: setattr(d.locator.inline, "num_chunks", rng.choice([1 << 17, 1 << 31])),
        lambda d: setattr(d.quantization, "scheme", rng.choice([5, 99])),
        lambda d: setattr(d.quantization, "group_size", rng.choice([3, 1 << 30]) if d.quantization.scheme
                          else rng.randint(1, 64)),
        lambda d: setattr(d.quantization, "scales_offset", d.quantization.scales_offset + rng.randint(1, 64)),
        lambda d: setattr(d, "block_size", d.block_size + rng.randint(1, 9)),
    ]


def _payload_mutations(rng: random.Random):
    def flip(b: bytes) -> bytes:
        i = rng.randrange(len(b))
        return b[:i] + bytes([b[i] ^ (1 << rng.randrange(8))]) + b[i + 1:]

    return [
        lambda b: b[:rng.randrange(len(b))],  # truncated
        lambda b: b + bytes(rng.randint(1, 64)),  # trailing garbage
        flip,  # corrupted
    ]


def _receive(wire: bytes) -> torch.Tensor:
    """The receive path of an inline block: parse, validate, decode."""
    d, payload = inline.from_block(inline.parse_block(wire))
    return codec.decode(d, payload, verified=True)


def _expect_rejected(fn, *args) -> str:
    try:
        fn(*args)
    except BlockError as e:
        return e.field
    raise AssertionError("a malformed block was accepted")


def test_ten_thousand_malformed_blocks_are_all_rejected():
    rng = random.Random(1234)
    blocks = _valid_blocks()
    for b in blocks:  # the unmutated ones are fine
        _receive(b.SerializeToString())
    fields, mutations, payloads = {}, _field_mutations(rng), _payload_mutations(rng)
    start = time.perf_counter()
    num_cases = 0
    for i in range(8000):
        block = pb.Block()
        block.CopyFrom(blocks[i % len(blocks)])
        mutations[i % len(mutations)](block.descriptor)
        field = _expect_rejected(_receive, block.SerializeToString())
        fields[field] = fields.get(field, 0) + 1
        num_cases += 1
    for i in range(3000):
        block = blocks[i % len(blocks)]
        if i % 3 == 0:  # the whole message damaged on the wire
            wire = payloads[i % 2](block.SerializeToString())
        else:  # the payload damaged, the descriptor intact
            wire = pb.Block(descriptor=block.descriptor, data=payloads[i % 3](block.data)).SerializeToString()
        _expect_rejected(_receive, wire)
        num_cases += 1
    elapsed = time.perf_counter() - start
    assert num_cases >= 10_000
    assert elapsed < 120, f"fuzzing took {elapsed:.0f} s: something is slow or hangs"
    # the rejections name many different fields, not one catch-all
    assert len(fields) >= 15, fields


def test_random_bytes_are_rejected_as_blocks():
    rng = random.Random(7)
    for _ in range(500):
        wire = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
        _expect_rejected(_receive, wire)


def _chunks(block: pb.Block, n: int = 4) -> list[pb.BlockChunk]:
    enc = codec.Encoded(block.descriptor, memoryview(block.data))
    return list(inline.to_chunks(enc, chunk_bytes=-(-len(block.data) // n)))


@pytest.mark.parametrize("damage, field", [
    (lambda c: c[1:], "chunk.descriptor"),  # first chunk missing
    (lambda c: [c[0], c[2], c[1], c[3]], "chunk.index"),  # out of order
    (lambda c: c[:-1], "chunk.index"),  # ends early
    (lambda c: c[:2] + [pb.BlockChunk(transfer_id=c[2].transfer_id + 1, index=2, data=c[2].data)] + c[3:],
     "chunk.transfer_id"),  # another transfer interleaved
    (lambda c: c[:3] + [pb.BlockChunk(transfer_id=c[3].transfer_id, index=3, data=c[3].data + b"x")], "chunk.data"),
    (lambda c: c[:1] + [pb.BlockChunk(transfer_id=c[1].transfer_id, index=1, descriptor=c[0].descriptor,
                                      data=c[1].data)] + c[2:], "chunk.descriptor"),
    (lambda c: c[:3] + [pb.BlockChunk(transfer_id=c[3].transfer_id, index=3, data=c[3].data[:-1])], "data"),
    (lambda c: [], "chunk.index"),
])
def test_broken_chunk_streams_are_rejected(damage, field):
    chunks = _chunks(_valid_blocks()[0])
    with pytest.raises(BlockError) as e:
        inline.assemble(damage(chunks))
    assert e.value.field == field


def test_shm_locators_that_do_not_fit_are_rejected():
    writer, reader = shm.ShmWriter(num_slots=1), shm.ShmReader()
    try:
        block = _valid_blocks()[0]
        d = writer.write(codec.Encoded(block.descriptor, memoryview(block.data)))
        validate_descriptor(d)
        assert bytes(reader.read(d)) == block.data
        cases = {
            "locator.shm.segment": lambda x: setattr(x.locator.shm, "segment", "hetspec_1_00000000deadbeef"),
            "locator.shm.offset": lambda x: setattr(x.locator.shm, "offset", 1 << 24),
            "locator.shm.generation": lambda x: setattr(x.locator.shm, "generation", x.locator.shm.generation + 2),
        }
        for field, damage in cases.items():
            bad = pb.BlockDescriptor()
            bad.CopyFrom(d)
            damage(bad)
            validate_descriptor(bad)
            with pytest.raises(BlockError) as e:
                reader.read(bad)
            assert e.value.field == field
        for name in ("../etc/passwd", "hetspec_x_12", "other_segment", "hetspec_1_abc"):
            bad = pb.BlockDescriptor()
            bad.CopyFrom(d)
            bad.locator.shm.segment = name
            with pytest.raises(BlockError, match="locator.shm.segment"):
                validate_descriptor(bad)
        writer.write(codec.Encoded(block.descriptor, memoryview(block.data)))  # the slot is rewritten
        with pytest.raises(BlockError, match="generation"):
            reader.read(d)
    finally:
        writer.close()
        reader.close()
