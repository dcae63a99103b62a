"""The drafter pool as a target replica sees it: named drafter actors, asked for their load.

`pick_drafter` is the resolver a replica's remote drafter calls whenever it (re)connects: it lists
the namespace's drafter actors, asks each for `info()` with a short timeout (one being restarted
or on a dead node does not answer, and is skipped), and returns the address of the one with the
fewest open sessions and sequences. Ties are broken by the replica's index, so replicas started
together spread over the pool.
"""

from dataclasses import dataclass
from typing import ClassVar

import ray

from orchestrator.config import RemoteDrafterConfig
from orchestrator.drafters import DrafterContext
from orchestrator.server import RemoteDrafter, build_remote_drafter

DRAFTER_PREFIX = "drafter-"
TARGET_PREFIX = "target-"


def pool_members(prefix: str) -> list[str]:
    """Names of this namespace's actors of one kind, in index order."""
    names = [n for n in ray.util.list_named_actors() if isinstance(n, str) and n.startswith(prefix)]
    return sorted(names, key=lambda n: int(n[len(prefix):]) if n[len(prefix):].isdigit() else 1 << 30)


def ask_all(names: list[str], timeout_s: float) -> dict[str, dict]:
    """`info()` of every named actor that answers within `timeout_s` (all asked at once)."""
    refs = {}
    for name in names:
        try:
            refs[name] = ray.get_actor(name).info.remote()
        except ValueError:  # gone between listing and lookup
            continue
    if not refs:
        return {}
    done, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    done = set(done)
    answers = {}
    for name, ref in refs.items():
        if ref not in done:
            continue
        try:
            answers[name] = ray.get(ref)
        except ray.exceptions.RayError:  # died while answering
            continue
    return answers


def pick_drafter(index: int = 0, timeout_s: float = 1.0) -> str | None:
    """The address of the least-loaded drafter that answers, or None when none does."""
    names = pool_members(DRAFTER_PREFIX)
    answers = ask_all(names, timeout_s)
    if not answers:
        return None
    n = len(names)

    def load(name: str):
        info = answers[name]
        return info["sessions"], info["sequences"], (names.index(name) - index) % n

    return answers[min(answers, key=load)]["address"]


@dataclass(frozen=True)
class PoolDrafterConfig:
    """A target replica's drafter: a remote drafter session to whichever pool member `pick_drafter` names."""

    kind: ClassVar[str] = "pool"
    remote: RemoteDrafterConfig  # TLS, token, timeout, hidden states: as for a fixed address
    index: int = 0  # the replica's: spreads ties over the pool
    max_backoff_s: float = 2.0  # between asks while no drafter answers


def build_pool_drafter(config: PoolDrafterConfig, ctx: DrafterContext) -> RemoteDrafter:
    return build_remote_drafter(config.remote, ctx, resolve=lambda: pick_drafter(config.index),
                                backoff_s=(0.25, config.max_backoff_s))
