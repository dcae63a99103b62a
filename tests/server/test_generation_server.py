"""The gRPC services as a user runs them: `hetspec serve`, `hetspec drafter serve` and
`hetspec client` in real subprocesses on loopback, the real SmolLM2-135M and INT4 ONNX drafter."""

import json
import subprocess
import sys
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.config import SamplingParams
from orchestrator.engine import Engine
from orchestrator.models import TargetRunner, encode_prompt, eos_token_ids
from orchestrator.server.client import GenerationClient
from protocol.pb import generation_pb2 as pb

from prompts import GROUNDED, PROMPTS
from servers import Server, free_port, wait_until, write_profile

MAX_NEW = 24
ONNX = {"kind": "onnx"}


@pytest.fixture(scope="module")
def reference(smollm2, smollm2_tokenizer):
    """Target-only greedy output of a prompt (chat template applied, as the server does)."""
    target = TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)
    engine = Engine(target, smollm2_tokenizer, None, eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer))
    cache = {}

    def get(prompt: str, max_new_tokens: int = MAX_NEW) -> list[int]:
        key = (prompt, max_new_tokens)
        if key not in cache:
            ids = encode_prompt(smollm2_tokenizer, prompt, chat=True)
            cache[key] = engine.generate(ids, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)).output_ids
        return cache[key]

    return get


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A drafter worker, a server using it remotely, and a server with its drafter in-process."""
    tmp = tmp_path_factory.mktemp("servers")
    drafter_port = free_port()
    drafter = Server("drafter", "serve", "--profile", "cpu", "--port", str(drafter_port))
    remote = Server("serve", "--profile", str(write_profile(tmp / "remote.yaml", {
        "kind": "remote", "address": f"127.0.0.1:{drafter_port}", "timeout_s": 10.0})), "--port", "0")
    local = Server("serve", "--profile", str(write_profile(tmp / "local.yaml", ONNX,
                                                            server={"max_concurrent_requests": 4,
                                                                    "max_queued_requests": 2})), "--port", "0",
                   "--metrics-port", "0")
    box = {"drafter": drafter, "remote": remote, "local": local, "drafter_port": drafter_port}
    yield box
    for s in box.values():
        if isinstance(s, Server):
            s.stop()


def client(server: Server) -> GenerationClient:
    return GenerationClient(server.address)


def hetspec(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_client_json_equals_generate_json_in_process_and_remote_drafter(servers):
    prompt = PROMPTS[1]
    flags = ["--max-new-tokens", "32", "--json"]
    want = json.loads(hetspec("generate", prompt, *flags).stdout)
    for name in ("local", "remote"):
        r = hetspec("client", prompt, "--port", str(servers[name].port), *flags)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got.keys() == want.keys() and got["stats"].keys() == want["stats"].keys()
        assert (got["token_ids"], got["text"], got["finish_reason"], got["usage"]) == \
            (want["token_ids"], want["text"], want["finish_reason"], want["usage"]), name
        assert got["stats"]["drafter"] == ("onnx" if name == "local" else "remote")
        assert got["stats"]["num_drafted"] > 0 and got["stats"]["num_fallback_steps"] == 0
    # streamed text (no --json) is the same text
    r = hetspec("client", prompt, "--port", str(servers["remote"].port), "--max-new-tokens", "32")
    assert r.returncode == 0 and r.stdout == want["text"] + "\n" and "tok/s" in r.stderr


def test_sampling_through_the_remote_drafter_carries_draft_probabilities_and_is_seeded(servers):
    with client(servers["remote"]) as c:
        runs = [c.generate(PROMPTS[0], max_new_tokens=20, temperature=0.8, top_p=0.95, seed=11, ignore_eos=True)
                for _ in range(2)]
    # drafts sampled remotely arrive with their q as DRAFT_PROBS blocks, checked before use
    assert runs[0]["stats"]["num_drafted"] > 0 and runs[0]["stats"]["num_fallback_steps"] == 0
    assert runs[0]["token_ids"] == runs[1]["token_ids"]  # the seed reaches both the target and the drafter


def test_a_request_names_its_acceptance_policy_and_the_stats_say_lossy(servers):
    """The policy and its options travel in the request; a budget of 0 leaves the output the target's
    own, and the final stats still label the request lossy, budget spent from the first token."""
    with client(servers["local"]) as c:
        plain = c.generate(PROMPTS[3], max_new_tokens=24, ignore_eos=True)
        lossy = c.generate(PROMPTS[3], max_new_tokens=24, ignore_eos=True, acceptance="typical",
                           acceptance_options={"budget": 0.0})
    assert plain["stats"]["acceptance"] == "rejection" and not plain["stats"]["lossy"]
    assert lossy["stats"]["acceptance"] == "typical" and lossy["stats"]["lossy"]
    assert lossy["stats"]["budget_exhausted_at"] == 0 and lossy["stats"]["tokens_differing"] == 0
    assert lossy["token_ids"] == plain["token_ids"]


def test_sixteen_concurrent_streams_are_correct_and_the_pool_is_whole_after(servers, reference):
    prompts = (PROMPTS + [GROUNDED] * 4)[:16]
    results: dict[int, dict] = {}
    with client(servers["remote"]) as c:
        def run(i):
            results[i] = c.generate(prompts[i], max_new_tokens=MAX_NEW, ignore_eos=True, timeout=300)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status = c.status()
    assert len(results) == 16
    for i, p in enumerate(prompts):
        assert results[i]["token_ids"] == reference(p), i
    assert sum(r["stats"]["num_drafted"] for r in results.values()) > 0
    assert status.kv_blocks_free == status.kv_blocks_total and status.num_active_requests == 0
    assert status.num_running == status.num_waiting == 0


def test_cancelling_a_stream_frees_its_blocks_within_one_step(servers, smollm2_tokenizer):
    # the cancelled stream holds at least its prompt's blocks; the other stream keeps growing meanwhile
    # (by at most k + 1 tokens a step), so two blocks of slack cover it, however many steps have run
    prompt_blocks = -(-len(encode_prompt(smollm2_tokenizer, GROUNDED, chat=True)) // 16)
    with client(servers["local"]) as c:
        other = c.stream(PROMPTS[3], max_new_tokens=200, ignore_eos=True)  # keeps the engine stepping
        next(other)
        base = c.status()
        stream = c.stream(GROUNDED, max_new_tokens=200, ignore_eos=True)
        next(stream)
        next(stream)
        held = c.status()
        assert held.kv_blocks_free <= base.kv_blocks_free - prompt_blocks
        stream.close()  # cancels the call
        step_at_cancel = c.status().num_steps
        freed = wait_until(lambda: (s := c.status()).kv_blocks_free >= held.kv_blocks_free + prompt_blocks - 2
                           and s)
        assert freed.num_steps - step_at_cancel <= 1, (step_at_cancel, freed.num_steps)
        other.close()
        wait_until(lambda: (s := c.status()).kv_blocks_free == s.kv_blocks_total)


def test_deadline_expiry_frees_the_request(servers):
    with client(servers["local"]) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.generate(PROMPTS[0], max_new_tokens=500, ignore_eos=True, timeout=1.0)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        wait_until(lambda: (s := c.status()).kv_blocks_free == s.kv_blocks_total and s.num_active_requests == 0)


def _raw_call(server: Server, payload: bytes, timeout=30):
    """Send bytes as a GenerateRequest (for requests a well-behaved client cannot build)."""
    with grpc.insecure_channel(server.address) as ch:
        call = ch.unary_stream("/hetspec.v1.Generation/Generate", request_serializer=lambda b: b,
                               response_deserializer=pb.GenerateResponse.FromString)
        return list(call(payload, timeout=timeout))


BAD_UTF8_STOP = pb.GenerateRequest(prompt="hi").SerializeToString() + b"\x4a\x02\xff\xfe"  # field 9 (stop)
_BAD_KEY = b"\x0a\x01\xff\x11" + bytes(6) + b"\xf0\x3f"  # a map entry: key b"\xff", value 1.0
BAD_UTF8_OPTION = pb.GenerateRequest(prompt="hi").SerializeToString() + b"\x72" + bytes([len(_BAD_KEY)]) + _BAD_KEY
UNKNOWN_FIELD = pb.GenerateRequest(prompt="hi").SerializeToString() + b"\xb8\x06\x01"  # field 103, varint

MALFORMED = [
    (pb.GenerateRequest(prompt=""), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    (pb.GenerateRequest(), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[])), grpc.StatusCode.INVALID_ARGUMENT, "token_ids"),
    (pb.GenerateRequest(token_ids=pb.TokenIds(ids=[10**9])), grpc.StatusCode.INVALID_ARGUMENT, "outside the vocabulary"),
    (pb.GenerateRequest(prompt="hi", max_new_tokens=0), grpc.StatusCode.INVALID_ARGUMENT, "max_new_tokens"),
    (pb.GenerateRequest(prompt="hi", max_new_tokens=10**9), grpc.StatusCode.INVALID_ARGUMENT, "max_new_tokens"),
    (pb.GenerateRequest(prompt="hi", temperature=-0.5), grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    (pb.GenerateRequest(prompt="hi", temperature=float("nan")), grpc.StatusCode.INVALID_ARGUMENT, "temperature"),
    (pb.GenerateRequest(prompt="hi", top_p=1.5), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    (pb.GenerateRequest(prompt="hi", top_p=0.0), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    (pb.GenerateRequest(prompt="hi", stop=[""]), grpc.StatusCode.INVALID_ARGUMENT, "stop[0]"),
    (pb.GenerateRequest(prompt="hi", num_speculative_tokens=99), grpc.StatusCode.INVALID_ARGUMENT,
     "num_speculative_tokens"),
    (pb.GenerateRequest(prompt="word " * 9000), grpc.StatusCode.INVALID_ARGUMENT, "context limit"),
    (pb.GenerateRequest(prompt="hi", acceptance="fuzzy"), grpc.StatusCode.INVALID_ARGUMENT,
     "acceptance: unknown acceptance policy 'fuzzy'; allowed: rejection, strict, nkl"),
    (pb.GenerateRequest(prompt="hi", acceptance="nkl", acceptance_options={"gamma": 1.0}),
     grpc.StatusCode.INVALID_ARGUMENT, "acceptance_options.gamma: policy 'nkl' has no option 'gamma'"),
    # options alone apply to the server's default policy (here rejection, which has none)
    (pb.GenerateRequest(prompt="hi", acceptance_options={"delta": 0.1}), grpc.StatusCode.INVALID_ARGUMENT,
     "acceptance_options.delta: policy 'rejection' has no option 'delta'"),
    (pb.GenerateRequest(prompt="hi", acceptance="nkl", temperature=0.7), grpc.StatusCode.INVALID_ARGUMENT,
     "nkl is lossy and judges greedy requests only"),
    (BAD_UTF8_STOP, grpc.StatusCode.INVALID_ARGUMENT, "stop[0]: not valid UTF-8"),
    (BAD_UTF8_OPTION, grpc.StatusCode.INVALID_ARGUMENT, "acceptance_options[0].key: not valid UTF-8"),
    (UNKNOWN_FIELD, grpc.StatusCode.INVALID_ARGUMENT, "field #103: unknown field"),
    (b"\xff\xff\xff", grpc.StatusCode.INVALID_ARGUMENT, "not a valid hetspec.v1.GenerateRequest"),
    (pb.GenerateRequest(prompt="x" * (70 << 20)), grpc.StatusCode.RESOURCE_EXHAUSTED, "larger than max"),
]


def test_malformed_requests_get_the_right_code_and_the_server_stays_healthy(servers):
    server = servers["local"]
    for request, code, text in MALFORMED:
        payload = request if isinstance(request, bytes) else request.SerializeToString()
        with pytest.raises(grpc.RpcError) as e:
            _raw_call(server, payload)
        assert e.value.code() == code, (text, e.value.code(), e.value.details())
        assert text in e.value.details(), (text, e.value.details())
        assert "Traceback" not in e.value.details() and "File " not in e.value.details()
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "hetspec.v1.Generation"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
                health_pb2.HealthCheckResponse.SERVING
    with client(server) as c:  # and it still generates
        assert c.generate(PROMPTS[6], max_new_tokens=4)["usage"]["completion_tokens"] == 4
    assert "Traceback" not in server.log()


def test_requests_past_the_running_batch_queue_and_past_the_queue_are_refused(servers):
    server = servers["local"]  # max_concurrent_requests: 4, max_queued_requests: 2
    with client(server) as c:
        streams = [c.stream(PROMPTS[i], max_new_tokens=300, ignore_eos=True) for i in range(4)]
        for s in streams:
            next(s)
        queued = [c.stub.Generate(c.request(PROMPTS[4 + i], max_new_tokens=4)) for i in range(2)]
        wait_until(lambda: (c.status().num_running, c.status().num_waiting) == (4, 2))
        with pytest.raises(grpc.RpcError) as e:
            c.generate(PROMPTS[5], max_new_tokens=4)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit of 6" in e.value.details()
        for s in streams:
            s.close()  # cancels: the queued two run now
        assert [sum(len(m.token_ids) for m in call) for call in queued] == [4, 4]
        wait_until(lambda: c.status().num_active_requests == 0)
        assert c.generate(PROMPTS[5], max_new_tokens=4)["usage"]["completion_tokens"] == 4


def test_prometheus_metrics_are_served(servers):
    import re
    import urllib.request

    server = servers["local"]
    (port,) = [int(m[1]) for line in server.lines if (m := re.search(r"metrics on http://[\d.]+:(\d+)/metrics", line))]
    with client(server) as c:
        c.generate(PROMPTS[8], max_new_tokens=8)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    values = {m[1]: float(m[2]) for m in re.finditer(r"^(hetspec_\w+) ([\d.e+-]+)$", text, re.M)}
    assert values["hetspec_draft_tokens_total"] > 0 and values["hetspec_verify_steps_total"] > 0
    assert values["hetspec_kv_blocks_total"] > 0 and values["hetspec_step_seconds_count"] > 0


def test_reflection_lists_the_services(servers):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(servers["remote"].address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        (answer,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name for s in answer.list_services_response.service}
    assert {"hetspec.v1.Generation", "grpc.health.v1.Health"} <= names
    with grpc.insecure_channel(servers["remote"].address) as ch:  # what grpcurl asks for next
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        (answer,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol="hetspec.v1.Generation")]))
        assert answer.file_descriptor_response.file_descriptor_proto
    with grpc.insecure_channel(servers["drafter"].address) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        (answer,) = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        assert "hetspec.v1.Drafter" in {s.name for s in answer.list_services_response.service}


def test_sigkill_of_the_drafter_mid_stream_keeps_every_stream_exact_then_speculation_resumes(servers, reference):
    """Last on purpose: it kills the module's drafter worker (and starts a new one)."""
    prompts = [PROMPTS[0], PROMPTS[4], GROUNDED, PROMPTS[9]]
    n = 64
    results, first = {}, threading.Barrier(len(prompts) + 1, timeout=300)
    with client(servers["remote"]) as c:
        def run(i):
            ids, final = [], None
            for j, delta in enumerate(c.stream(prompts[i], max_new_tokens=n, ignore_eos=True, timeout=600)):
                ids += delta.token_ids
                final = delta.final or final
                if j == 1:
                    first.wait()
            results[i] = (ids, final)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        first.wait()  # every stream is under way
        servers["drafter"].kill()
        for t in threads:
            t.join()
        for i, p in enumerate(prompts):
            ids, final = results[i]
            assert ids == reference(p, n), i
            assert final.finish_reason == "length" and final.stats.num_fallback_steps > 0
        assert c.status().drafter_state == "unavailable"
        servers["drafter"] = Server("drafter", "serve", "--profile", "cpu", "--port", str(servers["drafter_port"]))
        # the engine reconnects between steps (with backoff): speculation comes back within a request or two
        after = None
        for _ in range(5):
            after = c.generate(PROMPTS[2], max_new_tokens=MAX_NEW, ignore_eos=True)
            if after["stats"]["num_drafted"] > 0:
                break
            time.sleep(1)
        assert after["token_ids"] == reference(PROMPTS[2])
        assert after["stats"]["num_drafted"] > 0 and after["stats"]["num_accepted"] > 0
        status = c.status()
        assert status.drafter_state == "connected" and status.drafter_reconnects >= 1
