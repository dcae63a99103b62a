"""Callables from any thread run in order on one thread: the one that calls `run()`.

A server that loaded its model on the main thread runs the model there too (`hetspec drafter serve`:
gRPC handler threads hand their drafter calls over). torch's OpenMP runtime gives every thread that
runs parallel work a team of its own, and once the teams hold more threads than the machine has cores
it stops spinning between parallel regions: SmolLM2-135M as a torch drafter on a 2-core Xeon took 271 ms
per 4-token draft on the thread that loaded it and 398-416 ms on another (see engine_loop.py for the
target's side of the same effect).
"""

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

T = TypeVar("T")


class OneThread:
    """`call(fn)` from any thread runs fn on the thread in `run()` and returns its result (or raises its
    error); calls made before `run()` starts wait for it. After `stop()`, calls run on the calling
    thread, one at a time (late clean-ups at shutdown are not lost)."""

    def __init__(self, hand_over: bool = True):
        """`hand_over=False`: never hands a call over; every call runs on its caller's thread, one at a
        time (as after `stop()`)."""
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # one call at a time
        self._state = threading.Lock()  # guards _stopped and the hand-over
        self._owner: threading.Thread | None = None
        self._stopped = not hand_over

    def call(self, fn: Callable[[], T]) -> T:
        with self._state:
            handed = not self._stopped and threading.current_thread() is not self._owner
            if handed:
                future: Future = Future()
                self._inbox.put((fn, future))
        if not handed:
            with self._lock:
                return fn()
        return future.result()

    def run(self) -> None:
        """Run the calls handed over until `stop()`, and those handed over before it took effect."""
        self._owner = threading.current_thread()
        while True:
            try:  # once stopped, only what was handed over before is left to run
                item = self._inbox.get_nowait() if self._stopped else self._inbox.get()
            except queue.Empty:
                return
            if item is None:
                with self._state:  # no call is handed over from now on
                    self._stopped = True
                continue
            fn, future = item
            try:
                with self._lock:
                    result = fn()
            except BaseException as e:  # noqa: BLE001 - the caller raises it
                future.set_exception(e)
            else:
                future.set_result(result)

    def stop(self) -> None:
        self._inbox.put(None)
