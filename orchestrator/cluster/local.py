"""A Ray cluster of several nodes on one host, from the real `ray start`: each node its own raylet
process, so a fault drill (a test, a bench) can kill one (SIGKILL to its raylet and everything
under it) and add another. Linux only (it reads /proc). Custom resources stand in for devices:

    local = LocalRay(); local.start_head(num_gpus=1); npu = local.add_node(resources={"NPU": 2})
    ...                                 # profile cluster.address: local.address
    local.kill_node(npu); local.stop()
"""

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = Path(sys.executable).with_name("ray")
# the head's GCS declares a node dead after 3 missed health checks 1 s apart (Ray's default: 5 x 3 s)
FAST_FAILURE = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
                "RAY_health_check_timeout_ms": "1000", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process we can read."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry.name)] = (ppid, cmd)
    return out


def _kill_trees(roots: list[int]) -> None:
    procs = _processes()
    doomed, frontier = set(roots), list(roots)
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, _) in procs.items():
            if ppid == parent and pid not in doomed:
                doomed.add(pid)
                frontier.append(pid)
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class LocalRay:
    """Nodes started by `ray start` with their own temp dir; `stop()` ends exactly these."""

    def __init__(self):
        self.temp_dir = tempfile.mkdtemp(prefix="hsray-", dir="/tmp")  # short: Ray's socket paths must fit
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, **FAST_FAILURE}
        self.env.pop("RAY_ADDRESS", None)

    def _start(self, args: list[str]) -> None:
        common = ["--object-store-memory=80000000", f"--temp-dir={self.temp_dir}", "--disable-usage-stats"]
        done = subprocess.run([str(RAY), "start", *args, *common], env=self.env, capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")

    def start_head(self, num_cpus: int = 1, num_gpus: int = 0, resources: dict | None = None) -> None:
        self._start(["--head", f"--port={self.port}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
                     f"--resources={json.dumps(resources or {})}", "--include-dashboard=false",
                     f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}"])

    def add_node(self, num_cpus: int = 1, num_gpus: int = 0, resources: dict | None = None) -> int:
        """A worker node; returns its node-manager port (what `kill_node` takes)."""
        port = free_port()
        self._start([f"--address={self.address}", f"--num-cpus={num_cpus}", f"--num-gpus={num_gpus}",
                     f"--resources={json.dumps(resources or {})}", f"--node-manager-port={port}",
                     f"--dashboard-agent-listen-port={free_port()}"])
        return port

    def kill_node(self, node_manager_port: int) -> int:
        """SIGKILL the node's raylet and every process under it (its workers: the actors); returns
        how many raylets matched (1)."""
        raylets = [pid for pid, (_, cmd) in _processes().items()
                   if "/raylet/raylet " in cmd and f"--node_manager_port={node_manager_port} " in cmd + " "]
        _kill_trees(raylets)
        return len(raylets)

    def stop(self) -> None:
        """Every process of this cluster (their command lines name its temp dir or its head), and what
        runs under them."""
        gcs = re.compile(rf"--(?:gcs-)?address=\S+:{self.port}\b")  # the client server names only the head
        roots = [pid for pid, (_, cmd) in _processes().items()
                 if (self.temp_dir in cmd or gcs.search(cmd)) and pid != os.getpid()]
        _kill_trees(roots)
        time.sleep(0.5)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
