"""hetspec on Ray: what the pool costs per step, and throughput with 1 vs 2 target replicas and 1 vs 2
drafters, in one run on this host (a local cluster from `ray start`, custom resources for devices).

  overhead   one engine in this process (SmolLM2 fp32 target, k fixed, greedy, batch 1) drafting
             through (a) a plain remote drafter: `hetspec drafter serve` at a fixed address, and
             (b) the pool: the same INT4 drafter as a Ray actor, found by `pick_drafter`. Prompts
             alternate the side that goes first. Per side: tokens/s, round trip and wire time
             (round trip less the drafter's compute) per step; and what one `pick_drafter` costs
             (paid per (re)connection, not per step).
  scale      `hetspec cluster up` with targets x drafters in {1, 2} x {1, 2} (head = GPU node 1,
             an NPU node for the drafters, GPU node 2): N concurrent streams spread over the
             replicas, aggregate tokens/s with speculation and target-only on the same deployment.

    python bench/bench_cluster.py [--prompts 8] [--tokens 64] [--streams 16] [--parts overhead,scale]

Results: bench/figures/cluster-cpu.json. Every request's output is checked against target-only.
Run it on an otherwise idle machine.
"""

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import ray
import torch
import yaml

from orchestrator.cluster import Cluster, pick_drafter
from orchestrator.cluster.actors import DrafterWorker
from orchestrator.cluster.local import LocalRay
from orchestrator.engine import Engine
from orchestrator.models import TargetRunner, eos_token_ids, load_tokenizer, resolve
from orchestrator.profiles import parse_profile
from orchestrator.server import GenerationClient
from orchestrator.server.remote_drafter import RemoteDrafter

from common import alternate, hetspec_side, machine_line, write_report
from prompts import PROMPTS  # noqa: E402  (tests/, put on the path by common)
from servers import Server  # noqa: E402

DRAFTER = {"int4": {"kind": "onnx", "device": "cpu", "precision": "int4"}}


def profile_text(k: int, cluster: dict | None = None) -> str:
    data = {"version": 1, "target": {"model": "smollm2-135m", "device": "cpu", "dtype": "float32", "max_num_seqs": 16},
            "drafters": DRAFTER, "speculation": {"drafter": "int4", "num_speculative_tokens": k}}
    if cluster:
        data["cluster"] = cluster
    return yaml.safe_dump(data)


def wire(d: RemoteDrafter) -> dict:
    n = max(d.num_batches, 1)
    return {"steps": d.num_batches, "round_trip_ms_per_step": round(d.round_trip_s / n * 1e3, 3),
            "wire_ms_per_step": round((d.round_trip_s - d.compute_s) / n * 1e3, 3)}


def overhead(args, tmp: Path) -> dict:
    ckpt = resolve("smollm2-135m")
    tok = load_tokenizer(ckpt)
    target = TargetRunner(ckpt, device="cpu", dtype=torch.float32, max_kv_tokens=8192)
    prompts = [tok(p)["input_ids"] for p in (PROMPTS * 2)[: args.prompts]]
    path = tmp / "plain.yaml"
    path.write_text(profile_text(args.k))
    local = LocalRay()
    plain = Server("drafter", "serve", "--profile", str(path), "--port", "0")
    try:
        local.start_head(num_cpus=1, resources={"NPU": 1})
        ray.init(address=local.address, namespace="hetspec-bench", log_to_driver=False)
        actor = ray.remote(DrafterWorker).options(name="drafter-0", resources={"NPU": 1}, num_cpus=0).remote(
            path.read_text(), str(path), "localhost")
        ray.get(actor.info.remote(), timeout=600)
        picks = []
        for _ in range(20):
            t0 = time.perf_counter()
            assert pick_drafter(0) is not None
            picks.append((time.perf_counter() - t0) * 1e3)
        a = RemoteDrafter(plain.address, vocab_size=target.vocab_size)
        b = RemoteDrafter(None, vocab_size=target.vocab_size, resolve=lambda: pick_drafter(0))
        eos = eos_token_ids(ckpt, tok)
        engines = [Engine(target, tok, d, num_speculative_tokens=args.k, eos_token_ids=eos) if d else
                   Engine(target, tok, None, num_speculative_tokens=0, eos_token_ids=eos) for d in (None, a, b)]
        hetspec_side(engines[1], 8)(prompts[0])  # warm both drafters and the target
        hetspec_side(engines[2], 8)(prompts[0])
        a.num_batches = b.num_batches = 0
        a.round_trip_s = a.compute_s = b.round_trip_s = b.compute_s = 0.0
        results = alternate([hetspec_side(e, args.tokens) for e in engines], prompts)
        out = {"target_only_tok_s": round(results[0][0], 2),
               "plain_remote": {"tok_s": round(results[1][0], 2), **wire(a)},
               "ray_pool": {"tok_s": round(results[2][0], 2), **wire(b)},
               "pick_drafter_ms": {"median": round(statistics.median(picks), 2), "max": round(max(picks), 2)},
               "identical": [r[1] == results[0][1] for r in results[1:]]}
        print(f"overhead  target-only {out['target_only_tok_s']} tok/s | plain remote {out['plain_remote']} | "
              f"ray pool {out['ray_pool']} | pick_drafter {out['pick_drafter_ms']} ms | identical {out['identical']}",
              flush=True)
        a.close()
        b.close()
        return out
    finally:
        plain.stop()
        if ray.is_initialized():
            ray.shutdown()
        local.stop()


def streams(addresses: list[str], n: int, tokens: int, **kw) -> tuple[float, list[dict]]:
    results: list = [None] * n

    def one(i):
        with GenerationClient(addresses[i % len(addresses)]) as c:
            results[i] = c.generate(PROMPTS[i % len(PROMPTS)], max_new_tokens=tokens, ignore_eos=True, timeout=900, **kw)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results


def scale(args, tmp: Path) -> list[dict]:
    local = LocalRay()
    rows = []
    try:
        local.start_head(num_cpus=1, num_gpus=1)
        local.add_node(num_cpus=1, resources={"NPU": 2})
        local.add_node(num_cpus=1, num_gpus=1)
        for targets, drafters in ((1, 1), (1, 2), (2, 1), (2, 2)):
            cluster = {"engine": "ray", "address": local.address, "namespace": "hetspec-bench", "bind": "localhost",
                       "drafters": {"replicas": drafters, "num_cpus": 0, "resources": {"NPU": 1}},
                       "targets": {"replicas": targets, "num_cpus": 0, "resources": {"GPU": 1}}}
            text = profile_text(args.k, cluster)
            c = Cluster(parse_profile(text, "bench"), text)
            t0 = time.perf_counter()
            state = c.up(progress=False)
            up_s = time.perf_counter() - t0
            addresses = [t["address"] for t in state.targets]
            streams(addresses, len(addresses) * 2, 8)  # warm-up: every replica connects to the pool
            sides = {}
            order = ("speculative", "target-only") if len(rows) % 2 == 0 else ("target-only", "speculative")
            for side in order:
                wall, res = streams(addresses, args.streams, args.tokens, speculate=side == "speculative")
                sides[side] = (wall, res)
            wall_s, res_s = sides["speculative"]
            wall_t, res_t = sides["target-only"]
            tokens = args.streams * args.tokens
            info = c.status().targets
            row = {"targets": targets, "drafters": drafters, "up_s": round(up_s, 1),
                   "speculative_tok_s": round(tokens / wall_s, 2), "target_only_tok_s": round(tokens / wall_t, 2),
                   "speedup": round(wall_t / wall_s, 3),
                   "identical": sum(a["token_ids"] == b["token_ids"] for a, b in zip(res_s, res_t)),
                   "accepted_per_step": round(sum(r["stats"]["num_accepted"] for r in res_s)
                                              / max(1, sum(r["stats"]["num_steps"] for r in res_s)), 3),
                   "sessions_per_drafter": sorted(d["sessions"] for d in c.status().drafters),
                   "wire_ms_per_step": [round((t["drafter_round_trip_s"] - t["drafter_compute_s"])
                                              / max(1, t["drafter_batches"]) * 1e3, 3) for t in info]}
            print(f"scale  {targets} target(s) x {drafters} drafter(s): {row}", flush=True)
            rows.append(row)
            c.down()
            ray.shutdown()
        return rows
    finally:
        if ray.is_initialized():
            ray.shutdown()
        local.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--parts", default="overhead,scale")
    args = p.parse_args()
    env = machine_line()
    tmp = Path(tempfile.mkdtemp(prefix="hetspec-bench-cluster-"))
    report = {"machine": env, "args": vars(args), "ray": ray.__version__}
    parts = args.parts.split(",")
    if "overhead" in parts:
        report["overhead"] = overhead(args, tmp)
    if "scale" in parts:
        report["scale"] = scale(args, tmp)
    write_report("cluster-cpu", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
