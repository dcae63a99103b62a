"""The built-in backends: cpu, cuda (torch.cuda) and npu (torch-npu, imported lazily)."""

import importlib
import os

import torch

from devices.base import DeviceBackend, DeviceInfo, DeviceUnavailable, Event

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


class CpuBackend(DeviceBackend):
    kind = "cpu"

    def count(self) -> int:
        return 1

    def torch_device(self, index: int = 0) -> torch.device:
        return torch.device("cpu")

    def info(self, index: int = 0) -> DeviceInfo:
        total = free = None
        if hasattr(os, "sysconf"):
            page = os.sysconf("SC_PAGE_SIZE")
            total = os.sysconf("SC_PHYS_PAGES") * page
            free = os.sysconf("SC_AVPHYS_PAGES") * page
        return DeviceInfo(name="cpu", kind="cpu", present=True, total_memory=total, free_memory=free,
                          dtypes=_FLOAT_DTYPES, int4=True, pinned_memory=False,
                          extra={"threads": torch.get_num_threads(), "cores": os.cpu_count()})


class _AcceleratorEvent(Event):
    """A torch accelerator event (torch.cuda.Event / torch.npu.Event) with timing enabled."""

    def __init__(self, module):
        super().__init__()
        self._event = module.Event(enable_timing=True)

    def record(self) -> None:
        self._event.record()
        self._t = 0.0

    def synchronize(self) -> None:
        self._event.synchronize()

    def query(self) -> bool:
        return self._event.query()

    def elapsed_ms(self, end: "Event") -> float:
        return self._event.elapsed_time(end._event)  # type: ignore[attr-defined]


class _TorchAcceleratorBackend(DeviceBackend):
    """An accelerator reached through a torch device module (`torch.cuda`, `torch.npu`)."""

    def module(self):
        raise NotImplementedError

    def count(self) -> int:
        return self.module().device_count()

    def info(self, index: int = 0) -> DeviceInfo:
        module = self.module()
        free, total = module.mem_get_info(index)
        return DeviceInfo(name=f"{self.kind}:{index}", kind=self.kind, present=True, total_memory=total,
                          free_memory=free, dtypes=_FLOAT_DTYPES, int4=True, pinned_memory=True,
                          extra={"model": module.get_device_name(index)})

    def pinned_memory_available(self) -> bool:
        return True

    def synchronize(self, index: int = 0) -> None:
        self.module().synchronize(index)

    def event(self, index: int = 0) -> Event:
        with self.module().device(index):
            return _AcceleratorEvent(self.module())


class CudaBackend(_TorchAcceleratorBackend):
    kind = "cuda"

    def module(self):
        return torch.cuda

    def count(self) -> int:
        if not torch.cuda.is_available():
            return 0
        return torch.cuda.device_count()


class NpuBackend(_TorchAcceleratorBackend):
    kind = "npu"

    def module(self):
        # torch-npu is optional and must be imported lazily: without CANN its import fails.
        try:
            importlib.import_module("torch_npu")
        except ImportError as e:
            raise DeviceUnavailable(f"torch-npu is not importable ({e}); install hetspec[npu] on a CANN host")
        return torch.npu  # type: ignore[attr-defined]
