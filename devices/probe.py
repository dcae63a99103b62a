"""Is a device present here, and what does this machine have? (`hetspec devices`, profile checks)."""

import importlib.util
from dataclasses import asdict

from devices.base import DeviceUnavailable
from devices.ort import available_ort_providers
from devices.registry import backend_kinds, parse_device


def device_unavailable_reason(name: str) -> str:
    """'' when the torch device `name` exists on this machine, else why it does not."""
    try:
        backend, index = parse_device(name)
        count = backend.count()
    except DeviceUnavailable as e:
        return str(e)
    except Exception as e:  # a broken runtime (driver mismatch, CANN half installed) is an absence too
        return f"{name}: the {name.partition(':')[0]} runtime failed to initialise ({type(e).__name__}: {e})"
    if index < count:
        return ""
    found = f"only {count} {backend.kind} device(s)" if count else f"no {backend.kind} device"
    return f"{name} is not present: this machine has {found}"


def device_info(name: str):
    """The `DeviceInfo` of a present device, or None."""
    if device_unavailable_reason(name):
        return None
    backend, index = parse_device(name)
    return backend.info(index)


def list_devices() -> dict:
    """Every registered backend kind: its devices, or why there are none; plus runtime facts."""
    kinds = {}
    for kind in backend_kinds():
        backend, _ = parse_device(kind)
        try:
            count = backend.count()
            kinds[kind] = {"count": count, "reason": "" if count else f"no {kind} device found",
                           "devices": [_info_dict(backend.info(i)) for i in range(count)]}
        except Exception as e:  # DeviceUnavailable, or a runtime that fails to initialise
            kinds[kind] = {"count": 0, "reason": str(e), "devices": []}
    providers, reason = available_ort_providers()
    return {"backends": kinds, "onnxruntime": {"providers": providers, "reason": reason},
            "packages": {p: importlib.util.find_spec(p) is not None
                         for p in ("torch_npu", "onnxruntime", "onnxruntime_genai")}}


def _info_dict(info) -> dict:
    d = asdict(info)
    d["dtypes"] = list(info.dtypes)
    return d
