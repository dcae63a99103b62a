"""Device abstraction: cpu, cuda (torch.cuda) and npu (torch-npu, imported lazily) behind one
interface and a registry, plus ONNX Runtime execution providers per device kind.

    backend, index = parse_device("npu:0")     # no probing; DeviceUnavailable for a bad name
    device_unavailable_reason("cuda:0")        # '' when present here, else why not
    ort_placement("npu:0")                     # CANNExecutionProvider, {device_id: 0}, memory "cann"
    backend.event(index), backend.empty_host(n)   # device-clock timing, pinned host memory

Callers never branch on device names: they ask the registry.
"""

from devices.base import DeviceBackend, DeviceInfo, DeviceUnavailable, Event, Timer
from devices.ort import OrtPlacement, available_ort_providers, ort_placement, ort_unavailable_reason
from devices.probe import device_info, device_unavailable_reason, list_devices
from devices.registry import backend_for, backend_kinds, parse_device, register_backend, resolve_torch_device

__all__ = ["DeviceBackend", "DeviceInfo", "DeviceUnavailable", "Event", "OrtPlacement", "Timer",
           "available_ort_providers", "backend_for", "backend_kinds", "device_info", "device_unavailable_reason",
           "list_devices", "ort_placement", "ort_unavailable_reason", "parse_device", "register_backend",
           "resolve_torch_device"]
