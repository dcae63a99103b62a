"""Speculation control, side by side in one run: target-only, fixed k and the auto cost model.

Grid: workloads (chat / grounded / code) x concurrency (1 / 4 / 16 requests in the running batch)
x {target-only, fixed k = 2, 4, 8, auto}, on one profile's target and drafter (built once). A cell
runs every prompt of the workload at least once, with `concurrency` requests in flight: when one
finishes, the next prompt takes its place (a closed loop of `concurrency` clients, as serving benches
run; at x1, one prompt after another); throughput is the committed tokens over the cell's wall time.
`--waves` admits `concurrency` requests together and the next wave once all have finished instead: the
batch thins out at every wave's tail, which the cost model, choosing k step by step, does not foresee
(chat x4: k = 3 commits 2.72 tokens a sequence-step against k = 2's 2.39 in 1.13x the step time, yet
loses 4-7% in waves, the mean batch 3.55 against 3.76). Each
cell runs every configuration `--repeats` times, the order reversed every other repeat (ABBA), after
a warm-up of each. Ratios are paired: auto's run against the other configuration's run in the same
repeat (minutes apart at most, so a host that drifts between repeats cancels out), and the cell reports
the median of those ratios with their range. Goals (issue 14): auto >= 0.98x target-only in every
cell, >= 0.95x the best fixed k in every cell, and >= 1.05x the best fixed k in at least two.

    python bench/bench_control.py [--profile cpu] [--tokens 48] [--repeats 2] [--workloads chat,grounded,code]
        [--concurrency 1,4,16] [--waves] [--stretch]

Writes bench/figures/control-PROFILE.json, or NAME.json with `--name NAME` (figures, spread of repeats, machine,
commit).
"""

import argparse
import statistics
import time
from pathlib import Path

from orchestrator.assemble import assemble
from orchestrator.config import SamplingParams
from orchestrator.latency import load_workload
from orchestrator.models import encode_prompt
from orchestrator.profiles import load_profile

from common import add_name_arg, machine_line, write_report

FIXED = (2, 4, 8)


def run_batch(engine, prompts: list[list[int]], tokens: int, concurrency: int,
              waves: bool = False) -> tuple[float, list[list[int]], dict]:
    """The prompts with `concurrency` requests in flight: a finished request's place goes to the next
    prompt at once (a closed loop of `concurrency` clients), or, `waves`, `concurrency` requests
    admitted together and the next wave once all of them finish (the batch thins out at each wave's
    tail). -> (committed tokens per second, outputs in prompt order, k choices)."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    t0 = time.perf_counter()
    queue, running, done = list(enumerate(prompts)), {}, {}
    while queue or running:
        if not waves or not running:
            while queue and len(running) < concurrency:
                index, prompt = queue.pop(0)
                running[engine.add_request(prompt, params)] = index
        for out in engine.step():
            if out.finished:
                done[running.pop(out.seq_id)] = engine.release(out.seq_id)
    elapsed = time.perf_counter() - t0
    seqs = [done[i] for i in range(len(prompts))]
    ks: dict[int, int] = {}
    for s in seqs:
        for k, n in s.stats.steps_per_k.items():
            ks[k] = ks.get(k, 0) + n
    return sum(len(s.output_ids) for s in seqs) / elapsed, [s.output_ids for s in seqs], ks


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--workloads", default="chat,grounded,code")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--waves", action="store_true", help="admit requests in waves, not as places free up")
    ap.add_argument("--stretch", action="store_true",
                    help="one more side: auto whose confident drafts run past the plan's k (off by default)")
    add_name_arg(ap, "control-PROFILE")
    args = ap.parse_args()
    report_name = args.name or f"control-{Path(args.profile).stem}"
    env = machine_line()
    profile = load_profile(args.profile)
    config = profile.engine_config()
    parts = assemble(config, progress=True)
    k_auto = config.num_speculative_tokens if config.k_policy == "auto" else max(FIXED)
    configs = {"target-only": 0, **{f"k={k}": k for k in FIXED}, "auto": "auto"}
    if args.stretch:
        configs["auto+stretch"] = "auto"
    report = {"environment": env, "profile": args.profile, "tokens": args.tokens, "repeats": args.repeats,
              "admission": "waves" if args.waves else "continuous", "cells": []}
    print(f"profile {args.profile}: {config.model} {config.dtype} on {config.device}, drafter {config.drafter_kind}; "
          f"{args.tokens} tokens per request, {args.repeats} repeats (ABBA), "
          f"{'waves' if args.waves else 'continuous admission'}", flush=True)
    for wl in args.workloads.split(","):
        _, items = load_workload(wl)
        encoded = [encode_prompt(parts.tokenizer, item.prompt, chat=item.chat) for item in items]
        for conc in [int(c) for c in args.concurrency.split(",")]:
            rounds = -(-len(encoded) // conc)  # enough requests for every prompt to run at least once
            prompts = [encoded[i % len(encoded)] for i in range(conc * rounds)]
            engines = {}
            for name, k in configs.items():  # fresh engines per cell: the cost model learns in the cell
                policy = "auto" if k == "auto" else "fixed"
                engines[name] = parts.engine(num_speculative_tokens=k_auto if k == "auto" else k,
                                             max_num_seqs=max(16, conc), k_policy=policy)
                engines[name].policy.stretch = name == "auto+stretch"
                run_batch(engines[name], prompts[:min(conc, 2)], 8, conc, args.waves)  # warm-up
            results: dict[str, list[float]] = {name: [] for name in configs}
            outputs, ks = {}, {}
            for rep in range(args.repeats):
                order = list(configs) if rep % 2 == 0 else list(reversed(configs))
                for name in order:
                    tps, out, chosen = run_batch(engines[name], prompts, args.tokens, conc, args.waves)
                    results[name].append(tps)
                    outputs[name], ks[name] = out, chosen
            med = {name: statistics.median(v) for name, v in results.items()}
            best_fixed = max((n for n in configs if n.startswith("k=")), key=med.get)
            vs_target = [a / b for a, b in zip(results["auto"], results["target-only"])]
            vs_best = [a / b for a, b in zip(results["auto"], results[best_fixed])]
            if args.stretch:
                vs_stretch = [a / b for a, b in zip(results["auto+stretch"], results["auto"])]
            cell = {"workload": wl, "concurrency": conc, "requests": len(prompts), "tokens_per_s": results,
                    "median": med, "best_fixed": best_fixed,
                    "auto_vs_target_only": statistics.median(vs_target), "auto_vs_target_only_range": _range(vs_target),
                    "auto_vs_best_fixed": statistics.median(vs_best), "auto_vs_best_fixed_range": _range(vs_best),
                    "target_only_spread": max(results["target-only"]) / min(results["target-only"]),
                    "auto_k_steps": {str(k): n for k, n in sorted(ks["auto"].items())},
                    "identical_greedy": all(outputs[n] == outputs["target-only"] for n in configs)}
            if args.stretch:
                cell.update(stretch_vs_auto=statistics.median(vs_stretch), stretch_vs_auto_range=_range(vs_stretch),
                            stretch_k_steps={str(k): n for k, n in sorted(ks["auto+stretch"].items())})
            report["cells"].append(cell)
            report["complete"] = False  # each cell is written as it ends: a run cut short keeps what it measured
            write_report(report_name, report, quiet=True)
            spread = " ".join(f"{n} {med[n]:.1f} ({min(results[n]):.1f}-{max(results[n]):.1f})" for n in configs)
            print(f"{wl:<8} x{conc:<2} tok/s: {spread} | auto/target-only {cell['auto_vs_target_only']:.2f} "
                  f"{_show(vs_target)} auto/{best_fixed} {cell['auto_vs_best_fixed']:.2f} {_show(vs_best)} "
                  f"| target-only spread {cell['target_only_spread']:.2f} | auto k steps {cell['auto_k_steps']} "
                  f"| identical {cell['identical_greedy']}"
                  + (f" | auto+stretch/auto {cell['stretch_vs_auto']:.2f} {_show(vs_stretch)}" if args.stretch else ""),
                  flush=True)
    cells = report["cells"]
    report["goals"] = {
        "auto_ge_0.98_target_only_everywhere": all(c["auto_vs_target_only"] >= 0.98 for c in cells),
        "auto_ge_0.95_best_fixed_everywhere": all(c["auto_vs_best_fixed"] >= 0.95 for c in cells),
        "auto_beats_best_fixed_by_5pct_in_2_cells": sum(c["auto_vs_best_fixed"] >= 1.05 for c in cells) >= 2,
    }
    report["complete"] = True
    print("goals:", report["goals"], flush=True)
    write_report(report_name, report)


def _range(ratios: list[float]) -> list[float]:
    return [min(ratios), max(ratios)]


def _show(ratios: list[float]) -> str:
    return f"({min(ratios):.2f}-{max(ratios):.2f})"


if __name__ == "__main__":
    main()
