"""KV handoff against the drafter's own prefill, side by side in one run, on the control workloads.

Three sides on one target (the profile's, built once): target only, fixed k with the ONNX
self-drafter running its own prefill (`kv_handoff: false`), and the same drafter started from
the target's prefill K/V (`kv_handoff: true`). Each workload's first `--concurrency` prompts are
admitted together (one wave); every repeat runs the three sides, the order reversed every other
repeat, after a warm-up of each. Reports wall time per wave (median and range), the speedup over
target only, committed tokens per verify step, and whether every side's greedy output equals
target-only's.

    python bench/bench_handoff.py [--profile cpu] [--k 4] [--concurrency 4] [--tokens 48] [--repeats 3]
        [--workloads grounded,chat,code]

Writes bench/figures/handoff-PROFILE.json (figures, machine, commit).
"""

import argparse
import statistics
import time
from dataclasses import replace
from pathlib import Path

from orchestrator.assemble import assemble
from orchestrator.config import SamplingParams
from orchestrator.latency import load_workload
from orchestrator.models import encode_prompt
from orchestrator.profiles import load_profile

from common import machine_line, write_report


def wave(engine, prompts: list[list[int]], tokens: int) -> dict:
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    t0 = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    while engine.has_work():
        engine.step()
    wall = time.perf_counter() - t0
    seqs = [engine.release(i) for i in ids]
    steps = sum(s.stats.num_steps for s in seqs)
    return {"wall_s": wall, "committed_per_step": sum(s.stats.num_committed for s in seqs) / max(1, steps),
            "outputs": [s.output_ids for s in seqs]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default="grounded,chat,code")
    args = ap.parse_args()
    env = machine_line()
    config = load_profile(args.profile).engine_config()
    if config.drafter_kind != "onnx" or config.drafter.model is not None:
        raise SystemExit(f"profile {args.profile}: KV handoff needs an onnx self-drafter (no drafter model)")
    own = assemble(replace(config, drafter=replace(config.drafter, kv_handoff=False)), progress=True)
    handed = assemble(replace(config, drafter=replace(config.drafter, kv_handoff=True)), progress=True)
    engines = {
        "target-only": own.engine(num_speculative_tokens=0, k_policy="fixed"),
        f"k={args.k} own prefill": own.engine(num_speculative_tokens=args.k, k_policy="fixed"),
        f"k={args.k} kv handoff": handed.engine(num_speculative_tokens=args.k, k_policy="fixed"),
    }
    report = {"environment": env, "profile": args.profile, "k": args.k, "concurrency": args.concurrency,
              "tokens": args.tokens, "repeats": args.repeats, "workloads": {}}
    for wl in args.workloads.split(","):
        _, items = load_workload(wl)
        prompts = [encode_prompt(own.tokenizer, it.prompt, chat=it.chat) for it in items][:args.concurrency]
        for engine in engines.values():
            wave(engine, prompts[:2], 8)  # warm-up
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for rep in range(args.repeats):
            for name in (list(engines) if rep % 2 == 0 else list(reversed(engines))):
                runs[name].append(wave(engines[name], prompts, args.tokens))
        reference = runs["target-only"][0]["outputs"]
        cell = {"prompt_tokens": [len(p) for p in prompts], "sides": {}}
        for name, rs in runs.items():
            walls = [r["wall_s"] for r in rs]
            cell["sides"][name] = {"wall_s": walls, "median_wall_s": statistics.median(walls),
                                   "committed_per_step": rs[0]["committed_per_step"],
                                   "identical": all(r["outputs"] == reference for r in rs)}
        base = cell["sides"]["target-only"]["median_wall_s"]
        for side in cell["sides"].values():
            side["speedup_vs_target_only"] = base / side["median_wall_s"]
        report["workloads"][wl] = cell
        shown = " | ".join(f"{n} {s['median_wall_s']:.2f} s ({min(s['wall_s']):.2f}-{max(s['wall_s']):.2f}) "
                           f"{s['speedup_vs_target_only']:.2f}x, {s['committed_per_step']:.2f}/step, "
                           f"identical {s['identical']}" for n, s in cell["sides"].items())
        print(f"{wl:<8} prompts {cell['prompt_tokens']}: {shown}", flush=True)
    write_report(f"handoff-{Path(args.profile).stem}", report)


if __name__ == "__main__":
    main()
