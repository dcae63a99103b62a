"""ONNX Runtime execution providers per device kind: which provider runs a device, with which options.

The table is keyed by backend kind like the torch registry, so nothing outside `devices/`
branches on device names. Availability is what the installed onnxruntime wheel offers
(`onnxruntime` offers CPU, `onnxruntime-gpu` CUDA, `onnxruntime-cann` CANN; one at a time).
"""

from dataclasses import dataclass, field

from devices.registry import parse_device


@dataclass(frozen=True)
class OrtProvider:
    name: str  # e.g. "CUDAExecutionProvider"
    indexed: bool  # takes a device_id option
    wheel: str  # the onnxruntime package that ships it
    memory: str  # OrtValue device type of the memory it computes in: "cpu", "cuda", "cann"


@dataclass(frozen=True)
class OrtPlacement:
    """Everything an ONNX Runtime session on one device needs, from one parse of the device name."""

    device: str  # as given, e.g. "npu:0"
    provider: OrtProvider
    options: dict = field(default_factory=dict)  # provider options (device_id for indexed providers)
    device_id: int = 0

    @property
    def memory(self) -> str:
        """Where buffers bound to the session (the drafter's KV) live: an OrtValue device type."""
        return self.provider.memory


_PROVIDERS: dict[str, OrtProvider] = {}


def register_ort_provider(kind: str, provider: OrtProvider) -> None:
    _PROVIDERS[kind] = provider


register_ort_provider("cpu", OrtProvider("CPUExecutionProvider", indexed=False, wheel="onnxruntime", memory="cpu"))
register_ort_provider("cuda", OrtProvider("CUDAExecutionProvider", indexed=True, wheel="onnxruntime-gpu",
                                          memory="cuda"))
register_ort_provider("npu", OrtProvider("CANNExecutionProvider", indexed=True, wheel="onnxruntime-cann",
                                         memory="cann"))


def ort_placement(device: str, extra_options: dict | None = None) -> OrtPlacement:
    """The provider that runs `device`, its options, and where its memory is."""
    backend, index = parse_device(device)
    provider = _PROVIDERS.get(backend.kind)
    if provider is None:
        raise ValueError(f"no ONNX Runtime execution provider is known for {backend.kind!r} devices")
    options = {"device_id": str(index)} if provider.indexed else {}
    options.update({k: str(v) for k, v in (extra_options or {}).items()})
    return OrtPlacement(str(device), provider, options, index if provider.indexed else 0)


def available_ort_providers() -> tuple[list[str], str]:
    """(providers the installed onnxruntime offers, reason when onnxruntime is not importable)."""
    try:
        import onnxruntime
    except ImportError as e:
        return [], f"onnxruntime is not importable ({e})"
    return list(onnxruntime.get_available_providers()), ""


def ort_unavailable_reason(device: str) -> str:
    """'' when the installed onnxruntime offers the provider for `device`, else why not."""
    provider = ort_placement(device).provider
    available, reason = available_ort_providers()
    if reason:
        return reason
    if provider.name not in available:
        return (f"{provider.name} is not offered by the installed onnxruntime "
                f"(it has {', '.join(available)}; install {provider.wheel})")
    return ""
