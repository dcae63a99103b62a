"""The backend registry: the only place that maps a device name to code."""

import torch

from devices.backends import CpuBackend, CudaBackend, NpuBackend
from devices.base import DeviceBackend, DeviceUnavailable

_BACKENDS: dict[str, DeviceBackend] = {}


def register_backend(backend: DeviceBackend) -> None:
    _BACKENDS[backend.kind] = backend


for _b in (CpuBackend(), CudaBackend(), NpuBackend()):
    register_backend(_b)


def backend_kinds() -> list[str]:
    return list(_BACKENDS)


def parse_device(name: str) -> tuple[DeviceBackend, int]:
    """`cpu`, `cuda`, `cuda:N`, `npu:N` -> (backend, index), without probing the hardware."""
    kind, _, index = str(name).partition(":")
    if kind not in _BACKENDS:
        raise DeviceUnavailable(f"unknown device {name!r}: expected one of {', '.join(_BACKENDS)} (with :N)")
    if index and not index.isdigit():
        raise DeviceUnavailable(f"bad device index in {name!r}")
    return _BACKENDS[kind], int(index or 0)


def backend_for(device: "str | torch.device") -> tuple[DeviceBackend, int]:
    """The backend and index that own `device` (a name or a torch.device)."""
    if isinstance(device, torch.device):
        return _BACKENDS[device.type], device.index or 0
    return parse_device(device)


def resolve_torch_device(name: str) -> torch.device:
    """`cpu`, `cuda`, `cuda:N`, `npu:N` -> torch.device, or DeviceUnavailable naming the reason."""
    backend, index = parse_device(name)
    count = backend.count()
    if index >= count:
        found = f"{count} {backend.kind} device(s)" if count else f"no {backend.kind} device"
        raise DeviceUnavailable(f"device {name!r} is not available: this machine has {found}")
    return backend.torch_device(index)
