"""The cluster section and placement options, without a Ray cluster: what `hetspec cluster up` asks of
Ray, and the errors a user gets before anything starts."""

import subprocess
import sys
import time

import pytest
import torch
import yaml

pytest.importorskip("ray", reason="the [ray] extra is not installed")

from orchestrator.cluster import Cluster  # noqa: E402
from orchestrator.cluster.actors import replica_profile  # noqa: E402
from orchestrator.cluster.deploy import placement_options  # noqa: E402
from orchestrator.errors import HetspecError, ProfileError  # noqa: E402
from orchestrator.profiles import parse_profile  # noqa: E402
from orchestrator.profiles.cluster_schema import PoolSpec  # noqa: E402
from orchestrator.profiles.schema import RemoteDrafterSpec  # noqa: E402


def profile(cluster: dict | None = None, drafters: dict | None = None, speculation: dict | None = None):
    data = {"version": 1, "target": {"device": "cpu"},
            "drafters": drafters or {"int4": {"kind": "onnx", "device": "cpu", "kv_handoff": True}},
            "speculation": speculation or {"drafter": "int4"}}
    if cluster is not None:
        data["cluster"] = cluster
    text = yaml.safe_dump(data)
    return parse_profile(text, "test.yaml"), text


def test_defaults_place_drafters_on_npus_and_targets_on_gpus():
    p, _ = profile({"engine": "ray"})
    c = p.cluster
    assert (c.address, c.namespace, c.bind) == ("auto", "hetspec", "node")
    assert (c.drafters.replicas, c.drafters.resources) == (1, {"NPU": 1})
    assert (c.targets.replicas, c.targets.resources) == (1, {"GPU": 1})
    p, _ = profile({"engine": "ray", "drafters": {"replicas": 2}, "targets": {"num_cpus": 2}})
    assert p.cluster.drafters.resources == {"NPU": 1} and p.cluster.targets.resources == {"GPU": 1}


def test_profile_check_shows_the_cluster_section():
    from orchestrator.profiles import check_profile, format_check

    p, _ = profile({"engine": "ray", "drafters": {"replicas": 2}})
    text = format_check(check_profile(p))
    assert "cluster  ray at auto (namespace hetspec): 2 drafters on NPU 1, 1 targets on GPU 1" in text


@pytest.mark.parametrize("cluster, match", [
    ({"engine": "ray", "replicas": 2}, "unknown key 'replicas'"),
    ({"engine": "k8s"}, "cluster.engine"),
    ({"engine": "ray", "drafters": {"replicas": 0}}, "cluster.drafters.replicas"),
    ({"engine": "ray", "targets": {"resources": {"GPU": -1}}}, "cluster.targets.resources.GPU"),
    ({"engine": "ray", "targets": {"resources": {"bad name!": 1}}}, "cluster.targets.resources"),
    ({"engine": "ray", "bind": "0.0.0.0"}, "cluster.bind"),
])
def test_a_bad_cluster_section_is_refused_naming_the_key(cluster, match):
    with pytest.raises(ProfileError, match=match):
        profile(cluster)


def test_placement_maps_gpu_to_num_gpus_and_keeps_other_resources():
    options, notes = placement_options(PoolSpec(resources={"GPU": 1, "NPU": 2}, num_cpus=0.5),
                                       {"CPU": 2, "GPU": 1, "NPU": 4}, False, "targets")
    assert options == {"num_cpus": 0.5, "num_gpus": 1, "resources": {"NPU": 2}} and notes == []


def test_a_missing_drafter_resource_falls_back_to_cpus_or_is_an_error():
    options, notes = placement_options(PoolSpec(resources={"NPU": 1}), {"CPU": 2}, True, "drafters")
    assert options == {"num_cpus": 1.0, "resources": {}}
    assert notes == ["drafters: the cluster has no NPU; placed by CPUs alone"]
    with pytest.raises(HetspecError, match=r"cluster.targets.resources: the Ray cluster has no GPU \(it has CPU\)"):
        placement_options(PoolSpec(resources={"GPU": 1}), {"CPU": 2}, False, "targets")


def test_a_replica_drafts_through_the_pool_with_the_served_drafters_options():
    p, _ = profile({"engine": "ray"})
    placed = replica_profile(p, drafter_timeout_s=2.5)
    remote = placed.drafters["int4"]
    assert isinstance(remote, RemoteDrafterSpec)
    assert (remote.kv_handoff, remote.hidden_states, remote.timeout_s) == (True, False, 2.5)
    config = placed.engine_config()  # places here without the drafter's device: it is remote
    assert config.drafter.kind == "remote"
    p, _ = profile({"engine": "ray"}, drafters={"m": {"kind": "mtp", "model": "/nonexistent"}},
                   speculation={"drafter": "m"})
    assert replica_profile(p, 5.0).drafters["m"].hidden_states is True


@pytest.mark.parametrize("drafters, speculation, match", [
    ({"r": {"kind": "remote", "address": "10.0.0.1:50061"}}, {"drafter": "r"}, "is remote"),
    ({"a": {"kind": "ngram"}, "b": {"kind": "ngram"}}, {"drafter": None, "drafters": ["a", "b"]}, "one drafter"),
])
def test_a_cluster_serves_one_local_drafter(drafters, speculation, match):
    p, text = profile({"engine": "ray"}, drafters=drafters, speculation=speculation)
    with pytest.raises(HetspecError, match=match):
        Cluster(p, text)


def test_the_cli_says_when_a_profile_has_no_cluster_section():
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "cluster", "status", "--profile", "cpu"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "has no cluster section" in done.stderr and "Traceback" not in done.stderr


def test_a_drafter_worker_places_only_its_drafter(smollm2):
    """A drafter node need not have the target's device: the NPU node of a GPU target."""
    from orchestrator.assemble import build_drafter_servicer

    text = yaml.safe_dump({"version": 1, "target": {"device": "cuda:0", "dtype": "float16"},
                           "drafters": {"d": {"kind": "ngram"}}, "speculation": {"drafter": "d"}})
    p = parse_profile(text, "gpu-target.yaml")
    if not torch.cuda.is_available():
        with pytest.raises(ProfileError, match="cuda:0"):
            p.engine_config()  # the whole profile cannot run on this CPU-only host
    servicer, config = build_drafter_servicer(p, "d", progress=False)
    assert config.drafter_kind == "ngram" and servicer.drafter.name == "ngram"


def test_an_unreachable_cluster_is_one_line_at_once():
    from servers import free_port

    p, text = profile({"engine": "ray", "address": f"127.0.0.1:{free_port()}"})
    t0 = time.monotonic()
    with pytest.raises(HetspecError, match="cluster.address: cannot reach a Ray cluster at '127.0.0.1:"):
        Cluster(p, text).status()
    assert time.monotonic() - t0 < 10  # not Ray's minutes of retries
