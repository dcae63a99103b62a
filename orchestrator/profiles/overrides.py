"""`hetspec generate --profile P [flags]`: the profile gives defaults, explicit flags override them.

Flags left unset are None. Placement flags (--model/--device/--dtype, --drafter/--no-spec) edit
the profile before placement is resolved, so an explicit `--device cpu` can run a GPU profile and
an explicit device is never swapped for a fallback; the rest edit the resolved `EngineConfig`.
"""

from dataclasses import replace

from pydantic import ValidationError

from orchestrator.config import EngineConfig
from orchestrator.errors import InvalidRequestError
from orchestrator.profiles.loader import load_profile
from orchestrator.profiles.profile import Profile
from orchestrator.profiles.schema import NgramDrafterSpec, OnnxDrafterSpec, Placement, SpeculationSpec

DEFAULT_PROFILE = "cpu"
CLI_DRAFTER = "cli"  # the name a drafter chosen by --drafter gets inside the profile
_CLI_DRAFTERS = {"onnx": OnnxDrafterSpec, "ngram": NgramDrafterSpec}


def engine_config_from_args(args) -> EngineConfig:
    """The profile (`--profile`, default `cpu`) with the explicitly given flags applied."""
    profile = load_profile(args.profile or DEFAULT_PROFILE)
    profile = _with_placement_flags(profile, args)
    config = profile.engine_config()
    if args.num_speculative_tokens is not None:
        config = replace(config, num_speculative_tokens=args.num_speculative_tokens)
    if args.adaptive_k:
        config = replace(config, adaptive_k=True)
    drafter = config.drafter
    onnx_flags = {k: getattr(args, k, None) for k in ("precision", "block_size", "int8_lm_head", "kv_handoff")}
    drafter = replace(drafter, **{k: v for k, v in onnx_flags.items() if v is not None})
    if args.drafter_ep:
        drafter = replace(drafter, providers=tuple(args.drafter_ep), provider_options=())
    return replace(config, drafter=drafter)


def _with_placement_flags(profile: Profile, args) -> Profile:
    target = profile.target
    if args.device is not None or args.dtype is not None:
        placement = _placement(args.device or target.device, args.dtype or target.dtype)
        # an explicit device is what the user asked for: no silent fallback from it
        fallback = [] if args.device is not None else target.fallback
        target = target.model_copy(update={"device": placement.device, "dtype": placement.dtype,
                                           "fallback": fallback})
    if args.model is not None:
        target = target.model_copy(update={"model": args.model})
    speculation, drafters = profile.speculation, profile.drafters
    if args.no_spec:
        speculation = speculation.model_copy(update={"drafter": None})
    elif args.drafter is not None and not _primary_is(profile, args.drafter):
        drafters = {**drafters, CLI_DRAFTER: _CLI_DRAFTERS[args.drafter](kind=args.drafter)}
        speculation = SpeculationSpec(**{**speculation.model_dump(), "drafter": CLI_DRAFTER})
    return profile.model_copy(update={"target": target, "drafters": drafters, "speculation": speculation})


def _primary_is(profile: Profile, kind: str) -> bool:
    name = profile.speculation.drafter
    return name is not None and profile.drafters[name].kind == kind


def _placement(device: str, dtype: str) -> Placement:
    try:
        return Placement(device=device, dtype=dtype)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise InvalidRequestError(f"--{err['loc'][0]}: {err['msg'].removeprefix('Value error, ')}") from None
