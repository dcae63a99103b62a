"""Real hetspec servers in subprocesses on loopback, for the service tests."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

READY = re.compile(r"serving hetspec\.v1\.\w+ .*on [\d.]+:(\d+)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`hetspec <args>` in its own process group; `.port` once it prints its ready line."""

    def __init__(self, *args: str, env: dict | None = None, timeout: float = 300):
        self.args = args
        self.proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], stderr=subprocess.PIPE,
                                     stdout=subprocess.DEVNULL, text=True, env={**os.environ, **(env or {})},
                                     start_new_session=True)
        self.lines: list[str] = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip())
                m = READY.search(line)
                if m:
                    self.port = int(m[1])
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(timeout) or self.port is None:
            self.kill()
            raise RuntimeError(f"hetspec {' '.join(args)} did not start:\n" + "\n".join(self.lines[-20:]))

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def log(self) -> str:
        return "\n".join(self.lines)

    def kill(self) -> None:
        """SIGKILL: no clean-up of any kind."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.proc.returncode


def write_profile(path: Path, drafter: dict | None, k: int = 4, server: dict | None = None,
                  max_kv_tokens: int = 8192) -> Path:
    """A SmolLM2 CPU fp32 profile with the given drafter spec (None = target only)."""
    import yaml

    spec = {"version": 1, "target": {"model": "smollm2-135m", "device": "cpu", "dtype": "float32",
                                     "kv": {"block_size": 16, "max_tokens": max_kv_tokens}},
            "speculation": {"drafter": "d" if drafter else None, "num_speculative_tokens": k},
            "server": server or {}}
    if drafter:
        spec["drafters"] = {"d": drafter}
    path.write_text(yaml.safe_dump(spec))
    return path


def wait_until(predicate, timeout: float = 30.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("condition not met in time")
