"""Acceptance policies side by side in one run: lossless (rejection, strict) against the lossy ones.

Every setting runs the same prompts (chat / grounded / code workloads, one request at a time, greedy)
over one profile's target and drafter, `--repeats` times in alternating order (ABBA) after a warm-up,
beside target-only. Per setting and workload: tokens/s, speedup over target-only (paired per repeat),
mean accepted length, and two agreements with the lossless output:

    agreement         share of output tokens the target would have chosen itself after the same
                      prefix (1 - tokens_differing / tokens: what the quality budget bounds)
    prefix agreement  share of the target-only output reproduced before the first difference

and the drift estimate (mean probability the target put above the committed token). Goal (issue 17):
a quality-budgeted lossy policy beats the lossless default's speedup with agreement >= 0.95 on the
grounded workload.

Part two, several drafters: on a mixed workload (the grounded prompts and the chat prompts, one request
at a time) the profile's model drafter alone, the n-gram lookup alone, and both combined by confidence
(lookup first), each against target-only, lossless (greedy outputs checked identical). Goal: the
combination beats each single drafter.

    python bench/bench_policies.py [--profile cpu] [--tokens 48] [--repeats 2] [--workloads chat,grounded,code]
        [--part policies|drafters|both]

Writes bench/figures/policies-PROFILE.json (figures, spread of repeats, machine, commit);
`--part drafters` writes policies-drafters-PROFILE.json.
"""

import argparse
import statistics
import time

from orchestrator.assemble import assemble
from orchestrator.config import SamplingParams
from orchestrator.drafters.combined import CombinedDrafter
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.engine import Engine
from orchestrator.latency import load_workload
from orchestrator.models import encode_prompt
from orchestrator.profiles import load_profile

from common import machine_line, write_report

SETTINGS = {  # name -> (policy, options)
    "rejection": ("rejection", ()),
    "strict": ("strict", ()),
    "nkl d=0.15": ("nkl", (("delta", 0.15),)),
    "nkl d=0.3": ("nkl", (("delta", 0.3),)),
    "position-adaptive": ("position-adaptive", ()),
    "block m=3": ("block", (("m", 3.0),)),
    "typical": ("typical", ()),
    "relaxed n=4 d=0.1": ("relaxed", (("top_n", 4.0), ("delta", 0.1))),
    "relaxed n=4 d=0.3": ("relaxed", (("top_n", 4.0), ("delta", 0.3))),
    "relaxed n=4 d=0.3 no budget": ("relaxed", (("top_n", 4.0), ("delta", 0.3), ("budget", 1.0))),
}


def run(engine, prompts: list[list[int]], tokens: int, policy: str | None, options: tuple) -> tuple[float, list]:
    """One request at a time; -> (tokens per second, finished sequences)."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True, acceptance=policy, acceptance_options=options)
    t0 = time.perf_counter()
    seqs = [engine.generate(p, params) for p in prompts]
    return sum(len(s.output_ids) for s in seqs) / (time.perf_counter() - t0), seqs


def prefix_share(out: list[int], ref: list[int]) -> float:
    same = next((i for i, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
    return same / len(ref)


def several_drafters(parts, args) -> dict:
    """Model alone, lookup alone, both combined, on grounded + chat prompts one at a time."""
    prompts = [encode_prompt(parts.tokenizer, it.prompt, chat=it.chat)
               for wl in ("grounded", "chat") for it in load_workload(wl)[1]]
    k = parts.config.num_speculative_tokens

    def engine(drafter):
        return Engine(parts.target, parts.tokenizer, drafter, num_speculative_tokens=k if drafter else 0,
                      eos_token_ids=parts.eos_token_ids, k_policy=parts.config.k_policy, staging=parts.staging)

    combined = CombinedDrafter([NgramDrafter(), parts.drafter])
    sides = {"target-only": engine(None), parts.drafter.name: engine(parts.drafter), "ngram": engine(NgramDrafter()),
             combined.name: engine(combined)}
    for e in sides.values():
        run(e, prompts[:1], 8, None, ())
    tps: dict[str, list[float]] = {n: [] for n in sides}
    seqs: dict[str, list] = {}
    for rep in range(args.repeats):
        for name in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
            rate, seqs[name] = run(sides[name], prompts, args.tokens, None, ())
            tps[name].append(rate)
    reference = [s.output_ids for s in seqs["target-only"]]
    out = {"workload": "grounded+chat", "prompts": len(prompts), "sides": {}}
    for name in sides:
        stats = [s.stats for s in seqs[name]]
        speedups = [a / b for a, b in zip(tps[name], tps["target-only"])]
        row = {"tokens_per_s": tps[name], "speedup": statistics.median(speedups),
               "speedup_range": [min(speedups), max(speedups)],
               "mean_accepted_length": sum(s.num_committed for s in stats) / max(1, sum(s.num_steps for s in stats)),
               "identical_greedy": [s.output_ids for s in seqs[name]] == reference}
        out["sides"][name] = row
        print(f"mixed    {name:<22} {statistics.median(tps[name]):6.1f} tok/s  speedup {row['speedup']:.2f} "
              f"({row['speedup_range'][0]:.2f}-{row['speedup_range'][1]:.2f})  accepted length "
              f"{row['mean_accepted_length']:.2f}  identical {row['identical_greedy']}", flush=True)
    out["combined_served"] = dict(zip([d.name for d in combined.drafters], combined.chosen))
    singles = [out["sides"][n]["speedup"] for n in (parts.drafter.name, "ngram")]
    out["goal_combined_beats_each_single"] = out["sides"][combined.name]["speedup"] > max(singles)
    print(f"combined served (sequence-steps): {out['combined_served']}; beats each single drafter: "
          f"{out['goal_combined_beats_each_single']}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--workloads", default="chat,grounded,code")
    ap.add_argument("--part", choices=("policies", "drafters", "both"), default="both")
    args = ap.parse_args()
    env = machine_line()
    config = load_profile(args.profile).engine_config()
    parts = assemble(config, progress=True)
    print(f"profile {args.profile}: {config.model} {config.dtype}, drafter {config.drafter_kind}, k "
          f"{config.k_policy} <= {config.num_speculative_tokens}; {args.tokens} tokens, {args.repeats} repeats", flush=True)
    report = {"environment": env, "profile": args.profile, "tokens": args.tokens, "repeats": args.repeats,
              "settings": {n: {"policy": p, "options": dict(o)} for n, (p, o) in SETTINGS.items()}, "cells": []}
    if args.part in ("drafters", "both"):
        report["drafters"] = several_drafters(parts, args)
    if args.part == "drafters":  # beside a full run's figures, not over them
        write_report(f"policies-drafters-{args.profile}", report)
        return
    sides = {"target-only": (None, ()), **SETTINGS}
    for wl in args.workloads.split(","):
        _, items = load_workload(wl)
        prompts = [encode_prompt(parts.tokenizer, it.prompt, chat=it.chat) for it in items]
        engines = {n: parts.engine(num_speculative_tokens=0 if n == "target-only" else None) for n in sides}
        for name, (policy, options) in sides.items():
            run(engines[name], prompts[:1], 8, policy, options)  # warm-up (and the cost model's first steps)
        tps: dict[str, list[float]] = {n: [] for n in sides}
        seqs: dict[str, list] = {}
        for rep in range(args.repeats):
            for name in (list(sides) if rep % 2 == 0 else list(reversed(sides))):
                rate, seqs[name] = run(engines[name], prompts, args.tokens, *sides[name])
                tps[name].append(rate)
        reference = [s.output_ids for s in seqs["target-only"]]
        for name in SETTINGS:
            stats = [s.stats for s in seqs[name]]
            out_tokens = sum(len(s.output_ids) for s in seqs[name])
            speedups = [a / b for a, b in zip(tps[name], tps["target-only"])]
            cell = {"workload": wl, "setting": name, "lossy": stats[0].lossy,
                    "tokens_per_s": tps[name], "target_only_tokens_per_s": tps["target-only"],
                    "speedup": statistics.median(speedups), "speedup_range": [min(speedups), max(speedups)],
                    "mean_accepted_length": sum(s.num_committed for s in stats) / max(1, sum(s.num_steps for s in stats)),
                    "agreement": 1 - sum(s.tokens_differing for s in stats) / out_tokens,
                    "prefix_agreement": statistics.mean(prefix_share(s.output_ids, r) for s, r in zip(seqs[name], reference)),
                    "drift_prob_gap": sum(s.prob_gap for s in stats) / out_tokens,
                    "budget_exhausted": sum(s.budget_exhausted_at >= 0 for s in stats)}
            if not cell["lossy"]:
                assert [s.output_ids for s in seqs[name]] == reference, f"{name} is lossless but differs"
            report["cells"].append(cell)
            label = f"{name}{' (lossy)' if cell['lossy'] else ''}"
            print(f"{wl:<8} {label:<36} {statistics.median(tps[name]):6.1f} tok/s  speedup {cell['speedup']:.2f} "
                  f"({cell['speedup_range'][0]:.2f}-{cell['speedup_range'][1]:.2f})  accepted length "
                  f"{cell['mean_accepted_length']:.2f}  agreement {cell['agreement']:.3f}  prefix "
                  f"{cell['prefix_agreement']:.2f}  drift {cell['drift_prob_gap']:.4f}  budget spent "
                  f"{cell['budget_exhausted']}/{len(stats)}", flush=True)
    grounded = [c for c in report["cells"] if c["workload"] == "grounded"]
    lossless = next((c["speedup"] for c in grounded if c["setting"] == "rejection"), None)
    winners = [c["setting"] for c in grounded if c["lossy"] and "no budget" not in c["setting"]
               and lossless is not None and c["speedup"] > lossless and c["agreement"] >= 0.95]
    report["goals"] = {"budgeted_lossy_beats_lossless_on_grounded_with_agreement_0.95": winners}
    print("goal: budgeted lossy settings beating rejection on grounded with agreement >= 0.95:", winners or "none")
    write_report(f"policies-{args.profile}", report)


if __name__ == "__main__":
    main()
