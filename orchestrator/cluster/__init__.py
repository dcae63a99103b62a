"""Scale-out on Ray: a drafter pool and target replicas placed by device resources, M:N.

    hetspec cluster up --profile cluster.yaml      # actors on the Ray cluster the profile names
    hetspec cluster status --profile cluster.yaml  # every actor: node, address, load, drafter state
    hetspec cluster down --profile cluster.yaml

A profile's `cluster:` section says how many drafter workers and target replicas to run and what
each asks of a node (`GPU` for targets, `NPU` for drafters by default; Ray detects Ascend NPUs
and sets ASCEND_RT_VISIBLE_DEVICES, as it sets CUDA_VISIBLE_DEVICES for GPUs). Every actor is a
named, detached actor that Ray restarts wherever its resources are free again (`max_restarts=-1`).

A drafter worker serves the profile's drafter as `hetspec.v1.Drafter` sessions (what `hetspec
drafter serve` runs); a target replica runs the profile's engine behind `hetspec.v1.Generation`
(what `hetspec serve` runs) with a remote drafter whose address comes from the pool: the
least-loaded drafter that answers, found through Ray's named actors, never a fixed address. A
drafter that dies (its actor or its node) drops its sessions: the targets go on target-only,
and their next reconnection asks the pool again, finding another member or the replacement Ray
starts. Nothing is lost: the target keeps every sequence's tokens and re-opens them.

Only this package imports ray (the `[ray]` extra).
"""

from orchestrator.errors import HetspecError

try:
    import ray  # noqa: F401
except ImportError:  # pragma: no cover - the extra is not installed
    raise HetspecError("hetspec cluster needs Ray: pip install 'hetspec[ray]'") from None

from orchestrator.cluster.deploy import Cluster, ClusterState
from orchestrator.cluster.pool import DRAFTER_PREFIX, TARGET_PREFIX, pick_drafter

__all__ = ["DRAFTER_PREFIX", "TARGET_PREFIX", "Cluster", "ClusterState", "pick_drafter"]
