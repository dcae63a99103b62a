"""hetspec on a real Ray cluster of three nodes on this host (`ray start`, custom resources standing
in for devices): a head that is a "GPU" node, an "NPU" node holding both drafter actors, and a
second "GPU" node; one target replica per GPU node. The NPU node is killed mid-stream (SIGKILL to
its raylet and its actors): every request completes with the target-only greedy output, and once a
replacement NPU node joins, Ray restarts the drafters there and speculation resumes."""

import json
import subprocess
import sys
import threading

import pytest
import yaml

ray = pytest.importorskip("ray", reason="the [ray] extra is not installed")


from orchestrator.cluster import Cluster  # noqa: E402
from orchestrator.cluster.local import LocalRay  # noqa: E402
from orchestrator.profiles import parse_profile  # noqa: E402
from orchestrator.server import GenerationClient  # noqa: E402

from prompts import PROMPTS  # noqa: E402
from servers import wait_until  # noqa: E402

HETSPEC = [sys.executable, "-m", "orchestrator.cli"]
NUM_REQUESTS, MAX_NEW = 16, 64


def cluster_profile(address: str) -> str:
    return yaml.safe_dump({
        "version": 1,
        "target": {"model": "smollm2-135m", "device": "cpu", "dtype": "float32", "max_num_seqs": 16},
        "drafters": {"int4": {"kind": "onnx", "device": "cpu", "precision": "int4"}},
        "speculation": {"drafter": "int4", "num_speculative_tokens": 3},
        "cluster": {"engine": "ray", "address": address, "namespace": "hetspec-test", "bind": "localhost",
                    "drafters": {"replicas": 2, "num_cpus": 0, "resources": {"NPU": 1}},
                    "targets": {"replicas": 2, "num_cpus": 0, "resources": {"GPU": 1}},
                    "drafter_timeout_s": 3.0, "ready_timeout_s": 600},
    })


@pytest.fixture(scope="module")
def local_ray():
    local = LocalRay()
    try:
        local.start_head(num_gpus=1)  # GPU node 1 (and the head)
        npu = local.add_node(resources={"NPU": 2})  # both drafters
        local.add_node(num_gpus=1)  # GPU node 2
        yield local, npu
    finally:
        if ray.is_initialized():
            ray.shutdown()
        local.stop()


def hetspec(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*HETSPEC, *args], capture_output=True, text=True, timeout=timeout)


def generate_all(addresses: list[str], n: int, **kwargs) -> tuple[list, list[threading.Thread], list[threading.Event]]:
    """n concurrent streams spread over the targets, started: their results (filled in as they end),
    threads, and one event per stream, set at its first tokens."""
    results: list = [None] * n
    seen = [threading.Event() for _ in range(n)]

    def one(i: int) -> None:
        with GenerationClient(addresses[i % len(addresses)]) as client:
            try:
                results[i] = client.generate(PROMPTS[i % len(PROMPTS)], max_new_tokens=MAX_NEW, ignore_eos=True,
                                             timeout=600, on_delta=lambda d: d.token_ids and seen[i].set(), **kwargs)
            except Exception as e:  # noqa: BLE001 - the assertion names it
                results[i] = e
            seen[i].set()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    return results, threads, seen


def join(results, threads) -> list[dict]:
    for t in threads:
        t.join(600)
    failed = [r for r in results if not isinstance(r, dict)]
    assert not failed, f"requests failed: {failed[:3]}"
    return results


def test_a_drafter_node_killed_mid_stream_loses_no_request_and_speculation_resumes(local_ray, tmp_path):
    local, npu_node = local_ray
    path = tmp_path / "cluster.yaml"
    path.write_text(cluster_profile(local.address))

    up = hetspec("cluster", "up", "--profile", str(path), "--json")
    assert up.returncode == 0, up.stderr[-3000:]
    state = json.loads(up.stdout)
    drafters, targets = state["drafters"], state["targets"]
    assert [d["state"] for d in drafters + targets] == ["ready"] * 4
    # placed by resources: both drafters on the NPU node, one target on each GPU node
    assert len({d["node"] for d in drafters}) == 1
    assert len({t["node"] for t in targets}) == 2 and not {t["node"] for t in targets} & {drafters[0]["node"]}

    cluster = Cluster(parse_profile(path.read_text(), str(path)), path.read_text())
    addresses = [t["address"] for t in targets]
    # M:N by load: each replica found the pool through Ray; replicas started together spread over it
    status = wait_until(lambda: (s := cluster.status()) and all(t.get("drafter_state") == "connected"
                                                               for t in s.targets) and s, timeout=60, every=0.5)
    assert {t["drafter_address"] for t in status.targets} == {d["address"] for d in drafters}

    reference = join(*generate_all(addresses, NUM_REQUESTS, speculate=False)[:2])

    results, threads, seen = generate_all(addresses, NUM_REQUESTS)
    for event in seen:
        assert event.wait(300)
    assert local.kill_node(npu_node) == 1  # mid-stream: every request has tokens and none is done
    assert sum(r is None for r in results) > 0
    results = join(results, threads)
    for got, want in zip(results, reference):
        assert got["token_ids"] == want["token_ids"]
    stats = [r["stats"] for r in results]
    assert sum(s["num_accepted"] for s in stats) > 0  # speculated before the kill
    assert sum(s["num_fallback_steps"] for s in stats) > 0  # target-only after it

    # the replacement node: Ray restarts both drafters there; the replicas find them and speculate again
    replacement = local.add_node(resources={"NPU": 2})
    assert replacement != npu_node

    def restarted():
        ready = [d for d in cluster.status().drafters if d["state"] == "ready"]
        return len(ready) == 2 and {d["node"] for d in ready} != {drafters[0]["node"]}

    wait_until(restarted, timeout=240, every=1.0)
    # a replica notices at its next step, and reconnects within its backoff (2 s at most)
    assert all(t["drafter_state"] != "connected" for t in cluster.status().targets)
    join(*generate_all(addresses, 2)[:2])
    after = wait_until(lambda: (s := cluster.status()) and all(t["drafter_state"] == "connected" for t in s.targets)
                       and s, timeout=30, every=0.5)
    assert all(t["drafter_reconnects"] >= 1 for t in after.targets)
    assert {t["drafter_address"] for t in after.targets} <= {d["address"] for d in after.drafters}
    again = join(*generate_all(addresses, 4)[:2])
    for got, want in zip(again, reference):
        assert got["token_ids"] == want["token_ids"]
    assert all(r["stats"]["num_fallback_steps"] == 0 for r in again)
    assert sum(r["stats"]["num_accepted"] for r in again) > 0

    down = hetspec("cluster", "down", "--profile", str(path), timeout=120)
    assert down.returncode == 0 and "removed 4 actors" in down.stdout, down.stderr
    assert cluster.status().drafters == [] and cluster.status().targets == []
