"""Overhead of leaving spans on: the same engines with spans on and off, side by side.

Four sides share one target and one drafter: speculative (k) with spans on / off, and
target-only with spans on / off. Each pair runs back to back on every prompt, in ABBA order
(on, off, then off, on for the next prompt), so the machine's drift hits both alike. Prints
tokens/s of both sides of each pair, the ratio, the median of the per-prompt ratios, and the
cost of one span from a microbenchmark.

Request-level pairs still see this shared machine's noise (a few % per request). So the same
engine is also measured step by step, spans toggled on and off every other step within each
request: mean and median decode-step time of "on" steps vs "off" steps, drift cancelled per
step (equal work per step, identical outputs, so the step-time ratio is the tokens/s ratio).

    python bench/bench_profiler.py [--profile cpu] [--workload chat] [--prompts 12] [--tokens 64] [--k 4]
"""

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from orchestrator.config import SamplingParams  # noqa: E402
from orchestrator.engine import Engine  # noqa: E402
from orchestrator.latency.runner import Side, build_sides, encode, run_request, warm_up  # noqa: E402
from orchestrator.latency.workloads import load_workload  # noqa: E402
from orchestrator.profiles import load_profile  # noqa: E402
from orchestrator.tracing import Tracer, Track  # noqa: E402


def span_cost_us(n: int = 200_000) -> float:
    """Microseconds one enabled span costs on the CPU track (timer, record, flush)."""
    tracer, track = Tracer(), Track("cpu", "host")
    t0 = time.perf_counter()
    for i in range(n):
        with tracer.span("emit", track, i, 0):
            pass
        if i % 8 == 7:
            tracer.flush()
            tracer.spans.clear()
    return (time.perf_counter() - t0) / n * 1e6


def twin(side: Side, name: str) -> Side:
    """The same engine configuration (same target and drafter), spans off."""
    e = side.engine
    engine = Engine(e.target, e.tokenizer, e.drafter, num_speculative_tokens=side.k, max_num_seqs=1,
                    eos_token_ids=tuple(e.eos_token_ids), k_policy=e.policy.policy, tracer=Tracer(enabled=False))
    return Side(name, side.k, engine)


def tps(requests: list[dict]) -> float:
    return sum(r["output_tokens"] for r in requests) / sum(r["wall_ms"] for r in requests) * 1e3


def abba(pairs: list[tuple[Side, Side]], prompts: list[list[int]], params: SamplingParams) -> dict:
    """Each pair back to back on every prompt, order flipping per prompt -> requests per side."""
    results = {s.name: [] for pair in pairs for s in pair}
    for i, ids in enumerate(prompts):
        for pair in pairs:
            for side in (pair if i % 2 == 0 else pair[::-1]):
                results[side.name].append(run_request(side, ids, params, i))
    return results


def step_toggle(side: Side, prompts: list[list[int]], params: SamplingParams) -> tuple[list[float], list[float]]:
    """Spans on for every other decode step (phase flipping per prompt) -> (on, off) step times in ms.

    Step time, not tokens per step: a step drafts k and verifies k + 1 whatever gets accepted,
    while the tokens it commits vary with acceptance (that would swamp a 1% effect).
    """
    engine, tracer = side.engine, side.engine.tracer
    times: tuple[list[float], list[float]] = ([], [])
    for i, ids in enumerate(prompts):
        seq_id = engine.add_request(ids, params)
        tracer.enabled = True
        engine.step()  # the prefill: a different kind of step, left out
        step = 0
        while engine.has_work():
            on = (step + i) % 2 == 0
            tracer.enabled = on
            t0 = time.perf_counter()
            engine.step()
            times[0 if on else 1].append((time.perf_counter() - t0) * 1e3)
            step += 1
        engine.release(seq_id)
        tracer.enabled = True
        tracer.clear()
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--workload", default="chat")
    ap.add_argument("--prompts", type=int, default=12, help="cycles through the workload's prompts")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4)
    args = ap.parse_args()
    profile = load_profile(args.profile)
    name, config = profile.name, profile.engine_config()
    sides, tokenizer = build_sides(config, [args.k], progress=False)
    base_on, spec_on = sides
    base_on.name, spec_on.name = "target-only spans on", f"k={args.k} spans on"
    pairs = [(spec_on, twin(spec_on, f"k={args.k} spans off")), (base_on, twin(base_on, "target-only spans off"))]
    _, items = load_workload(args.workload)
    prompts = [encode(tokenizer, items[i % len(items)]) for i in range(args.prompts)]
    warm_up([s for pair in pairs for s in pair], prompts[0])
    results = abba(pairs, prompts, SamplingParams(max_new_tokens=args.tokens, ignore_eos=True))
    print(f"profile {name}, {len(prompts)} {args.workload} prompts x {args.tokens} tokens, pairs ABBA")
    report = {"span_cost_us": span_cost_us()}
    for on, off in pairs:
        a, b = tps(results[on.name]), tps(results[off.name])
        per_prompt = [y["wall_ms"] / x["wall_ms"] for x, y in zip(results[on.name], results[off.name])]
        spans = sum(len(r["spans"]) for r in results[on.name])
        tokens = sum(r["output_tokens"] for r in results[on.name])
        print(f"{on.name:<22} {a:7.2f} tok/s | {off.name:<22} {b:7.2f} tok/s | ratio {a / b:.3f}, "
              f"median per-prompt ratio {statistics.median(per_prompt):.3f} "
              f"(range {min(per_prompt):.3f}-{max(per_prompt):.3f}; {spans / tokens:.1f} spans per token)")
        report[on.name] = {"on_tps": a, "off_tps": b, "ratio": a / b, "per_prompt_ratios": per_prompt,
                           "spans_per_token": spans / tokens}
    for side in (pair[0] for pair in pairs):
        on, off = step_toggle(side, prompts, SamplingParams(max_new_tokens=args.tokens, ignore_eos=True))
        mean_on, mean_off = statistics.fmean(on), statistics.fmean(off)
        med_on, med_off = statistics.median(on), statistics.median(off)
        print(f"{side.name.replace(' spans on', ''):<22} step toggle, {len(on)} + {len(off)} decode steps: "
              f"mean step spans on {mean_on:.2f} ms | off {mean_off:.2f} ms | tokens/s ratio {mean_off / mean_on:.3f}; "
              f"median {med_on:.2f} | {med_off:.2f} ms, ratio {med_off / med_on:.3f}")
        report[side.name]["step_toggle"] = {"on_ms": on, "off_ms": off, "mean_ratio": mean_off / mean_on,
                                            "median_ratio": med_off / med_on}
    print(f"one span costs {report['span_cost_us']:.2f} us (microbenchmark, CPU track)")
    out = Path(__file__).parent / "out"
    out.mkdir(exist_ok=True)
    (out / "profiler-overhead.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
