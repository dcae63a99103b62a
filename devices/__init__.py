"""Device abstraction: backends for cpu, cuda and npu behind one interface and a registry."""

from devices.base import DeviceBackend, DeviceInfo, DeviceUnavailable, Event, Timer
from devices.registry import backend_for, backend_kinds, parse_device, register_backend, resolve_torch_device

__all__ = ["DeviceBackend", "DeviceInfo", "DeviceUnavailable", "Event", "Timer", "backend_for",
           "backend_kinds", "parse_device", "register_backend", "resolve_torch_device"]
