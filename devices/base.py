"""The device interface: what every backend reports and offers.

A backend is one kind of device (`cpu`, `cuda`, `npu`, ...). It reports presence and
capabilities, allocates host staging memory (page-locked where the runtime supports it),
synchronizes, and times work with the device's own clock (events on accelerators,
perf_counter on the CPU). Callers never branch on device names: they ask the registry.
"""

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch


class DeviceUnavailable(RuntimeError):
    """The named device does not exist on this machine (message says why)."""


@dataclass(frozen=True)
class DeviceInfo:
    """One device as this machine sees it (a row of `hetspec devices`)."""

    name: str  # "cpu", "cuda:0", "npu:1"
    kind: str
    present: bool
    reason: str = ""  # why it is absent, or "" when present
    total_memory: int | None = None  # bytes
    free_memory: int | None = None  # bytes
    dtypes: tuple[str, ...] = ()
    int4: bool = False  # runs INT4 weight-only matmuls (MatMulNBits or torch int4 kernels)
    pinned_memory: bool = False
    extra: dict = field(default_factory=dict)


class Event:
    """A point in a device's stream of work; CPU events are taken when recorded."""

    def __init__(self):
        self._t: float | None = None

    def record(self) -> None:
        self._t = time.perf_counter()

    def synchronize(self) -> None:
        """Block until the work before `record()` is done (immediate on the CPU)."""

    def query(self) -> bool:
        return self._t is not None

    def elapsed_ms(self, end: "Event") -> float:
        """Milliseconds from this event to `end` (both recorded and synchronized)."""
        if self._t is None or end._t is None:
            raise RuntimeError("elapsed_ms needs both events recorded")
        return (end._t - self._t) * 1e3


class Timer:
    """start()/stop() around device work; `stop()` returns elapsed milliseconds.

    On accelerators the result needs a sync; `stop(sync=False)` returns None and the
    caller reads `elapsed_ms()` later, so timing never forces a stall in the hot loop.
    """

    def __init__(self, backend: "DeviceBackend", index: int = 0):
        self._start = backend.event(index)
        self._end = backend.event(index)

    def start(self) -> "Timer":
        self._start.record()
        return self

    def stop(self, sync: bool = True) -> float | None:
        self._end.record()
        if not sync:
            return None
        return self.elapsed_ms()

    def elapsed_ms(self) -> float:
        self._end.synchronize()
        return self._start.elapsed_ms(self._end)


class DeviceBackend(ABC):
    """One kind of device. Subclasses set `kind` and implement `count`."""

    kind: str = ""

    @abstractmethod
    def count(self) -> int:
        """Number of devices of this kind; raises DeviceUnavailable naming why the runtime is absent."""

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device(f"{self.kind}:{index}")

    def info(self, index: int = 0) -> DeviceInfo:
        return DeviceInfo(name=f"{self.kind}:{index}", kind=self.kind, present=True)

    def pinned_memory_available(self) -> bool:
        return False

    def empty_host(self, nbytes: int, pinned: bool = True) -> torch.Tensor:
        """A uint8 host buffer for staging to/from this device (page-locked when asked and supported)."""
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned and self.pinned_memory_available())

    def synchronize(self, index: int = 0) -> None:
        """Wait for all queued work on the device (a no-op where work is synchronous)."""

    def event(self, index: int = 0) -> Event:
        return Event()

    def timer(self, index: int = 0) -> Timer:
        return Timer(self, index)
