"""`hetspec cluster up|status|down`: the profile's actors on a Ray cluster, placed by resources."""

import logging
import os
import socket
import time
from dataclasses import dataclass, field

import ray
from tqdm import tqdm

from orchestrator.cluster.actors import DrafterWorker, TargetReplica
from orchestrator.cluster.pool import DRAFTER_PREFIX, TARGET_PREFIX, ask_all, pool_members
from orchestrator.errors import HetspecError
from orchestrator.profiles import Profile
from orchestrator.profiles.cluster_schema import PoolSpec

log = logging.getLogger(__name__)

# what the actors' processes need from the environment of `hetspec cluster up` (the model cache,
# offline mode); the profile's token variables are added
PASSED_ENV = ("HF_HUB_OFFLINE", "HF_HOME", "HETSPEC_CACHE_DIR", "XDG_CACHE_HOME")


@dataclass
class ClusterState:
    """Every actor of the deployment: its `info()`, or `{"name", "state": "not answering"}`."""

    drafters: list[dict] = field(default_factory=list)
    targets: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"drafters": self.drafters, "targets": self.targets}


def placement_options(pool: PoolSpec, available: dict, cpu_fallback: bool, role: str) -> tuple[dict, list[str]]:
    """Ray actor options for one pool member, and the notes of resources dropped for want of them.

    `GPU` becomes Ray's num_gpus; any other resource (NPU, custom) stays a resource. A resource the
    cluster does not have at all is dropped (placed by CPUs alone) when `cpu_fallback` allows it,
    else it is an error: Ray would wait for it forever."""
    resources = dict(pool.resources)
    num_gpus = resources.pop("GPU", 0.0)
    num_cpus = resources.pop("CPU", pool.num_cpus)
    wanted = {**resources, **({"GPU": num_gpus} if num_gpus else {})}
    missing = [name for name in wanted if available.get(name, 0) <= 0]
    notes = []
    if missing:
        if not cpu_fallback:
            raise HetspecError(f"cluster.{role}.resources: the Ray cluster has no {', '.join(missing)} "
                               f"(it has {', '.join(sorted(available)) or 'nothing'})")
        notes.append(f"{role}: the cluster has no {', '.join(missing)}; placed by CPUs alone")
        resources = {k: v for k, v in resources.items() if k not in missing}
        num_gpus = 0.0 if "GPU" in missing else num_gpus
    options = {"num_cpus": num_cpus, "resources": resources}
    if num_gpus:
        options["num_gpus"] = num_gpus
    return options, notes


class Cluster:
    """One profile's deployment on the Ray cluster its `cluster:` section names."""

    def __init__(self, profile: Profile, profile_text: str):
        spec = profile.cluster
        if spec is None:
            raise HetspecError(f"profile {profile.source} has no cluster section (cluster: {{engine: ray, ...}})")
        s = profile.speculation
        if s.drafters:
            raise HetspecError("speculation.drafters: a cluster serves one drafter (speculation.drafter)")
        if s.drafter is not None and profile.drafters[s.drafter].kind == "remote":
            raise HetspecError(f"speculation.drafter: {s.drafter!r} is remote; a cluster's drafter pool runs a "
                               f"local one (onnx, torch, ngram, mtp)")
        self.profile, self.spec, self.text = profile, spec, profile_text
        self.speculates = s.drafter is not None and s.num_speculative_tokens != 0
        self._connected = False

    def connect(self) -> None:
        if self._connected:
            return
        unreachable = _unreachable(self.spec.address)
        if unreachable:  # Ray itself would retry for minutes
            raise HetspecError(f"cluster.address: cannot reach a Ray cluster at {self.spec.address!r} "
                               f"({unreachable}); start one with `ray start --head`")
        try:
            ray.init(address=self.spec.address, namespace=self.spec.namespace, logging_level=logging.WARNING,
                     log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise HetspecError(f"cluster.address: cannot reach a Ray cluster at {self.spec.address!r} "
                               f"({str(e).splitlines()[0]}); start one with `ray start --head`") from None
        self._connected = True

    def up(self, progress: bool = True) -> ClusterState:
        """Start every actor and wait until each has loaded its model and answers."""
        self.connect()
        if pool_members(DRAFTER_PREFIX) or pool_members(TARGET_PREFIX):
            raise HetspecError(f"namespace {self.spec.namespace!r} already has a deployment: "
                               f"`hetspec cluster down` first")
        available = ray.cluster_resources()
        env = {"env_vars": self._env()}
        common = {"lifetime": "detached", "max_restarts": -1, "runtime_env": env}
        names = []
        if self.speculates:
            options, notes = placement_options(self.spec.drafters, available, self.spec.cpu_fallback, "drafters")
            for note in notes:
                log.warning("%s", note)
            for i in range(self.spec.drafters.replicas):
                name = f"{DRAFTER_PREFIX}{i}"
                ray.remote(DrafterWorker).options(name=name, **common, **options).remote(
                    self.text, self.profile.source, self.spec.bind)
                names.append(name)
        options, _ = placement_options(self.spec.targets, available, False, "targets")
        for i in range(self.spec.targets.replicas):
            name = f"{TARGET_PREFIX}{i}"
            ray.remote(TargetReplica).options(name=name, **common, **options).remote(
                self.text, self.profile.source, self.spec.bind, i, self.spec.drafter_timeout_s)
            names.append(name)
        try:
            self._wait_ready(names, progress)
        except BaseException:
            self.down()
            raise
        return self.status()

    def _wait_ready(self, names: list[str], progress: bool) -> None:
        refs = {ray.get_actor(n).info.remote(): n for n in names}
        deadline = time.monotonic() + self.spec.ready_timeout_s
        with tqdm(total=len(refs), desc="cluster up", unit="actor", disable=not progress) as bar:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                if not done:
                    raise HetspecError(f"{', '.join(sorted(refs.values()))} not ready within "
                                       f"{self.spec.ready_timeout_s} s (cluster.ready_timeout_s); are their "
                                       f"resources in the cluster? (`ray status`)")
                name = refs.pop(done[0])
                try:
                    ray.get(done[0])
                except ray.exceptions.RayActorError as e:
                    raise HetspecError(f"{name} failed to start: {_cause(e)}") from None
                bar.set_postfix_str(name)
                bar.update()

    def status(self, timeout_s: float = 2.0) -> ClusterState:
        self.connect()
        state = ClusterState()
        for prefix, out in ((DRAFTER_PREFIX, state.drafters), (TARGET_PREFIX, state.targets)):
            names = pool_members(prefix)
            answers = ask_all(names, timeout_s)
            out.extend({"name": n, "state": "ready", **answers[n]} if n in answers
                       else {"name": n, "state": "not answering"} for n in names)
        return state

    def down(self) -> int:
        """Stop and remove every actor of the deployment; how many there were."""
        self.connect()
        names = pool_members(DRAFTER_PREFIX) + pool_members(TARGET_PREFIX)
        stopping = []
        for name in names:  # a clean stop first: servers drained, drafters closed
            try:
                stopping.append(ray.get_actor(name).stop.remote())
            except ValueError:
                pass
        if stopping:
            ray.wait(stopping, num_returns=len(stopping), timeout=10.0)
        for name in names:
            try:
                ray.kill(ray.get_actor(name), no_restart=True)
            except ValueError:
                pass
        return len(names)

    def _env(self) -> dict:
        names = list(PASSED_ENV)
        names += [self.profile.server.auth_token_env] if self.profile.server.auth_token_env else []
        names += [d.token_env for d in self.profile.drafters.values() if getattr(d, "token_env", None)]
        return {n: os.environ[n] for n in names if n in os.environ}


def _unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why nothing listens at a `host:port` or `ray://host:port` address (None: something does, or
    the address is `auto` and Ray finds the cluster itself)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        return e.strerror or str(e) or type(e).__name__
    return None


def _cause(e: Exception) -> str:
    """The last line of an actor's failure (its exception), not Ray's wrapping of it."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    errors = [line for line in lines if "Error:" in line or "Error(" in line]
    return (errors or lines or ["unknown"])[-1]
