"""Placement: which device runs the target and which drafter runs, given the devices present.

A missing device is replaced only by a fallback the profile declares (target: `fallback`
placements in order; drafter: its `fallback` names, depth first), and each replacement is
logged as a warning naming what was wanted, why it cannot run, and what runs instead.
"""

import logging
from dataclasses import dataclass, field

from devices import device_info, device_unavailable_reason
from orchestrator.config import CombinedDrafterConfig, EngineConfig
from orchestrator.errors import ProfileError
from orchestrator.profiles.schema import Placement

log = logging.getLogger("hetspec.profiles")


@dataclass
class Plan:
    profile: "Profile"  # noqa: F821 (orchestrator.profiles.profile.Profile)
    target: Placement | None  # None: no declared placement can run here
    target_skipped: list[tuple[Placement, str]] = field(default_factory=list)  # (placement, why not)
    drafter: str | None = None  # drafter name that runs; None = target only (or none can run)
    drafter_skipped: list[tuple[str, str]] = field(default_factory=list)  # (drafter name, why not)
    combined: list[str] = field(default_factory=list)  # `speculation.drafters`: the names that run, in order
    problems: list[str] = field(default_factory=list)  # why it cannot run here; [] = it can

    @property
    def ok(self) -> bool:
        return not self.problems

    def fallbacks_taken(self) -> list[str]:
        """One sentence per replacement made (the warnings `engine_config()` logs)."""
        notes = []
        if self.target is not None and self.target_skipped:
            wanted, why = self.target_skipped[0]
            notes.append(f"target on {wanted.device} ({wanted.dtype}) cannot run here: {why}; using the "
                         f"declared fallback {self.target.device} ({self.target.dtype})")
        if self.drafter is not None and self.drafter_skipped:
            wanted, why = self.drafter_skipped[0]
            spec = self.profile.drafters[self.drafter]
            notes.append(f"drafter {wanted!r} cannot run here: {why}; using the declared fallback "
                         f"{self.drafter!r} ({spec.describe()})")
        return notes

    def engine_config(self) -> EngineConfig:
        if not self.ok:
            raise ProfileError(f"profile {self.profile.source} cannot run here: {self.problems[0]}")
        for note in self.fallbacks_taken():
            log.warning("%s", note)
        p = self.profile
        s = p.speculation
        k, policy = s.k_and_policy()
        if self.drafter is None:
            drafter = None
        elif self.combined:
            drafter = CombinedDrafterConfig(tuple(p.drafters[n].drafter_config() for n in self.combined), s.combine)
        else:
            drafter = p.drafters[self.drafter].drafter_config()
        return EngineConfig(model=p.target.model, device=self.target.device, dtype=self.target.dtype,
                            kv_block_size=p.target.kv.block_size, max_kv_tokens=p.target.kv.max_tokens,
                            max_num_seqs=p.target.max_num_seqs, num_speculative_tokens=k if drafter else 0,
                            k_policy=policy, disable_by_batch_size=s.disable_by_batch_size,
                            draft_len_schedule=tuple(sorted(s.draft_len_schedule.items())), drafter=drafter,
                            acceptance=s.verification, overlap=s.overlap,
                            transport=p.transport.transport_config())


def resolve_plan(profile) -> Plan:
    """Probe the devices each choice needs, in declared order, and pick the first that runs."""
    plan = Plan(profile=profile, target=None)
    _place_target(plan)
    s = profile.speculation
    if s.num_speculative_tokens != 0:
        if s.drafters:
            names = [_place_drafter(plan, name) for name in s.drafters]
            if None not in names:
                plan.combined, plan.drafter = names, names[-1]
        elif s.drafter is not None:
            plan.drafter = _place_drafter(plan, s.drafter)
    return plan


def _place_target(plan: Plan) -> None:
    t = plan.profile.target
    for candidate in [Placement(device=t.device, dtype=t.dtype), *t.fallback]:
        why = device_unavailable_reason(candidate.device)
        if not why and candidate.dtype not in device_info(candidate.device).dtypes:
            why = f"{candidate.device} does not run {candidate.dtype}"
        if not why:
            plan.target = candidate
            return
        plan.target_skipped.append((candidate, why))
    plan.problems.append(f"target.device: {_nothing_runs(plan.target_skipped, 'target.fallback')}")


def _place_drafter(plan: Plan, first: str) -> str | None:
    """The first of `first` and its fallbacks that can run here (None: a problem is recorded)."""
    drafters = plan.profile.drafters
    skipped = []
    for name in fallback_order(drafters, first):
        why = drafters[name].unavailable_reason()
        if not why:
            plan.drafter_skipped += skipped
            return name
        skipped.append((name, why))
    plan.drafter_skipped += skipped
    plan.problems.append(f"drafters.{first}: {_nothing_runs(skipped, f'drafters.{first}.fallback')}")
    return None


def fallback_order(drafters: dict, name: str) -> list[str]:
    """`name`, then its fallbacks depth first, each once (loops were refused at load)."""
    order = [name]
    for other in drafters[name].fallback:
        order += [n for n in fallback_order(drafters, other) if n not in order]
    return order


def _nothing_runs(skipped: list, fallback_key: str) -> str:
    first = skipped[0][1]
    if len(skipped) == 1:
        return f"{first}; no fallback declared ({fallback_key})"
    rest = "; ".join(f"{_label(what)}: {why}" for what, why in skipped[1:])
    return f"{first}; declared fallbacks cannot run either: {rest}"


def _label(what) -> str:
    return what if isinstance(what, str) else f"{what.device} ({what.dtype})"
