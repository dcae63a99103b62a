"""`Profile`: a validated profile file, plus what it resolves to on this machine."""

from pydantic import PrivateAttr

from orchestrator.config import EngineConfig
from orchestrator.profiles.plan import Plan, resolve_plan
from orchestrator.profiles.schema import ProfileSpec


class Profile(ProfileSpec):
    """The sections as typed attributes (`target`, `drafters`, `speculation`, `profiling`,
    `transport`, `server`); `plan()` and `engine_config()` resolve placement and fallbacks here."""

    _source: str = PrivateAttr("")

    @property
    def source(self) -> str:
        """The shipped name or the file path this profile was loaded from."""
        return self._source or self.name or "(inline)"

    def plan(self) -> Plan:
        """Where everything runs on this machine, which fallbacks were taken and why."""
        return resolve_plan(self)

    def engine_config(self) -> EngineConfig:
        """The engine config after placement; logs each fallback taken; ProfileError if it cannot run."""
        return self.plan().engine_config()
