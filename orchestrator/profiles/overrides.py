"""Explicit command-line choices over a profile: the profile gives defaults, given flags win.

Placement choices (model, device, dtype, drafter kind, no speculation) edit the profile before
placement is resolved, so an explicit `--device cpu` can run a GPU profile and an explicit
device is never swapped for a fallback; the rest edit the resolved `EngineConfig`.
"""

from dataclasses import dataclass, replace

from pydantic import ValidationError

from orchestrator.config import (
    AUTO_K_MAX,
    EngineConfig,
    MtpDrafterConfig,
    OnnxDrafterConfig,
    RemoteDrafterConfig,
    TorchDrafterConfig,
)
from orchestrator.errors import InvalidRequestError
from orchestrator.profiles.profile import Profile
from orchestrator.profiles.schema import MtpDrafterSpec, NgramDrafterSpec, OnnxDrafterSpec, Placement, SpeculationSpec

CLI_DRAFTER = "cli"  # the name a drafter chosen by --drafter gets inside the profile
_CLI_DRAFTERS = {"onnx": OnnxDrafterSpec, "ngram": NgramDrafterSpec, "mtp": MtpDrafterSpec}
_ONNX_ONLY = ("precision", "block_size", "int8_lm_head", "drafter_device", "drafter_providers", "drafter_threads")


@dataclass(frozen=True)
class Overrides:
    """What the user gave explicitly; None (or False) = the profile's value."""

    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    drafter: str | None = None  # a drafter kind: "onnx" | "ngram" | "mtp"
    drafter_model: str | None = None  # the drafter's own checkpoint (a smaller model of the target's family)
    no_spec: bool = False
    num_speculative_tokens: int | str | None = None  # a fixed k, or "auto" (the cost model chooses)
    adaptive_k: bool = False
    precision: str | None = None
    block_size: int | None = None
    int8_lm_head: bool | None = None
    kv_handoff: bool | None = None
    drafter_device: str | None = None  # the ONNX drafter's device (provider and KV buffers)
    drafter_providers: tuple[str, ...] = ()  # ONNX Runtime providers, overriding the device's
    drafter_threads: int | None = None  # ONNX Runtime intra-op threads for the drafter
    overlap: bool | None = None  # draft ahead while the target verifies


def apply_overrides(profile: Profile, given: Overrides) -> EngineConfig:
    """The profile with the given choices applied, placed on this machine."""
    config = _with_placement(profile, given).engine_config()
    k = given.num_speculative_tokens
    if k == "auto":
        config = replace(config, k_policy="auto", num_speculative_tokens=config.num_speculative_tokens
                         if config.k_policy == "auto" else AUTO_K_MAX)
    elif k is not None:
        config = replace(config, k_policy="fixed", num_speculative_tokens=k)
    if given.adaptive_k:
        config = replace(config, k_policy="adaptive")
    if given.overlap is not None:
        config = replace(config, overlap=given.overlap)
        config.validate()
    return replace(config, drafter=_drafter(config.drafter, given))


def _drafter(drafter, given: Overrides):
    onnx = {k: getattr(given, k) for k in _ONNX_ONLY if getattr(given, k) not in (None, ())}
    if given.kv_handoff is not None:
        if not isinstance(drafter, (OnnxDrafterConfig, RemoteDrafterConfig)):
            raise InvalidRequestError("kv_handoff needs an onnx drafter exported from the target itself "
                                      f"(or a remote self-drafter), not {_kind(drafter)}")
        drafter = replace(drafter, kv_handoff=given.kv_handoff)
    if given.drafter_model is not None:
        if not isinstance(drafter, (OnnxDrafterConfig, TorchDrafterConfig, MtpDrafterConfig)):
            raise InvalidRequestError(f"--drafter-model: only for the onnx, torch and mtp drafters, not {_kind(drafter)}")
        drafter = replace(drafter, model=given.drafter_model)
    if not onnx:
        return drafter
    if isinstance(drafter, MtpDrafterConfig) and set(onnx) <= {"precision", "drafter_device"}:
        if "drafter_device" in onnx:  # a known device name
            _placement(onnx["drafter_device"], "float32", "--drafter-device")
        return replace(drafter, device=onnx.get("drafter_device", drafter.device), **(
            {"runtime": "onnx", "precision": onnx["precision"]} if "precision" in onnx else {}))
    if not isinstance(drafter, OnnxDrafterConfig):
        flags = ", ".join("--" + k.replace("_", "-") for k in onnx)
        raise InvalidRequestError(f"{flags}: only for the onnx drafter, not {_kind(drafter)}")
    if "drafter_device" in onnx:
        _placement(onnx["drafter_device"], "float32", "--drafter-device")  # a known device name
    # --drafter-device/-ep/-threads set the config's device, providers, threads
    return replace(drafter, **{k.removeprefix("drafter_"): v for k, v in onnx.items()})


def _kind(drafter) -> str:
    return "target only" if drafter is None else f"the {drafter.kind} drafter"


def _with_placement(profile: Profile, given: Overrides) -> Profile:
    target = profile.target
    if given.device is not None or given.dtype is not None:
        placement = _placement(given.device or target.device, given.dtype or target.dtype)
        # an explicit device is what the user asked for: no silent fallback from it
        fallback = [] if given.device is not None else target.fallback
        target = target.model_copy(update={"device": placement.device, "dtype": placement.dtype,
                                           "fallback": fallback})
    if given.model is not None:
        target = target.model_copy(update={"model": given.model})
    speculation, drafters = profile.speculation, profile.drafters
    if given.no_spec:
        speculation = speculation.model_copy(update={"drafter": None, "drafters": []})
    elif given.drafter is not None and not _primary_is(profile, given.drafter):
        extra = {}
        if given.drafter == "mtp":
            if given.drafter_model is None:
                raise InvalidRequestError("--drafter mtp needs --drafter-model DIR: a drafter made by "
                                          "`hetspec train-drafter --target MODEL --out DIR`")
            extra["model"] = given.drafter_model
        drafters = {**drafters, CLI_DRAFTER: _CLI_DRAFTERS[given.drafter](kind=given.drafter, **extra)}
        speculation = SpeculationSpec(**{**speculation.model_dump(), "drafter": CLI_DRAFTER, "drafters": []})
    return profile.model_copy(update={"target": target, "drafters": drafters, "speculation": speculation})


def _primary_is(profile: Profile, kind: str) -> bool:
    name = profile.speculation.drafter
    return name is not None and profile.drafters[name].kind == kind


def _placement(device: str, dtype: str, flag: str | None = None) -> Placement:
    try:
        return Placement(device=device, dtype=dtype)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise InvalidRequestError(f"{flag or '--' + err['loc'][0]}: "
                                  f"{err['msg'].removeprefix('Value error, ')}") from None
