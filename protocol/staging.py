"""Pinned staging pool: reusable host buffers for device<->host copies.

Device -> host copies land in page-locked buffers (where the device's backend supports
them) asynchronously, completed by an event; host -> device copies go out of the same
pool. On a machine without an accelerator the same code runs over ordinary host memory,
where the copies are synchronous and the events complete at once.
"""

from collections import defaultdict
from dataclasses import dataclass

import torch

from devices import Event, backend_for


def _size_class(nbytes: int) -> int:
    return 1 << max(12, (nbytes - 1).bit_length())  # powers of two from 4 KiB


@dataclass
class Staged:
    """A host copy of a device tensor, valid after `wait()` and until `release()`."""

    host: torch.Tensor  # view into a pooled buffer, the tensor's dtype and shape
    event: Event
    _buffer: torch.Tensor
    _pool: "StagingPool"

    def wait(self) -> torch.Tensor:
        self.event.synchronize()
        return self.host

    def release(self) -> None:
        self._pool.release(self._buffer)


class StagingPool:
    """Host buffers in power-of-two size classes, reused across transfers, capped at `max_bytes`."""

    def __init__(self, device: "str | torch.device" = "cpu", max_bytes: int = 512 << 20, pinned: bool = True):
        self.backend, self.index = backend_for(device)
        # page-locked only where asked for and where the device's runtime offers it
        self.pinned = pinned and self.backend.pinned_memory_available()
        self.max_bytes = max_bytes
        self._free: dict[int, list[torch.Tensor]] = defaultdict(list)
        self.free_bytes = 0  # bytes held in the free lists
        self.num_allocations = 0
        self.num_reuses = 0

    def acquire(self, nbytes: int) -> torch.Tensor:
        """A uint8 host buffer of at least `nbytes` (page-locked when the device supports it)."""
        size = _size_class(nbytes)
        if self._free[size]:
            self.num_reuses += 1
            self.free_bytes -= size
            return self._free[size].pop()
        self.num_allocations += 1
        return self.backend.empty_host(size, pinned=self.pinned)

    def release(self, buffer: torch.Tensor) -> None:
        """Return a buffer for reuse (dropped when the pool already holds `max_bytes`)."""
        if self.free_bytes + buffer.numel() <= self.max_bytes:
            self._free[buffer.numel()].append(buffer)
            self.free_bytes += buffer.numel()

    def to_host(self, tensor: torch.Tensor) -> Staged:
        """Start copying a device tensor into a staging buffer; `wait()` on the result."""
        nbytes = tensor.numel() * tensor.element_size()
        buffer = self.acquire(nbytes)
        host = buffer[:nbytes].view(tensor.dtype).view(tensor.shape)
        host.copy_(tensor, non_blocking=self.pinned)
        event = self.backend.event(self.index)
        event.record()
        return Staged(host, event, buffer, self)

    def to_device(self, host: torch.Tensor, device: "str | torch.device") -> torch.Tensor:
        """Copy a host tensor to `device` through a staging buffer (asynchronous when pinned)."""
        device = torch.device(device)
        if device.type == "cpu":  # already host memory: the copy is the transfer
            return host.clone()
        nbytes = host.numel() * host.element_size()
        buffer = self.acquire(nbytes)
        staged = buffer[:nbytes].view(host.dtype).view(host.shape)
        staged.copy_(host)
        out = staged.to(device, non_blocking=self.pinned)
        event = self.backend.event(self.index)
        event.record()
        event.synchronize()  # the buffer is reused after this; the copy must be done
        self.release(buffer)
        return out
