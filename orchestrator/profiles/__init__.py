"""Device-placement profiles: YAML -> validated `Profile` -> placement plan -> `EngineConfig`.

    profile = load_profile("cpu")          # a shipped name, or a path to a YAML file
    config = profile.engine_config()       # after placement and declared fallbacks
    config = apply_overrides(profile, Overrides(device="cpu"))   # explicit CLI choices win
    check_profile(profile)                 # the plan, memory per device, problems (`profile check`)
    profile.profiling, profile.transport, profile.server   # typed sections for other verbs

The schema is pure data; placement probes the devices present (`devices`), and the memory
estimate reads checkpoint headers (`orchestrator.models`). Nothing here builds or runs a model.
"""

from orchestrator.profiles.check import check_profile, format_check
from orchestrator.profiles.loader import load_profile, parse_profile, read_profile_text, shipped_profiles
from orchestrator.profiles.overrides import Overrides, apply_overrides
from orchestrator.profiles.profile import Profile

__all__ = ["Overrides", "Profile", "apply_overrides", "check_profile", "format_check", "load_profile",
           "parse_profile", "read_profile_text", "shipped_profiles"]
