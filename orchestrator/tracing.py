"""Tracing: named, timed phases (spans) on a device track, cheap enough to leave on.

Low in the stack on purpose: the engine, drafters and transports record spans here; profiling
runs (`orchestrator.latency`) and the server's metrics read them.

A `Tracer` hands out `span(name, track, ...)` context managers. Each span is timed with the
track's device timer (`devices` backend: perf_counter on the CPU, events on accelerators)
without forcing a sync: accelerator timers are read in `flush()`, once per engine step.
Start times are host `perf_counter_ns` readings, so spans of all tracks share one clock.

Vocabulary, so transports and runners can add their own spans later:
- `name`: the phase (`draft`, `verify`, `d2h`, `serialize`, `wire`, ...; see PHASES);
- `track`: where it ran, e.g. `Track("cpu", "target")`; one trace track per (device, role);
- `step` / `request`: engine step and request (sequence) ids, where they apply;
- `flow_out` / `flow_in`: a flow id (`Tracer.new_flow()`) links a transfer's send span
  (`flow_out=id`) to its receive span(s) (`flow_in=(id, ...)`); the trace draws an arrow.
A disabled tracer (`Tracer(enabled=False)`) records nothing and costs one attribute check.
"""

import time
from dataclasses import dataclass, field
from typing import Callable

from devices import backend_for

# Phases in step order; a run reports only the ones that occurred. `wait`: the engine waiting for the
# drafter's worker after a verify (overlapped drafting).
PHASES = ("schedule", "draft", "d2h", "serialize", "wire", "deserialize", "h2d", "prefill", "verify",
          "wait", "accept", "rollback", "commit", "emit")


def phase_of(name: str, args: dict) -> str:
    """A span's phase: work done ahead, beside the step's other phases (a pre-draft, its round trip),
    is a phase of its own, `NAME_ahead`, which does not add to the step's time."""
    return f"{name}_ahead" if args.get("ahead") else name


def is_ahead(phase: str) -> bool:
    return phase.endswith("_ahead")


@dataclass(frozen=True)
class Track:
    """A timeline: one device (`cpu`, `cuda:0`, `npu:0`) and the role running on it."""

    device: str
    role: str  # "host", "target", "drafter", "transport", ...

    @property
    def label(self) -> str:
        return f"{self.device} {self.role}"


# The engine's timelines; anything recording on them (e.g. a drafter's transfers) uses these.
HOST_TRACK = Track("cpu", "host")


def target_track(device) -> Track:
    return Track(str(device), "target")


def drafter_track(device: str, name: str) -> Track:
    """A drafter's timeline: its device, the role labelled with the drafter's name."""
    return Track(str(device), f"drafter ({name})")


@dataclass
class Span:
    name: str
    track: Track
    start_ns: int  # host perf_counter_ns at start
    dur_ms: float
    step: int | None = None
    request: int | None = None
    flow_out: int | None = None  # flow this span sends
    flow_in: tuple[int, ...] = ()  # flows this span receives
    args: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {"name": self.name, "device": self.track.device, "role": self.track.role,
             "start_ns": self.start_ns, "dur_ms": self.dur_ms}
        for key in ("step", "request", "flow_out"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.flow_in:
            d["flow_in"] = list(self.flow_in)
        if self.args:
            d["args"] = self.args
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Span":
        return cls(d["name"], Track(d["device"], d["role"]), d["start_ns"], d["dur_ms"], d.get("step"),
                   d.get("request"), d.get("flow_out"), tuple(d.get("flow_in", ())), d.get("args", {}))


class _OpenSpan:
    """The context manager `Tracer.span` returns; times its body with the track's timer."""

    __slots__ = ("tracer", "span", "timer")

    def __init__(self, tracer: "Tracer", span: Span, timer):
        self.tracer, self.span, self.timer = tracer, span, timer

    def __enter__(self) -> Span:
        self.span.start_ns = time.perf_counter_ns()
        self.timer.start()
        return self.span

    def __exit__(self, *exc) -> None:
        self.timer.stop(sync=False)
        self.tracer._pending.append(self)


class _NullSpan:
    __slots__ = ()

    def __enter__(self):
        return None

    def __exit__(self, *exc) -> None:
        return None


_NULL_SPAN = _NullSpan()


class Tracer:
    """Collects spans; `flush()` reads pending device timers and hands spans to listeners.

    `listeners` get each span as it is recorded; `flush_listeners` get the list of spans that
    one `flush()` resolved (the engine flushes once per step, so that is one step's spans).
    `keep=False` hands spans to the listeners only (a long-running server's metrics), instead
    of also collecting them in `spans` for a profiling run.
    """

    def __init__(self, enabled: bool = True, keep: bool = True):
        self.enabled = enabled
        self.keep = keep
        self.spans: list[Span] = []
        self.listeners: list[Callable[[Span], None]] = []
        self.flush_listeners: list[Callable[[list[Span]], None]] = []
        self._pending: list[_OpenSpan] = []
        self._backends: dict[str, tuple] = {}
        self._next_flow = 0

    def span(self, name: str, track: Track, step: int | None = None, request: int | None = None,
             flow_out: int | None = None, flow_in: tuple[int, ...] = (), **args):
        """`with tracer.span("verify", track, step=3): ...` times the body on the track's device."""
        if not self.enabled:
            return _NULL_SPAN
        backend, index = self._backend(track.device)
        return _OpenSpan(self, Span(name, track, 0, 0.0, step, request, flow_out, flow_in, args),
                         backend.timer(index))

    def add(self, span: Span) -> None:
        """Record a span timed elsewhere (e.g. a transport that measured its own wire time)."""
        if self.enabled:
            self._emit(span)

    def new_flow(self) -> int:
        self._next_flow += 1
        return self._next_flow

    def flush(self) -> None:
        """Resolve device timers of finished spans (syncs accelerator events, once per step)."""
        pending, self._pending = self._pending, []
        for open_span in pending:
            open_span.span.dur_ms = open_span.timer.elapsed_ms()
            self._emit(open_span.span)
        if pending and self.flush_listeners:
            spans = [open_span.span for open_span in pending]
            for listener in self.flush_listeners:
                listener(spans)

    def clear(self) -> list[Span]:
        """Flush, then hand over and forget the recorded spans."""
        self.flush()
        spans, self.spans = self.spans, []
        return spans

    def _emit(self, span: Span) -> None:
        if self.keep:
            self.spans.append(span)
        for listener in self.listeners:
            listener(span)

    def _backend(self, device: str):
        found = self._backends.get(device)
        if found is None:
            found = self._backends[device] = backend_for(device)
        return found

