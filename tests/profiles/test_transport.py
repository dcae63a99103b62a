"""Every `transport:` key of a profile does what it says: each is set here and its effect observed."""

import os
from dataclasses import replace

import grpc
import pytest
import torch
import yaml

from orchestrator.assemble import assemble
from orchestrator.config import SamplingParams, TransportConfig
from orchestrator.drafters import KvHandoffDrafter, NgramDrafter
from orchestrator.engine.swap import swap_in, swap_out
from orchestrator.profiles import load_profile
from orchestrator.tracing import Tracer
from protocol import StagingPool
from protocol.pb import blocks_pb2, drafter_pb2_grpc
from protocol.pb import drafter_pb2 as pb
from protocol.shm import live_segments

from prompts import PROMPTS


def _profile(tmp_path, transport: dict, kv_handoff: bool = True):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "version": 1, "target": {"model": "smollm2-135m", "device": "cpu", "kv": {"max_tokens": 2048}},
        "drafters": {"d": {"kind": "onnx", "kv_handoff": kv_handoff}},
        "speculation": {"drafter": "d", "num_speculative_tokens": 4}, "transport": transport}))
    return load_profile(str(path))


@pytest.fixture(scope="module")
def shm_parts(tmp_path_factory):
    profile = _profile(tmp_path_factory.mktemp("p"), {"kind": "shared_memory", "staging_pool_bytes": 4096})
    parts = assemble(profile.engine_config(), tracer=Tracer(), progress=False)
    yield parts
    parts.drafter.close()


def test_kind_shared_memory_sends_the_kv_handoff_through_a_segment(shm_parts, smollm2_tokenizer):
    parts = shm_parts
    assert isinstance(parts.drafter, KvHandoffDrafter) and parts.drafter.packer.kind == "shared_memory"
    before = set(live_segments(os.getpid()))
    seq = parts.engine().generate(smollm2_tokenizer(PROMPTS[0]).input_ids,
                                  SamplingParams(max_new_tokens=12, ignore_eos=True))
    assert seq.stats.num_drafted > 0
    assert set(live_segments(os.getpid())) - before  # the block's bytes went through shared memory
    (span,) = [s for s in parts.tracer.clear() if s.name == "serialize"]
    assert span.args["nbytes"] == parts.drafter.bytes_sent > 0


def test_staging_pool_bytes_caps_the_buffers_kept_for_reuse(shm_parts, smollm2_tokenizer):
    target, staging = shm_parts.target, shm_parts.staging
    assert staging.max_bytes == 4096
    target.forward([(77, smollm2_tokenizer(PROMPTS[1]).input_ids, 1)])
    kv = swap_out(target, 77, staging)
    assert kv.nbytes > 4096
    swap_in(target, 77, kv)  # releases its buffer: larger than the cap, so not kept
    assert staging.free_bytes == 0
    target.free(77)
    default = StagingPool(target.device, max_bytes=TransportConfig().staging_pool_bytes)  # 64 MiB: kept
    target.forward([(78, smollm2_tokenizer(PROMPTS[1]).input_ids, 1)])
    swap_in(target, 78, swap_out(target, 78, default))
    assert default.free_bytes > 0
    target.free(78)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: host memory is never page-locked here")
def test_pinned_staging_switches_page_locked_buffers(tmp_path):
    for pinned in (True, False):
        profile = _profile(tmp_path, {"pinned_staging": pinned}, kv_handoff=False)
        config = profile.engine_config()
        parts = assemble(replace(config, device="cuda:0", drafter=None), progress=False)
        staged = parts.staging.to_host(torch.ones(1024, device="cuda:0"))
        assert staged.wait().is_pinned() is pinned
        staged.release()


def test_max_message_bytes_bounds_every_grpc_message(tmp_path):
    from orchestrator.server import DrafterServicer, server_options, start_server

    profile = _profile(tmp_path, {"max_message_bytes": 4096})
    options = server_options(profile, None, 0, 0)
    served = start_server(options, [DrafterServicer(NgramDrafter(), vocab_size=1000).register])
    frame = pb.DrafterRequest(protocol_version=blocks_pb2.PROTOCOL_VERSION_1, request_id=1,
                              open=pb.OpenSequence(sequence_id=1, prompt_ids=[999] * 3000))
    try:
        assert frame.ByteSize() > 4096
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as ch:
            stub = drafter_pb2_grpc.DrafterStub(ch)
            with pytest.raises(grpc.RpcError) as e:
                list(stub.Session(iter([frame]), timeout=10))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            small = pb.DrafterRequest(protocol_version=blocks_pb2.PROTOCOL_VERSION_1, request_id=1,
                                      open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 2, 3]))
            assert list(stub.Session(iter([small]), timeout=10))[0].ack.num_tokens == 3
    finally:
        served.stop(0)
