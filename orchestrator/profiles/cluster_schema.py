"""The `cluster:` section: drafter pools and target replicas placed on a Ray cluster by resources.

    cluster:
      engine: ray
      address: auto                  # the cluster `ray start` runs here; or ray://head:10001
      drafters: {replicas: 2, resources: {NPU: 1}}
      targets: {replicas: 2, resources: {GPU: 1}}

Pure data, like the rest of the schema; `orchestrator.cluster` acts on it.
"""

from typing import Annotated, Literal

from pydantic import Field

from orchestrator.profiles.schema_base import PositiveInt, Section

ResourceName = Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.:-]*$", max_length=64)]


class PoolSpec(Section):
    """One kind of actor: how many, and what each one asks of a node (Ray resources)."""

    replicas: Annotated[int, Field(ge=1, le=256)] = 1
    num_cpus: Annotated[float, Field(ge=0)] = 1.0
    # per actor; GPU maps to Ray's num_gpus, anything else (NPU, custom) to its resources
    resources: dict[ResourceName, Annotated[float, Field(gt=0)]] = {}


class DrafterPoolSpec(PoolSpec):
    resources: dict[ResourceName, Annotated[float, Field(gt=0)]] = {"NPU": 1}


class TargetPoolSpec(PoolSpec):
    resources: dict[ResourceName, Annotated[float, Field(gt=0)]] = {"GPU": 1}


class ClusterSpec(Section):
    engine: Literal["ray"]
    address: Annotated[str, Field(min_length=1)] = "auto"  # ray.init's: auto, or ray://host:port
    namespace: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=64)] = "hetspec"
    # where the actors' gRPC servers listen: the node's cluster address (other nodes reach it) or
    # 127.0.0.1 (every node on one host)
    bind: Literal["node", "localhost"] = "node"
    drafters: DrafterPoolSpec = DrafterPoolSpec()  # resources default {NPU: 1}
    targets: TargetPoolSpec = TargetPoolSpec()  # resources default {GPU: 1}
    # a drafter resource the cluster does not have at all (no NPU node): place drafters by CPUs alone
    cpu_fallback: bool = True
    drafter_timeout_s: Annotated[float, Field(gt=0)] = 5.0  # a silent drafter is dropped (target-only meanwhile)
    ready_timeout_s: PositiveInt = 900  # `cluster up` waits this long for every actor to load its model
