"""Device-placement profiles: YAML -> validated `Profile` -> placement plan -> `EngineConfig`.

    profile = load_profile("cpu")          # a shipped name, or a path to a YAML file
    config = profile.engine_config()       # after placement and declared fallbacks
    profile.profiling, profile.transport, profile.server   # typed sections for other verbs
"""

from orchestrator.profiles.loader import load_profile, shipped_profiles
from orchestrator.profiles.profile import Profile

__all__ = ["Profile", "load_profile", "shipped_profiles"]
