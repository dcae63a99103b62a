"""The connection half of a remote drafter: channel, session, probe, backoff and, with a resolver,
where to connect at all.

A new session is used only once the drafter has answered a probe, and reconnects back off
exponentially. With `resolve` (a drafter pool such as `orchestrator.cluster`) the address is not
fixed: each new attempt asks `resolve()` for one (None: no drafter is up, stay target-only) and
moves the channel there, so a drafter replaced on another host, or another member of the pool,
takes over; a channel not ready within `timeout_s` is given up and the pool asked again.
"""

import itertools
import logging
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import grpc

from orchestrator.server.channels import ChannelOptions, call_metadata, open_channel
from orchestrator.server.remote_session import Probe, Session
from protocol.pb import drafter_pb2_grpc

log = logging.getLogger(__name__)


class SessionLink:
    """Keeps one `hetspec.v1.Drafter` session open; the drafter built on it says what `_fail` drops."""

    def __init__(self, address: str | None, channel_options: ChannelOptions | None, timeout_s: float,
                 backoff_s: tuple[float, float], resolve: Callable[[], str | None] | None):
        self.address = address or ""
        self.resolve = resolve
        self.timeout_s = timeout_s
        self.backoff_s = backoff_s
        self._channel_options = channel_options
        self._metadata = call_metadata(channel_options)
        self._channel: grpc.Channel | None = None
        self._ids = itertools.count(1)
        self._session: Session | None = None
        self._probe: Probe | None = None  # a new session until the drafter has answered its probe
        self._ready: grpc.Future | None = None
        self._ready_deadline = 0.0  # a channel not ready by then is given up (and re-resolved)
        self._next_attempt = 0.0
        self._backoff = backoff_s[0]
        self._ever_connected = False
        self.num_reconnects = 0
        self._asker: ThreadPoolExecutor | None = None  # asks the pool (`resolve`) off the engine thread
        self._resolving: Future | None = None

    def _fail(self, e: Exception) -> None:
        raise NotImplementedError

    def _drop_sessions(self) -> None:
        if self._session is not None:
            self._session.close()
        if self._probe is not None:
            self._probe.session.close()
        self._session = self._probe = None

    def _maybe_reconnect(self) -> None:
        """Never blocks: a ready-future keeps the channel connecting between steps, and a new
        session's probe is answered in the background."""
        if self._probe is not None:
            self._take_probe()
            return
        now = time.monotonic()
        if now < self._next_attempt:
            return
        if self._ready is not None and not self._ready.done() and now > self._ready_deadline and self.resolve:
            self._ready.cancel()  # the address may be gone for good: ask the pool again
            self._ready = None
        if self._ready is None:
            if self.resolve is not None and not self._resolve():
                return
            self._ready = grpc.channel_ready_future(self._channel)
            self._ready_deadline = now + self.timeout_s
        if not self._ready.done():
            return
        self._ready = None
        self._open_session()

    def _resolve(self, wait: bool = False) -> bool:
        """Ask the pool for an address and move the channel there; False if it has none (yet).

        The pool is asked on a worker thread (it may take a second to hear from its members), so
        engine steps go on target-only meanwhile; `wait` asks on this thread (start-up)."""
        if wait:
            answer = self._ask_pool()
        else:
            if self._resolving is None:
                self._resolving = self._pool_thread().submit(self._ask_pool)
            if not self._resolving.done():
                return False
            answer, self._resolving = self._resolving.result(), None
        if not answer:
            self._next_attempt = time.monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, self.backoff_s[1])
            return False
        if answer != self.address or self._channel is None:
            if self._channel is not None:
                self._channel.close()
            log.warning("drafter pool: sessions go to %s", answer)
            self._connect(answer)
        return True

    def _ask_pool(self) -> str | None:
        try:
            return self.resolve()
        except Exception as e:  # the pool itself is unreachable: as good as no drafter
            log.warning("drafter pool: %s", e)
            return None

    def _pool_thread(self) -> ThreadPoolExecutor:
        if self._asker is None:
            self._asker = ThreadPoolExecutor(1, thread_name_prefix="hetspec-drafter-pool")
        return self._asker

    def _connect(self, address: str) -> None:
        self.address = address
        # gRPC's own reconnect backoff for the TCP/HTTP2 connection; ours gates new sessions
        self._channel = open_channel(address, self._channel_options, extra=[
            ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 2000)])
        self._stub = drafter_pb2_grpc.DrafterStub(self._channel)

    def _open_session(self) -> None:
        self._probe = Probe(Session(self._stub, self._metadata), next(self._ids), self.timeout_s)

    def _take_probe(self) -> None:
        """Use the new session once its probe is answered (or fail it)."""
        probe = self._probe
        if not probe.done.is_set():
            return
        if probe.error is not None:
            self._fail(probe.error)
            return
        self._probe, self._session = None, probe.session
        if self._ever_connected:
            self.num_reconnects += 1
            log.warning("drafter at %s: session re-established; speculation resumes", self.address)
        self._ever_connected = True

