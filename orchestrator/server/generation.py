"""`hetspec.v1.Generation`: one engine on its own thread, gRPC handler threads around it.

Handler threads parse and validate a request, tokenize it, and hand it to the engine thread
through an inbox; the engine thread admits new requests and applies cancellations between
steps (so a cancelled request's KV blocks are free before the next step), runs a step over
the whole running batch, and routes each request's committed tokens to its handler's queue.
"""

import logging
import math
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass

import grpc

from orchestrator.config import SamplingParams
from orchestrator.engine import Engine, StepOutput
from orchestrator.errors import InvalidRequestError
from orchestrator.server.grpc_util import Overloaded, lenient
from orchestrator.build import encode_prompt
from protocol.pb import generation_pb2 as pb

log = logging.getLogger(__name__)

SERVICE = "hetspec.v1.Generation"
DEFAULT_MAX_NEW_TOKENS = 128


@dataclass
class _Done:
    """The last event of a request: its result dict (as `hetspec generate --json`) or an error."""

    result: dict | None = None
    error: Exception | None = None


class EngineLoop:
    """Runs `engine.step()` on one thread; everything else talks to it through `call`."""

    def __init__(self, engine: Engine, drafter_kind: str, max_active: int):
        self.engine = engine
        self.drafter_kind = drafter_kind
        self.max_active = max_active
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._outputs: dict[int, queue.SimpleQueue] = {}  # seq_id -> events for its handler
        self._active = 0  # admitted requests, not yet finished (guarded by _lock)
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="hetspec-engine", daemon=True)
        self._thread.start()

    # ---- called from handler threads -----------------------------------------------------

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread between steps; its result or exception lands in the Future."""
        future: Future = Future()
        self._inbox.put((fn, future))
        self._wake.set()
        return future

    def submit(self, prompt_ids: list[int], params: SamplingParams) -> tuple[int, queue.SimpleQueue]:
        with self._lock:
            if self._active >= self.max_active:
                raise Overloaded(f"the server is at its limit of {self.max_active} concurrent requests; retry later")
            self._active += 1
        events: queue.SimpleQueue = queue.SimpleQueue()

        def add() -> int:
            seq_id = self.engine.add_request(prompt_ids, params)
            self._outputs[seq_id] = events
            return seq_id

        try:
            return self.call(add).result(), events
        except BaseException:
            with self._lock:
                self._active -= 1
            raise

    def cancel(self, seq_id: int) -> None:
        """Cancel (no-op once finished); the KV blocks are freed before the next step."""
        self.call(lambda: self._drop(seq_id, "cancelled"))

    def status(self) -> pb.ServerStatus:
        return self.call(self._status).result(timeout=30)

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)

    # ---- the engine thread ----------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopped:
            self._drain_inbox()
            if not self.engine.has_work():
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            try:
                outputs = self.engine.step()
            except Exception as e:  # a bug: fail the requests in the batch, keep serving
                log.exception("engine step failed; failing the running requests")
                for seq_id in list(self._outputs):
                    self._drop(seq_id, "error", e)
                continue
            for out in outputs:
                self._route(out)

    def _drain_inbox(self) -> None:
        while True:
            try:
                fn, future = self._inbox.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except Exception as e:
                future.set_exception(e)

    def _route(self, out: StepOutput) -> None:
        events = self._outputs.get(out.seq_id)
        if events is None:
            return
        events.put(out)
        if out.finished:
            seq = self.engine.release(out.seq_id)
            self._forget(out.seq_id)
            events.put(_Done(result=seq.result(self.drafter_kind if seq.k else "none")))

    def _drop(self, seq_id: int, why: str, error: Exception | None = None) -> None:
        if seq_id not in self._outputs:
            return
        self.engine.cancel(seq_id)  # frees its KV blocks now
        self.engine.release(seq_id)
        events = self._forget(seq_id)
        events.put(_Done(error=error or RuntimeError(why)))

    def _forget(self, seq_id: int) -> queue.SimpleQueue:
        with self._lock:
            self._active -= 1
        return self._outputs.pop(seq_id)

    def _status(self) -> pb.ServerStatus:
        e = self.engine
        drafter = e.drafter
        state = "none" if drafter is None else getattr(drafter, "state", "in-process")
        return pb.ServerStatus(
            kv_blocks_total=e.target.pool.num_blocks, kv_blocks_free=e.target.pool.num_free_blocks,
            num_running=len(e.scheduler.running), num_waiting=len(e.scheduler.waiting), num_steps=e.num_steps,
            drafter=self.drafter_kind if drafter is not None else "none", drafter_state=state,
            drafter_reconnects=getattr(drafter, "num_reconnects", 0),
            preemptions_swap=e.num_preemptions_swap, preemptions_recompute=e.num_preemptions_recompute,
            max_concurrent_requests=self.max_active, num_active_requests=self._active)


class GenerationServicer:
    """Validates requests at the edge, streams each step's tokens and text, then usage and stats."""

    def __init__(self, loop: EngineLoop, tokenizer, max_new_tokens_limit: int):
        self.loop = loop
        self.tokenizer = tokenizer
        self.max_new_tokens_limit = max_new_tokens_limit

    def register(self, server: grpc.Server) -> str:
        handlers = {
            "Generate": grpc.unary_stream_rpc_method_handler(
                self.Generate, request_deserializer=lenient(pb.GenerateRequest),
                response_serializer=pb.GenerateResponse.SerializeToString),
            "GetServerStatus": grpc.unary_unary_rpc_method_handler(
                self.GetServerStatus, request_deserializer=lenient(pb.ServerStatusRequest),
                response_serializer=pb.ServerStatus.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        return SERVICE

    def Generate(self, request: pb.GenerateRequest, context: grpc.ServicerContext) -> Iterator[pb.GenerateResponse]:
        params = sampling_params(request, self.max_new_tokens_limit)
        prompt_ids = self._prompt_ids(request)
        seq_id, events = self.loop.submit(prompt_ids, params)
        # runs when the call ends for any reason: a client cancel or an expired deadline frees the KV
        if not context.add_callback(lambda: self.loop.cancel(seq_id)):
            self.loop.cancel(seq_id)  # it ended already
            return
        while True:
            event = events.get()
            if isinstance(event, _Done):
                if event.error is not None:
                    if not context.is_active():
                        return
                    raise event.error
                yield pb.GenerateResponse(final=_final(event.result))
                return
            if event.token_ids or event.text:
                yield pb.GenerateResponse(token_ids=event.token_ids, text=event.text)

    def GetServerStatus(self, request, context) -> pb.ServerStatus:
        return self.loop.status()

    def _prompt_ids(self, request: pb.GenerateRequest) -> list[int]:
        which = request.WhichOneof("input")
        if which == "token_ids":
            ids = list(request.token_ids.ids)
            if not ids:
                raise InvalidRequestError("token_ids: is empty")
            return ids  # range-checked against the vocabulary by the engine
        if which is None or not request.prompt.strip():
            raise InvalidRequestError("prompt: is empty (send `prompt` text or `token_ids`)")
        return encode_prompt(self.tokenizer, request.prompt, chat=not request.raw)


def sampling_params(request: pb.GenerateRequest, max_new_tokens_limit: int) -> SamplingParams:
    """The request's parameters, each checked with an error naming its field."""
    max_new = request.max_new_tokens if request.HasField("max_new_tokens") else min(DEFAULT_MAX_NEW_TOKENS, max_new_tokens_limit)
    if not 1 <= max_new <= max_new_tokens_limit:
        raise InvalidRequestError(f"max_new_tokens: must be in [1, {max_new_tokens_limit}] on this server, got {max_new}")
    temperature = request.temperature if request.HasField("temperature") else 0.0
    if not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidRequestError(f"temperature: must be a finite number >= 0, got {temperature}")
    top_p = request.top_p if request.HasField("top_p") else 1.0
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise InvalidRequestError(f"top_p: must be in (0, 1], got {top_p}")
    for i, s in enumerate(request.stop):
        if not s:
            raise InvalidRequestError(f"stop[{i}]: must be non-empty")
    if len(request.stop) > 16 or any(len(s) > 256 for s in request.stop):
        raise InvalidRequestError("stop: at most 16 strings of at most 256 characters")
    k = request.num_speculative_tokens if request.HasField("num_speculative_tokens") else None
    if k is not None and k > 32:
        raise InvalidRequestError(f"num_speculative_tokens: must be in [0, 32], got {k}")
    params = SamplingParams(max_new_tokens=max_new, temperature=temperature, top_k=request.top_k, top_p=top_p,
                            seed=request.seed if request.HasField("seed") else None, stop=tuple(request.stop),
                            ignore_eos=request.ignore_eos,
                            speculate=request.speculate if request.HasField("speculate") else True,
                            num_speculative_tokens=k)
    params.validate(max_new_tokens_limit)
    return params


def _final(result: dict) -> pb.Final:
    s = result["stats"]
    fields = {f.name for f in pb.SpeculationStats.DESCRIPTOR.fields}
    return pb.Final(finish_reason=result["finish_reason"] or "",
                    usage=pb.Usage(**result["usage"]),
                    stats=pb.SpeculationStats(**{k: v for k, v in s.items() if k in fields}))


def result_from_final(token_ids: list[int], text: str, final: pb.Final) -> dict:
    """The client's side of `_final`: the same JSON shape as `hetspec generate --json`."""
    from google.protobuf.json_format import MessageToDict

    stats = MessageToDict(final.stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    for name in ("num_steps", "num_drafted", "num_accepted", "k", "num_fallback_steps", "num_preemptions"):
        stats[name] = int(stats.get(name, 0))
    stats["drafted_per_position"] = [int(x) for x in stats.get("drafted_per_position", [])]
    return {
        "text": text,
        "token_ids": token_ids,
        "finish_reason": final.finish_reason or None,
        "usage": {"prompt_tokens": final.usage.prompt_tokens, "completion_tokens": final.usage.completion_tokens},
        "stats": stats,
    }
