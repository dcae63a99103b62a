"""The OpenAI-compatible HTTP front door as users reach it: `hetspec serve --http-port 0` in a real
process (SmolLM2-135M, INT4 ONNX drafter), the real `openai` client, raw HTTP for what no client sends."""

import http.client
import json
import re
import threading
import time

import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.server.channels import ChannelOptions, open_channel
from orchestrator.server.client import GenerationClient

from prompts import PROMPTS
from servers import Server, wait_until, write_profile

MODEL = "smollm2-135m"
HTTP_READY = re.compile(r"OpenAI-compatible HTTP on http://[\d.]+:(\d+)/v1")
TOKEN = "s3cret-token"


def http_port(server: Server) -> int:
    return int(next(m[1] for line in server.lines if (m := HTTP_READY.search(line))))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Default limits (16 admitted, 256 queued), in-process ONNX drafter, k auto."""
    profile = write_profile(tmp_path_factory.mktemp("http") / "p.yaml", {"kind": "onnx"})
    s = Server("serve", "--profile", str(profile), "--port", "0", "--http-port", "0")
    s.http = http_port(s)
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """One request admitted, one queued, a bearer token: for refusals."""
    profile = write_profile(tmp_path_factory.mktemp("tight") / "p.yaml", {"kind": "onnx"},
                            server={"max_concurrent_requests": 1, "max_queued_requests": 1,
                                    "auth_token_env": "HETSPEC_TEST_TOKEN"})
    s = Server("serve", "--profile", str(profile), "--port", "0", "--http-port", "0",
               env={"HETSPEC_TEST_TOKEN": TOKEN})
    s.http = http_port(s)
    yield s
    assert s.stop() == 0


def client(server: Server, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{server.http}/v1", api_key=kw.pop("api_key", "unused"),
                         max_retries=0, **kw)


def raw(server: Server, method: str, path: str, body: bytes | str | None = None,
        headers: dict | None = None) -> tuple[int, dict, dict | str]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=120)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read().decode()
    conn.close()
    try:
        return r.status, dict(r.getheaders()), json.loads(data)
    except json.JSONDecodeError:
        return r.status, dict(r.getheaders()), data


def status(server: Server, token: str | None = None):
    with GenerationClient(server.address, ChannelOptions(token=token)) as c:
        return c.status()


def kv_free(server: Server) -> tuple[int, int]:
    s = status(server)
    return s.kv_blocks_free, s.kv_blocks_total


def test_models_health_and_metrics(server):
    assert [m.id for m in client(server).models.list().data] == [MODEL]
    assert raw(server, "GET", "/health")[:1] == (200,)
    status, _, text = raw(server, "GET", "/metrics")
    assert status == 200 and "vllm:spec_decode_num_drafts_total" in text and "hetspec_draft_tokens_total" in text


def test_chat_and_completions_greedy_equal_generate_json(server, smollm2_tokenizer):
    """The same tokens as `hetspec generate --json` (the CLI, in its own process)."""
    from test_generation_server import hetspec

    want = json.loads(hetspec("generate", PROMPTS[1], "--max-new-tokens", "24", "--json").stdout)
    c = client(server)
    chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}],
                                     max_tokens=24, temperature=0)
    extra = chat.model_extra["hetspec"]
    assert extra["token_ids"] == want["token_ids"] and chat.choices[0].message.content == want["text"]
    assert chat.usage.prompt_tokens == want["usage"]["prompt_tokens"] and chat.usage.completion_tokens == 24
    assert chat.choices[0].finish_reason == "length" and extra["stats"]["drafter"] == "onnx"
    # streamed, usage in the last chunk: the same text
    chunks = list(c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}],
                                            max_tokens=24, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == want["text"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    # completions on raw text (no chat template): streamed and not agree, and equal the CLI's --raw
    raw_want = json.loads(hetspec("generate", PROMPTS[0], "--raw", "--max-new-tokens", "20", "--json").stdout)
    done = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0)
    assert done.model_extra["hetspec"]["token_ids"] == raw_want["token_ids"]
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=20, temperature=0, stream=True))
    assert done.choices[0].text == streamed == raw_want["text"]
    by_ids = c.completions.create(model=MODEL, prompt=smollm2_tokenizer(PROMPTS[0]).input_ids, max_tokens=20,
                                  temperature=0)
    assert by_ids.model_extra["hetspec"]["token_ids"] == raw_want["token_ids"]


MALFORMED = [  # (body, status, param the error must name)
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 1.5}, 400, "top_p"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 3}, 400, "n"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ({"model": MODEL, "messages": []}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "frobnicate": 1}, 400, "frobnicate"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10 ** 9}, 400, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "acceptance": "nkl"}, 400, "acceptance"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 0, "acceptance": "nkl",
      "acceptance_options": {"gamma": 1}}, 400, "acceptance_options.gamma"),
]


def test_malformed_requests_get_openai_errors_naming_the_field_and_the_server_stays_healthy(server):
    for body, status, param in MALFORMED:
        got, _, answer = raw(server, "POST", "/v1/chat/completions", json.dumps(body))
        assert (got, answer["error"]["param"]) == (status, param), (body, answer)
        assert answer["error"]["type"] and param.split("[")[0] in answer["error"]["message"]
    got, _, answer = raw(server, "POST", "/v1/chat/completions", "{not json")
    assert got == 400 and answer["error"]["param"] == "body" and "JSON" in answer["error"]["message"]
    got, _, answer = raw(server, "POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": [3, 10 ** 9]}))
    assert (got, answer["error"]["param"]) == (400, "prompt") and "vocabulary" in answer["error"]["message"]
    got, _, answer = raw(server, "POST", "/v1/completions", b"x" * (65 << 20))  # past the 64 MiB limit
    assert got == 413 and answer["error"]["code"] == "body_too_large"
    with pytest.raises(openai.BadRequestError) as e:  # the real client sees the same objects
        client(server).completions.create(model=MODEL, prompt="hi", max_tokens=-1)
    assert e.value.body["param"] == "max_tokens"
    assert raw(server, "GET", "/health")[0] == 200
    assert client(server).completions.create(model=MODEL, prompt="Hello", max_tokens=3).usage.completion_tokens == 3
    free, total = kv_free(server)
    assert free == total


def test_a_client_that_goes_away_frees_its_kv_at_once(server):
    conn = open_stream(server, PROMPTS[2], 2000)
    assert conn.response.readline().startswith(b"data: ")
    free, total = kv_free(server)
    assert free < total  # it is running
    conn.sock.close()  # gone, mid-stream
    conn.close()
    wait_until(lambda: kv_free(server)[0] == total, timeout=30)


def test_token_auth_and_a_full_queue_answer_401_and_429_and_health_is_never_refused(tight):
    assert raw(tight, "GET", "/v1/models")[0] == 401
    with pytest.raises(openai.AuthenticationError):
        client(tight, api_key="wrong").models.list()
    assert raw(tight, "GET", "/health")[0] == 200  # no token needed
    streams = [open_stream(tight, PROMPTS[0], 400) for _ in range(2)]  # one running, one queued
    wait_until(lambda: (status(tight, TOKEN).num_running, status(tight, TOKEN).num_waiting) == (1, 1))
    got, headers, answer = raw(tight, "POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": "hi"}),
                               {"Authorization": f"Bearer {TOKEN}"})
    assert got == 429 and headers["retry-after"] == "1" and answer["error"]["type"] == "rate_limit_error"
    with pytest.raises(openai.RateLimitError):  # the client sees it as a rate limit
        client(tight, api_key=TOKEN).completions.create(model=MODEL, prompt="hi", max_tokens=2)
    with open_channel(tight.address, ChannelOptions(token=TOKEN)) as channel:  # nor is gRPC health refused
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    for conn in streams:
        conn.sock.close()
        conn.close()
    wait_until(lambda: status(tight, TOKEN).num_active_requests == 0, timeout=60)
    assert client(tight, api_key=TOKEN).completions.create(model=MODEL, prompt="hi", max_tokens=2).usage


def open_stream(server: Server, prompt: str, max_tokens: int) -> http.client.HTTPConnection:
    """A streaming completion whose first event has arrived (the request is admitted)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.http, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                                                        "ignore_eos": True, "stream": True}),
                 {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    r = conn.getresponse()
    assert r.status == 200
    conn.response = r
    return conn


def test_thirty_two_clients_over_http_and_grpc_queue_instead_of_failing(server):
    """32 clients (16 HTTP, 16 gRPC) for a few seconds at the default limits: no errors, health answered
    throughout, every KV block back afterwards."""
    errors, done, health_ok = [], [], []
    stop = time.monotonic() + 8

    def http_client():
        c = client(server)
        while time.monotonic() < stop:
            try:
                r = c.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=8, extra_body={"ignore_eos": True})
                done.append(r.usage.completion_tokens)
            except Exception as e:  # noqa: BLE001 - counted, asserted below
                errors.append(repr(e))

    def grpc_client():
        with GenerationClient(server.address) as c:
            while time.monotonic() < stop:
                try:
                    done.append(c.generate(PROMPTS[1], max_new_tokens=8, ignore_eos=True, timeout=120)["usage"]
                                ["completion_tokens"])
                except Exception as e:  # noqa: BLE001
                    errors.append(repr(e))

    def health():
        while time.monotonic() < stop:
            health_ok.append(raw(server, "GET", "/health")[0] == 200)
            time.sleep(0.5)

    threads = [threading.Thread(target=f) for f in [http_client] * 16 + [grpc_client] * 16 + [health]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert errors == [] and len(done) >= 32 and set(done) == {8}
    assert health_ok and all(health_ok)
    wait_until(lambda: kv_free(server)[0] == kv_free(server)[1], timeout=30)
