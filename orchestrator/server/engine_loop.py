"""One engine on one thread; gRPC handler threads talk to it through an inbox.

Handler threads hand requests to the engine thread; the engine thread admits new requests
and applies cancellations between steps (so a cancelled request's KV blocks are free before
the next step), runs a step over the whole running batch, and routes each request's
committed tokens to its handler's queue. Nothing here knows protobuf.

`hetspec serve` steps the engine on the process's main thread (`own_thread=False`, then `run()`),
where the model was loaded. On a thread of its own a CPU target ran at less than half the speed
(SmolLM2-135M, 16 streams on a 2-core Xeon: 54 against 126 tok/s, same engine stepped from the main
thread): torch's OpenMP runtime (libgomp) gives every thread that runs parallel work a team of its
own, and once the teams hold more threads than the machine has cores it stops spinning between
parallel regions and sleeps, so each of the forward's hundreds of small kernels pays a wake-up.
"""

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from orchestrator.config import SamplingParams
from orchestrator.engine import DrafterStatus, Engine, StepOutput
from orchestrator.server.interceptors import Overloaded

log = logging.getLogger(__name__)


@dataclass
class Done:
    """The last event of a request: its result dict (as `hetspec generate --json`) or an error."""

    result: dict | None = None
    error: Exception | None = None


@dataclass(frozen=True)
class LoopStatus:
    """The engine's state as `GetServerStatus` reports it."""

    kv_blocks_total: int
    kv_blocks_free: int
    num_running: int
    num_waiting: int
    num_steps: int
    drafter: str
    drafter_state: str
    drafter_reconnects: int
    preemptions_swap: int
    preemptions_recompute: int
    max_concurrent_requests: int
    num_active_requests: int


class EngineLoop:
    """Runs `engine.step()` on one thread; everything else talks to it through `call`."""

    def __init__(self, engine: Engine, drafter_kind: str, max_active: int, own_thread: bool = True):
        """`own_thread=False`: the caller runs `run()` itself, on the thread torch has worked on so far
        (the main thread of a server: see the module docstring)."""
        self.engine = engine
        self.drafter_kind = drafter_kind if engine.drafter is not None else "none"
        self.max_active = max_active
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._wake = threading.Event()
        self._outputs: dict = {}  # seq_id -> where its handler's events go (anything with .put)
        self._active = 0  # admitted requests, not yet finished (guarded by _lock)
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = None
        if own_thread:
            self._thread = threading.Thread(target=self.run, name="hetspec-engine", daemon=True)
            self._thread.start()

    @classmethod
    def built_on_own_thread(cls, make: Callable[[], Engine], drafter_kind: str, max_active: int) -> "EngineLoop":
        """The engine made by `make()` and stepped on one thread of the loop's, for a process whose main
        thread must stay free (a Ray actor serves its calls there): torch then works on that thread
        alone. `make`'s error, if any, is raised here."""
        made: Future = Future()

        def body() -> None:
            try:
                loop = cls(make(), drafter_kind, max_active, own_thread=False)
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                made.set_exception(e)
                return
            loop._thread = threading.current_thread()
            made.set_result(loop)
            loop.run()

        threading.Thread(target=body, name="hetspec-engine", daemon=True).start()
        return made.result()

    # ---- called from handler threads -----------------------------------------------------

    def call(self, fn: Callable[[], object]) -> Future:
        """Run fn on the engine thread between steps; its result or exception lands in the Future."""
        future: Future = Future()
        self._inbox.put((fn, future))
        self._wake.set()
        return future

    def submit(self, prompt_ids: list[int], params: SamplingParams, events=None) -> tuple[int, queue.SimpleQueue]:
        """Admit a request (Overloaded past the bound); -> its id and the queue its events arrive on."""
        events = queue.SimpleQueue() if events is None else events
        return self.admit(prompt_ids, params, events).result(), events

    def admit(self, prompt_ids: list[int], params: SamplingParams, events) -> Future:
        """Admit a request whose events go to `events.put` (called on the engine thread); the Future
        gives its id once the engine holds it (or the error: a bad prompt, say). Overloaded past
        `max_active` running or queued requests (the engine queues those past its running batch)."""
        with self._lock:
            if self._active >= self.max_active:
                raise Overloaded(f"the server holds its limit of {self.max_active} running or queued requests; "
                                 f"retry later")
            self._active += 1

        def add() -> int:
            seq_id = self.engine.add_request(prompt_ids, params)
            self._outputs[seq_id] = events
            return seq_id

        def undo(future: Future) -> None:
            if future.cancelled() or future.exception() is not None:
                with self._lock:
                    self._active -= 1

        future = self.call(add)
        future.add_done_callback(undo)
        return future

    def cancel(self, seq_id: int) -> None:
        """Cancel (no-op once finished); the KV blocks are freed before the next step."""
        self.call(lambda: self._drop(seq_id, "cancelled"))

    def status(self) -> "LoopStatus":
        return self.call(self._status).result(timeout=30)

    def stop(self) -> None:
        """Stop stepping (`run()` returns once the step in progress ends)."""
        self._stopped = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    # ---- the engine thread ----------------------------------------------------------------

    def run(self) -> None:
        """Step the engine until `stop()`: on the loop's own thread, or on the caller's (`own_thread=False`)."""
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
            events.put(Done(result=seq.result(self.drafter_kind if seq.k else "none")))

    def _drop(self, seq_id: int, why: str, error: Exception | None = None) -> None:
        if seq_id not in self._outputs:
            return
        self.engine.cancel(seq_id)  # frees its KV blocks now
        self.engine.release(seq_id)
        events = self._forget(seq_id)
        events.put(Done(error=error or RuntimeError(why)))

    def _forget(self, seq_id: int) -> queue.SimpleQueue:
        with self._lock:
            self._active -= 1
        return self._outputs.pop(seq_id)

    def _status(self) -> "LoopStatus":
        e = self.engine
        drafter = e.drafter.status() if e.drafter is not None else DrafterStatus(state="none")
        return LoopStatus(
            kv_blocks_total=e.target.pool.num_blocks, kv_blocks_free=e.target.pool.num_free_blocks,
            num_running=len(e.scheduler.running), num_waiting=len(e.scheduler.waiting), num_steps=e.num_steps,
            drafter=self.drafter_kind, drafter_state=drafter.state, drafter_reconnects=drafter.num_reconnects,
            preemptions_swap=e.num_preemptions_swap, preemptions_recompute=e.num_preemptions_recompute,
            max_concurrent_requests=self.max_active, num_active_requests=self._active)
