"""The OpenAI-compatible HTTP front door: the same engine loop as gRPC, behind FastAPI and uvicorn.

    POST /v1/chat/completions, POST /v1/completions   (stream: server-sent events)
    GET  /v1/models, GET /health, GET /metrics

Errors are OpenAI error objects naming the parameter (`{"error": {"message", "type", "param",
"code"}}`): 400 for a bad request, 401 without the bearer token, 404 for an unknown model, 413 for a
body over the limit, 429 (with `Retry-After`) only past the queue bound. Each response carries the
request's speculation statistics and output token ids in an extra `hetspec` field. A client that
goes away (or a stream it stops reading) cancels its request: the KV blocks are free before the
next engine step.
"""

import asyncio
import hmac
import json
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from orchestrator.errors import HetspecError, InvalidRequestError
from orchestrator.models import encode_messages, encode_prompt
from orchestrator.server.engine_loop import Done, EngineLoop
from orchestrator.server.interceptors import Overloaded
from orchestrator.server.openai_schema import ChatCompletionRequest, CompletionRequest

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions; chat defaults to the server's limit
DISCONNECT_POLL_S = 0.5  # a non-streaming request checks this often whether its client is still there


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.param, self.code, self.kind = status, param, code, kind

    def body(self) -> dict:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


def _api_error(e: BaseException) -> ApiError:
    """The one mapping from hetspec's exceptions to HTTP; never a traceback."""
    if isinstance(e, ApiError):
        return e
    if isinstance(e, InvalidRequestError):
        return ApiError(400, str(e), e.field)
    if isinstance(e, Overloaded):
        return ApiError(429, str(e), code="queue_full", kind="rate_limit_error")
    if isinstance(e, HetspecError):
        return ApiError(400, str(e))
    return ApiError(500, "internal error (the server log has the details)", kind="server_error")


def _error_response(e: ApiError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.status == 429 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


def _param(loc: tuple) -> str | None:
    """pydantic's location ('body', 'messages', 0, 'content') -> 'messages[0].content'."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not any(c in part for c in "[(") and part not in _TYPE_TAGS:  # not a union member's tag
            out += f".{part}" if out else str(part)
    return out or None


_TYPE_TAGS = {"str", "int", "float", "bool", "none", "TextPart"}


class _AsyncEvents:
    """The engine thread's events for one request, delivered into this event loop."""

    def __init__(self):
        self._loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item) -> None:  # called on the engine thread
        self._loop.call_soon_threadsafe(self.queue.put_nowait, item)


def build_app(loop: EngineLoop, tokenizer, model_name: str, max_new_tokens_limit: int,
              token: str | None = None, registry: CollectorRegistry | None = None,
              max_body_bytes: int = 8 << 20) -> FastAPI:
    app = FastAPI(title="hetspec", docs_url=None, redoc_url=None, openapi_url=None)
    expected = f"Bearer {token}".encode() if token else None
    created = int(time.time())

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if request.url.path != "/health" and expected is not None:
            got = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return _error_response(ApiError(401, "missing or wrong bearer token", code="invalid_api_key",
                                                kind="authentication_error"))
        length = request.headers.get("content-length")
        if request.method == "POST" and length is None:
            return _error_response(ApiError(411, "a Content-Length header is required", code="length_required"))
        if length is not None and (not length.isdigit() or int(length) > max_body_bytes):
            return _error_response(ApiError(413, f"request body over the limit of {max_body_bytes} bytes",
                                            code="body_too_large"))
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        err = exc.errors()[0]
        if err.get("type") == "json_invalid":
            return _error_response(ApiError(400, f"body: not valid JSON ({err.get('msg')})", "body"))
        param = _param(tuple(err.get("loc", ())))
        msg = err.get("msg", "invalid").removeprefix("Value error, ")
        if err.get("type") == "extra_forbidden":
            msg = "unknown parameter (not part of the API hetspec serves)"
        return _error_response(ApiError(400, f"{param or 'body'}: {msg}", param))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return _error_response(exc)

    @app.exception_handler(HetspecError)  # a bad request or a full queue: no traceback in the log
    async def refused(request: Request, exc: HetspecError):
        return _error_response(_api_error(exc))

    @app.exception_handler(Exception)  # a bug: one line to the client, the traceback to the log
    async def anything(request: Request, exc: Exception):
        return _error_response(_api_error(exc))

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "hetspec"}]}

    @app.get("/metrics")
    async def metrics():
        if registry is None:
            raise ApiError(404, "metrics are off on this server")
        return PlainTextResponse(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    def check_model(name: str) -> None:
        if name != model_name:
            raise ApiError(404, f"model: {name!r} is not served here (this server serves {model_name!r})",
                           "model", code="model_not_found")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        check_model(body.model)
        prompt = body.prompt_input()
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ApiError(400, "prompt: is empty", "prompt")
            ids = encode_prompt(tokenizer, prompt, chat=False)
        else:
            if not prompt:
                raise ApiError(400, "prompt: is empty", "prompt")
            ids = prompt  # range-checked against the vocabulary by the engine
        params = body.sampling_params(body.max_tokens, DEFAULT_MAX_TOKENS, max_new_tokens_limit)
        return await _respond(request, body, ids, params, chat=False)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request):
        check_model(body.model)
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "messages: this model has no chat template; use /v1/completions", "messages")
        try:
            ids = encode_messages(tokenizer, [m.as_template_message() for m in body.messages])
        except Exception as e:  # the template refuses a role order it does not support
            raise ApiError(400, f"messages: the chat template refused them ({e})", "messages") from None
        limit, name = body.limit()
        params = body.sampling_params(limit, max_new_tokens_limit, max_new_tokens_limit, name)
        return await _respond(request, body, ids, params, chat=True)

    async def _respond(request: Request, body, ids: list[int], params, chat: bool):
        events = _AsyncEvents()
        seq_id = await asyncio.wrap_future(loop.admit(ids, params, events))
        meta = _Meta(f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time()), model_name, chat)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_stream(loop, seq_id, events, meta, include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            while True:
                try:
                    event = await asyncio.wait_for(events.queue.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        return None  # nobody to answer; `finally` frees the KV
                    continue
                if isinstance(event, Done):
                    if event.error is not None:
                        raise event.error
                    return meta.full(event.result)
        finally:  # the client went away (the handler is cancelled) or anything failed: free the KV now
            loop.cancel(seq_id)

    return app


@dataclass
class _Meta:
    id: str
    created: int
    model: str
    chat: bool

    def head(self, chunk: bool) -> dict:
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def full(self, result: dict) -> dict:
        choice = {"index": 0, "finish_reason": _finish(result["finish_reason"]), "logprobs": None}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result["text"]}
        else:
            choice["text"] = result["text"]
        return {**self.head(False), "choices": [choice], "usage": _usage(result), "hetspec": _extra(result)}

    def chunk(self, text: str | None, finish: str | None = None, role: bool = False) -> dict:
        choice = {"index": 0, "finish_reason": finish, "logprobs": None}
        if self.chat:
            choice["delta"] = ({"role": "assistant"} if role else {}) | ({"content": text} if text is not None else {})
        else:
            choice["text"] = text or ""
        return {**self.head(True), "choices": [choice]}


def _finish(reason: str | None) -> str | None:
    return "stop" if reason == "eos" else reason


def _usage(result: dict) -> dict:
    u = result["usage"]
    return {**u, "total_tokens": u["prompt_tokens"] + u["completion_tokens"]}


def _extra(result: dict) -> dict:
    return {"token_ids": result["token_ids"], "stats": result["stats"]}


def _sse(obj: dict | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


async def _stream(loop: EngineLoop, seq_id: int, events: _AsyncEvents, meta: _Meta,
                  include_usage: bool) -> AsyncIterator[bytes]:
    try:
        if meta.chat:
            yield _sse(meta.chunk("", role=True))
        while True:
            event = await events.queue.get()
            if isinstance(event, Done):
                if event.error is not None:  # headers are gone: the error is the stream's last event
                    yield _sse(_api_error(event.error).body())
                    yield _sse("[DONE]")
                    return
                last = meta.chunk(None if meta.chat else "", _finish(event.result["finish_reason"]))
                last["hetspec"] = _extra(event.result)
                yield _sse(last)
                if include_usage:
                    yield _sse({**meta.head(True), "choices": [], "usage": _usage(event.result)})
                yield _sse("[DONE]")
                return
            if event.text:
                yield _sse(meta.chunk(event.text))
    finally:  # the client disconnected mid-stream (this generator is closed) or it ended: free the KV
        loop.cancel(seq_id)


@dataclass
class HttpServed:
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    def stop(self, timeout: float = 10.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=timeout)


def start_http(app: FastAPI, host: str, port: int) -> HttpServed:
    """Serve `app` on host:port (0 = any free port) from a background thread."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise HetspecError(f"cannot serve HTTP on {host}:{port}: {e}") from None
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5,
                            limit_concurrency=None, backlog=2048)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="hetspec-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        raise HetspecError(f"HTTP server on {host}:{port} did not start")
    return HttpServed(server, thread, sock.getsockname()[1])
