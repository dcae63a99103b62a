"""A Linux CPU latency QoS request held for a server's life (`server.cpu_latency_us`).

An idle CPU halts; waking it for a message costs time, most of all in a VM, where a halted vCPU
exits to the host and must be scheduled back. Writing a latency bound to
`/dev/cpu_dma_latency` and keeping the file open asks the kernel's cpuidle governor for idle states
that wake within it; 0 means idle CPUs poll instead of halting (what tuned's latency-performance
profile and cyclictest do). The request is system-wide and lasts while the file is open; the price is
CPU time (and power) burnt while idle. Needs write access to the device (root, or a udev rule).

Measured on a 2-core EPYC VM (ad hoc echoes, client and server on a core each): at 0, a raw TCP round
trip after 50 ms of idling took 0.14 ms instead of 0.23, a Python gRPC bidi one 0.70 instead of 0.88
(most of gRPC's after-idle cost is in its own threads, not the wake-up); a remote drafter's wire time
on the engine's critical path fell from 0.52 to 0.35 ms a step (bench_overlap's pinned-remote-qos).
"""

import logging
import os
import struct
from pathlib import Path

from orchestrator.errors import HetspecError

log = logging.getLogger(__name__)

DEVICE = "/dev/cpu_dma_latency"


class CpuLatencyRequest:
    """Holds `microseconds` as the CPU latency bound until `close()` (or the process ends)."""

    def __init__(self, microseconds: int, device: str = DEVICE):
        if microseconds < 0:
            raise HetspecError(f"--cpu-latency-us / server.cpu_latency_us must be >= 0, got {microseconds}")
        self.microseconds, self.device = microseconds, device
        try:
            self._fd: int | None = os.open(device, os.O_WRONLY)
        except OSError as e:
            raise HetspecError(f"--cpu-latency-us / server.cpu_latency_us: cannot open {device} ({e.strerror}); it needs write "
                               "access to the CPU latency QoS device (root or a udev rule), on Linux; "
                               "or leave the setting out") from None
        try:
            os.write(self._fd, struct.pack("i", microseconds))
        except OSError as e:
            self.close()
            raise HetspecError(f"--cpu-latency-us / server.cpu_latency_us: {device} refused {microseconds} ({e.strerror})") from None
        log.info("holding a CPU latency request of %d us (%s)", microseconds, device)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "CpuLatencyRequest":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def current_cpu_latency_us(device: str = DEVICE) -> int | None:
    """The bound the kernel applies now (the tightest request held), or None where it cannot be read."""
    try:
        data = Path(device).read_bytes()[:4]
    except OSError:
        return None
    return struct.unpack("i", data)[0] if len(data) == 4 else None
