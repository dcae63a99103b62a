"""Serving under load, one run: `hetspec serve --http-port 0` in its own process, real clients.

Phases, each `--seconds` long, clients looping on fixed-length requests (`ignore_eos`):
  1. one HTTP client (the `openai` package), the unloaded baseline;
  2. 32 clients at the default limits, half over HTTP, half over gRPC: errors (must be 0: past the
     running batch requests queue), health answered throughout, KV blocks all free afterwards;
  3. 16 gRPC streams with `speculate: false` against 16 with speculation (`k: auto` in the profile),
     alternated A B B A: aggregate tokens/s and the ratio (issue 14: auto >= 1.0x).
Each phase reports aggregate committed tokens/s and p50/p99 request latency.

    python bench/bench_serving.py [--profile cpu] [--seconds 60] [--tokens 48]

Writes bench/figures/serving-PROFILE.json, or NAME.json with `--name NAME` (figures, machine, commit).
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request

import openai

from orchestrator.server.client import GenerationClient

from common import add_name_arg, machine_line, write_report

PROMPT = "Explain how a hash map works, step by step."
HTTP_READY = re.compile(r"OpenAI-compatible HTTP on http://[\d.]+:(\d+)/v1")
GRPC_READY = re.compile(r"serving hetspec\.v1\.Generation on [\d.]+:(\d+)")


def start_server(profile: str) -> tuple[subprocess.Popen, int, int]:
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "serve", "--profile", profile, "--port", "0",
                             "--http-port", "0"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    http = grpc = None
    for line in proc.stderr:
        if m := HTTP_READY.search(line):
            http = int(m[1])
        if m := GRPC_READY.search(line):
            grpc = int(m[1])
            break
    if http is None or grpc is None:
        proc.kill()
        raise SystemExit("hetspec serve did not start")
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep the pipe drained
    return proc, http, grpc


def run_phase(seconds: float, clients: list, http_port: int) -> dict:
    """Each client is a callable that runs one request and returns its completion tokens."""
    latencies, tokens, errors, health = [], [], [], []
    stop = time.monotonic() + seconds

    def loop(request):
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            try:
                tokens.append(request())
                latencies.append(time.perf_counter() - t0)
            except Exception as e:  # noqa: BLE001 - every failure is counted and reported
                errors.append(repr(e)[:200])

    def probe():
        while time.monotonic() < stop:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/health", timeout=5) as r:
                    health.append(r.status == 200)
            except Exception:  # noqa: BLE001
                health.append(False)
            time.sleep(1.0)

    threads = [threading.Thread(target=loop, args=(c,)) for c in clients] + [threading.Thread(target=probe)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0  # includes the requests still running at the deadline
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"clients": len(clients), "requests": len(latencies), "errors": len(errors), "error_samples": errors[:5],
            "tokens_per_s": sum(tokens) / wall, "latency_p50_s": q[49], "latency_p99_s": q[98],
            "health_checks": len(health), "health_ok": all(health) and bool(health)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--tokens", type=int, default=48)
    add_name_arg(ap, "serving-PROFILE")
    args = ap.parse_args()
    env = machine_line()
    proc, http_port, grpc_port = start_server(args.profile)
    model = openai.OpenAI(base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0)
    name = model.models.list().data[0].id
    grpc_clients: list[GenerationClient] = []

    def http_request():
        r = model.completions.create(model=name, prompt=PROMPT, max_tokens=args.tokens, extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    def grpc_request(speculate: bool = True):
        client = GenerationClient(f"127.0.0.1:{grpc_port}")
        grpc_clients.append(client)

        def call():
            return client.generate(PROMPT, max_new_tokens=args.tokens, ignore_eos=True, speculate=speculate,
                                   timeout=600)["usage"]["completion_tokens"]
        return call

    report = {"environment": env, "profile": args.profile, "seconds": args.seconds, "tokens": args.tokens,
              "phases": {}}
    try:
        run_phase(min(10.0, args.seconds), [http_request] * 4, http_port)  # warm-up
        phases = [("1 client (HTTP)", [http_request]),
                  ("32 clients (16 HTTP + 16 gRPC)", [http_request] * 16 + [grpc_request() for _ in range(16)])]
        for label, clients in phases:
            report["phases"][label] = run_phase(args.seconds, clients, http_port)
            print(label, report["phases"][label], flush=True)
        sides = {"speculate: false": [grpc_request(False) for _ in range(16)],
                 "speculation (profile k)": [grpc_request(True) for _ in range(16)]}
        runs = {s: [] for s in sides}
        for side in ["speculate: false", "speculation (profile k)", "speculation (profile k)", "speculate: false"]:
            result = run_phase(args.seconds / 2, sides[side], http_port)
            runs[side].append(result)
            print(f"16 gRPC streams, {side}:", result, flush=True)
        agg = {s: statistics.mean(r["tokens_per_s"] for r in rs) for s, rs in runs.items()}
        report["sixteen_streams"] = {"runs": runs, "mean_tokens_per_s": agg,
                                     "speculation_vs_off": agg["speculation (profile k)"] / agg["speculate: false"]}
        print(f"16 streams: speculation {agg['speculation (profile k)']:.1f} tok/s vs off "
              f"{agg['speculate: false']:.1f} tok/s = {report['sixteen_streams']['speculation_vs_off']:.2f}x",
              flush=True)
        with GenerationClient(f"127.0.0.1:{grpc_port}") as c:
            status = c.status()
        report["kv_blocks_free_after"] = [status.kv_blocks_free, status.kv_blocks_total]
        print("KV blocks free after:", report["kv_blocks_free_after"], flush=True)
    finally:
        for c in grpc_clients:
            c.close()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    write_report(args.name or f"serving-{args.profile}", report)


if __name__ == "__main__":
    main()
