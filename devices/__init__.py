"""Device abstraction: resolve names like `cpu`, `cuda:0`, `npu:0` into torch devices."""

from devices.torch_devices import DeviceUnavailable, resolve_torch_device

__all__ = ["DeviceUnavailable", "resolve_torch_device"]
