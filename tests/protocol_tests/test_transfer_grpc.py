"""BlockTransfer on a real gRPC server on loopback: inline chunks and shm descriptors."""

import re
import subprocess
import sys

import grpc
import pytest
import torch

from protocol import codec, shm, transfer
from protocol.inline import to_chunks
from protocol.pb import blocks_pb2 as pb
from protocol.pb import blocks_pb2_grpc


@pytest.fixture(scope="module")
def server():
    received = []
    srv, port = transfer.serve(on_block=lambda d, payload: received.append((d, bytes(payload))))
    stub = blocks_pb2_grpc.BlockTransferStub(transfer.channel(f"127.0.0.1:{port}"))
    yield stub, received
    srv.stop(0)


def _kv_block() -> codec.Encoded:
    kv = torch.randn(2, 2, 80, 16, 3, 64)  # [L, 2, blocks, block_size, H, D]: 3.75 MiB, 8 chunks
    return codec.encode(kv, kind=pb.TENSOR_KIND_KV, layout=pb.LAYOUT_KV_POOL, layers=(0, 2), heads=(0, 3),
                        tokens=(0, 1279), block_size=16, model_id="smollm2")


def test_inline_chunked_push_arrives_intact(server):
    stub, received = server
    enc = _kv_block()
    reply = transfer.push(stub, enc)
    d, payload = received[-1]
    assert reply.byte_length == enc.payload.nbytes and payload == enc.payload.tobytes()
    assert reply.checksum == enc.descriptor.checksum
    assert d.locator.inline.num_chunks == 8


def test_shm_descriptor_push_arrives_intact(server):
    stub, received = server
    enc = _kv_block()
    writer = shm.ShmWriter()
    try:
        reply = transfer.push_descriptor(stub, writer.write(enc))
    finally:
        writer.close()
    assert reply.byte_length == enc.payload.nbytes and received[-1][1] == enc.payload.tobytes()


def test_malformed_pushes_get_invalid_argument_naming_the_field(server):
    stub, _ = server
    enc = _kv_block()
    chunks = list(to_chunks(enc))
    bad_version = pb.BlockChunk()
    bad_version.CopyFrom(chunks[0])
    bad_version.descriptor.protocol_version = 2
    cases = {
        "protocol_version": [bad_version] + chunks[1:],
        "chunk.index": chunks[:1],
        "checksum": [chunks[0], pb.BlockChunk(transfer_id=chunks[1].transfer_id, index=1,
                                              data=bytes(len(chunks[1].data)))] + chunks[2:],
    }
    for field, stream in cases.items():
        with pytest.raises(grpc.RpcError) as e:
            stub.Push(iter(stream), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith(field), e.value.details()


def test_oversized_message_is_refused(server):
    stub, _ = server
    enc = _kv_block()
    with pytest.raises(grpc.RpcError) as e:
        transfer.push(stub, enc, chunk_bytes=enc.payload.nbytes)  # one 3.75 MiB message
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_generated_code_is_fresh():
    result = subprocess.run([sys.executable, "-m", "protocol.gen_proto", "--check"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_freshness_check_reads_code_not_the_generators_version_stamps(tmp_path):
    """A newer grpcio-tools writes the same code under a newer stamp: not stale. A changed line is."""
    from protocol.gen_proto import ROOT, _code

    for name in ("drafter_pb2_grpc.py", "drafter_pb2.py"):
        committed = (ROOT / "protocol" / "pb" / name).read_text()
        restamped = committed.replace("GRPC_GENERATED_VERSION = '", "GRPC_GENERATED_VERSION = '9.").replace(
            "# Protobuf Python Version: ", "# Protobuf Python Version: 9.")
        restamped = re.sub(r"(Domain\.PUBLIC,\s*)\d+", r"\g<1>99", restamped)
        assert restamped != committed
        (tmp_path / name).write_text(restamped)
        assert _code(tmp_path / name) == _code(ROOT / "protocol" / "pb" / name)
        (tmp_path / name).write_text(restamped.replace("import grpc", "import grpc  # edited", 1)
                                     if "grpc" in name else restamped.replace("DESCRIPTOR", "DESCRIPTOR_", 1))
        assert _code(tmp_path / name) != _code(ROOT / "protocol" / "pb" / name)
