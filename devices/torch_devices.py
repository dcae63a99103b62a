"""Resolve a device name to a `torch.device`, saying clearly why a device is absent.

Backends register a probe; nothing outside this registry branches on device names.
"""

import importlib
from typing import Callable

import torch


class DeviceUnavailable(RuntimeError):
    """The named device does not exist on this machine (message says why)."""


def _cuda_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _npu_count() -> int:
    # torch-npu is optional and must be imported lazily: without CANN its import fails.
    try:
        importlib.import_module("torch_npu")
    except ImportError as e:
        raise DeviceUnavailable(f"torch-npu is not importable ({e}); install hetspec[npu] on a CANN host")
    return torch.npu.device_count()  # type: ignore[attr-defined]


_PROBES: dict[str, Callable[[], int]] = {"cpu": lambda: 1, "cuda": _cuda_count, "npu": _npu_count}


def resolve_torch_device(name: str) -> torch.device:
    """`cpu`, `cuda`, `cuda:N`, `npu:N` -> torch.device, or DeviceUnavailable naming the reason."""
    kind, _, index = name.partition(":")
    if kind not in _PROBES:
        raise DeviceUnavailable(f"unknown device {name!r}: expected one of {', '.join(_PROBES)} (with :N)")
    if index and not index.isdigit():
        raise DeviceUnavailable(f"bad device index in {name!r}")
    count = _PROBES[kind]()
    i = int(index or 0)
    if i >= count:
        found = f"{count} {kind} device(s)" if count else f"no {kind} device"
        raise DeviceUnavailable(f"device {name!r} is not available: this machine has {found}")
    return torch.device(kind if kind == "cpu" else f"{kind}:{i}")
