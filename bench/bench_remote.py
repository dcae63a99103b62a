"""Remote drafter over gRPC loopback vs the same drafter in-process, side by side in one run.

Same target (SmolLM2-135M fp32, torch CPU), same INT4 ONNX drafter export (8-bit lm_head),
greedy, k=4. The remote side talks to `hetspec drafter serve` in another process through
`hetspec.v1.Drafter`; the in-process side calls the drafter directly. Prompts alternate which
side goes first. Per side: tokens/s, and the per-step non-model overhead:

    overhead per step = (step wall time - target forward time - drafter compute time) / steps

where drafter compute is the time inside the drafter's `propose` (in-process: measured here;
remote: measured by the drafter server around the same calls and sent back in each
ProposalBatch). The remote side's extra overhead is what the transport costs per step.

    python bench/bench_remote.py [--prompts 5] [--tokens 64] [--k 4] [--batch 1,4]

Run it on an otherwise idle machine; results also go to bench/out/remote-drafter.json.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from orchestrator.assemble import build_drafter, build_target, drafter_context  # noqa: E402
from orchestrator.config import EngineConfig, SamplingParams  # noqa: E402
from orchestrator.engine import Engine  # noqa: E402
from orchestrator.models import encode_prompt, eos_token_ids, load_tokenizer, resolve  # noqa: E402
from orchestrator.server.remote_drafter import RemoteDrafter  # noqa: E402

from prompts import GROUNDED, PROMPTS  # noqa: E402
from servers import Server, free_port  # noqa: E402


class Timed:
    """Wraps a callable and adds up the seconds spent in it."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def run_side(engine, forward: Timed, drafter_compute, prompts_ids, tokens) -> dict:
    """All prompts as one batch through engine.step(); returns wall/forward/drafter seconds and outputs."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    f0, d0 = forward.seconds, drafter_compute()
    ids = [engine.add_request(p, params) for p in prompts_ids]
    steps, wall = 0, 0.0
    while engine.has_work():
        t0 = time.perf_counter()
        engine.step()
        wall += time.perf_counter() - t0
        steps += 1
    seqs = [engine.release(i) for i in ids]
    return {"wall_s": wall, "steps": steps, "forward_s": forward.seconds - f0, "drafter_s": drafter_compute() - d0,
            "tokens": sum(len(s.output_ids) for s in seqs), "outputs": [s.output_ids for s in seqs],
            "accepted": sum(s.stats.num_accepted for s in seqs), "drafted": sum(s.stats.num_drafted for s in seqs)}


def summarize(runs: list[dict]) -> dict:
    total = {key: sum(r[key] for r in runs) for key in ("wall_s", "steps", "forward_s", "drafter_s", "tokens",
                                                        "accepted", "drafted")}
    total["tok_per_s"] = total["tokens"] / total["wall_s"]
    total["overhead_ms_per_step"] = 1000 * (total["wall_s"] - total["forward_s"] - total["drafter_s"]) / total["steps"]
    total["drafter_ms_per_step"] = 1000 * total["drafter_s"] / total["steps"]
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--batch", default="1,4", help="sequences per engine step to measure (comma list)")
    args = ap.parse_args()

    config = EngineConfig(num_speculative_tokens=args.k)
    ckpt = resolve(config.model)
    tokenizer = load_tokenizer(ckpt)
    target = build_target(config, ckpt)
    forward = target.forward = Timed(target.forward)
    eos = eos_token_ids(ckpt, tokenizer)

    local = build_drafter(config.drafter, drafter_context(config, ckpt))  # the export the drafter server loads
    local_compute = Timed(local.propose_batch)
    local.propose_batch = local_compute

    port = free_port()
    server = Server("drafter", "serve", "--profile", "cpu", "--port", str(port))
    remote = RemoteDrafter(f"127.0.0.1:{port}", vocab_size=target.vocab_size)
    engines = {
        "in-process": (Engine(target, tokenizer, local, args.k, eos_token_ids=eos), lambda: local_compute.seconds),
        "remote": (Engine(target, tokenizer, remote, args.k, eos_token_ids=eos), lambda: remote.compute_s),
    }
    prompts = [encode_prompt(tokenizer, p, chat=True) for p in (PROMPTS + [GROUNDED])[:max(args.prompts, 1)]]
    # warm-up: one short request per side (ORT sessions, gRPC channel)
    for engine, compute in engines.values():
        run_side(engine, forward, compute, prompts[:1], 8)

    report = {"model": ckpt.source.name, "k": args.k, "tokens": args.tokens, "prompts": len(prompts), "batches": {}}
    try:
        for batch in [int(b) for b in args.batch.split(",")]:
            runs = {name: [] for name in engines}
            trips0, rtt0, compute0 = remote.num_batches, remote.round_trip_s, remote.compute_s
            groups = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
            if batch > 1:  # enough sequences to fill the batch a few times
                groups = [[prompts[(i + j) % len(prompts)] for j in range(batch)] for i in range(len(prompts))][:3]
            for g, group in enumerate(groups):
                order = list(engines) if g % 2 == 0 else list(reversed(engines))
                for name in order:
                    engine, compute = engines[name]
                    runs[name].append(run_side(engine, forward, compute, group, args.tokens))
            same = all(a["outputs"] == b["outputs"] for a, b in zip(runs["in-process"], runs["remote"]))
            sides = {name: summarize(r) for name, r in runs.items()}
            report["batches"][batch] = {**sides, "identical_outputs": same}
            lo, re_ = sides["in-process"], sides["remote"]
            print(f"batch {batch}: {len(groups)} runs x {args.tokens} tokens, greedy k={args.k}, identical outputs: {same}")
            for name, s in sides.items():
                print(f"  {name:<11} {s['tok_per_s']:6.2f} tok/s | {s['steps']:4d} steps | "
                      f"drafter {s['drafter_ms_per_step']:6.2f} ms/step | non-model overhead "
                      f"{s['overhead_ms_per_step']:6.2f} ms/step | accepted {s['accepted']}/{s['drafted']}")
            print(f"  remote / in-process tok/s = {re_['tok_per_s']:.2f} / {lo['tok_per_s']:.2f} = "
                  f"{re_['tok_per_s'] / lo['tok_per_s']:.3f}x (goal >= 0.90x); transport overhead per step "
                  f"{re_['overhead_ms_per_step'] - lo['overhead_ms_per_step']:+.2f} ms "
                  f"(remote {re_['overhead_ms_per_step']:.2f} vs in-process {lo['overhead_ms_per_step']:.2f} ms; "
                  f"goal <= 1 ms)", flush=True)
            trips = remote.num_batches - trips0
            print(f"  remote round trips: {trips}, mean {1000 * (remote.round_trip_s - rtt0) / trips:.2f} "
                  f"ms of which drafter compute {1000 * (remote.compute_s - compute0) / trips:.2f} ms")
    finally:
        remote.close()
        server.stop()
    out = ROOT / "bench" / "out"
    out.mkdir(parents=True, exist_ok=True)
    for b in report["batches"].values():
        for s in (b["in-process"], b["remote"]):
            s.pop("outputs", None)
    (out / "remote-drafter.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
