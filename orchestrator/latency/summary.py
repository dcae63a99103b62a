"""Per-side and run-level metrics from a run's raw requests and spans.

The Leviathan et al. (2023) bound on speculative speedup, for per-token acceptance α, draft
length k and cost ratio c:
    speedup <= (1 - α^(k+1)) / ((1 - α) (k c + 1))
α is measured as accepted / (accepted + rejected) draft tokens (the per-token acceptance
probability under the i.i.d. model: every step ends at its first rejection, or accepts all).
c = (draft + transfer time per draft token) / (baseline target time per decoded token); with
overlapped drafting only what the engine waited for counts (fresh drafts, the `wait` for a pre-draft
that outlasted the verify), not the pre-drafts the verify hid.
The bound assumes a verify over k + 1 positions costs one target step. We also report it
with the measured verify cost v (a speculative step's time outside drafting and transfer ÷
the baseline step): (1 - α^(k+1)) / ((1 - α)(k c + v)); the gap between the two bounds is
what wider verification costs on this device.
"""

from collections import defaultdict

import numpy as np

from orchestrator.engine.overlap import OverlapStats
from orchestrator.latency.runner import BASELINE, OVERLAP_COUNTS
from orchestrator.tracing import PHASES, is_ahead, phase_of

TRANSFER_PHASES = ("d2h", "serialize", "wire", "deserialize", "h2d")
# a remote drafter's `wire` time lies inside the engine's `draft` span, which waited for the round trip:
# counted once (as transfer), never twice
NESTED_PHASES = ("wire",)
PERCENTILES = (50, 90, 99)


def leviathan_bound(alpha: float, k: int, c: float, v: float = 1.0) -> float:
    """(1 - α^(k+1)) / ((1 - α)(k c + v)); v = 1 is Leviathan's bound; the α -> 1 limit is (k + 1) / (k c + v)."""
    expected_tokens = k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected_tokens / (k * c + v)


def percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    arr = np.asarray(values, dtype=np.float64)
    out = {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}
    out["mean"] = float(arr.mean())
    return out


def phase_stats(requests: list[dict]) -> dict:
    """Per phase that occurred: per-step time percentiles, total, count, and totals per track. Work done
    ahead (`draft_ahead`, `wire_ahead`: overlapped drafting) is a phase apart: it ran beside the others."""
    per_step: dict[str, dict[tuple, float]] = defaultdict(lambda: defaultdict(float))
    by_track: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in requests:
        for s in r["spans"]:
            phase = phase_of(s["name"], s.get("args", {}))
            per_step[phase][(r["prompt_index"], s.get("step"))] += s["dur_ms"]
            by_track[phase][f"{s['device']} {s['role']}"] += s["dur_ms"]
    order = [p for p in PHASES if p in per_step] + sorted(set(per_step) - set(PHASES))
    return {name: {"total_ms": sum(per_step[name].values()), "num_steps": len(per_step[name]),
                   "per_step_ms": percentiles(list(per_step[name].values())),
                   "by_track_ms": dict(by_track[name])} for name in order}


def acceptance(requests: list[dict]) -> dict:
    """Acceptance per draft position, α, mean accepted length, from the commit spans' counts."""
    drafted: list[int] = []
    accepted: list[int] = []
    num_steps = num_accepted = num_rejected = num_committed = 0
    for r in requests:
        for s in r["spans"]:
            if s["name"] != "commit" or "num_draft" not in s.get("args", {}):  # prefill commits have none
                continue
            d, a = s["args"]["num_draft"], s["args"]["num_accepted"]
            grow = d - len(drafted)
            drafted += [0] * max(0, grow)
            accepted += [0] * max(0, grow)
            for j in range(d):
                drafted[j] += 1
                accepted[j] += j < a
            num_steps += 1
            num_accepted += a
            num_rejected += a < d
            num_committed += a + 1
    evaluated = num_accepted + num_rejected
    return {
        "drafted_per_position": drafted,
        "accepted_per_position": accepted,
        "acceptance_per_position": [a / d if d else 0.0 for a, d in zip(accepted, drafted)],
        "acceptance_rate": num_accepted / sum(drafted) if drafted and sum(drafted) else 0.0,
        "alpha": num_accepted / evaluated if evaluated else 0.0,
        "num_verify_steps": num_steps,
        "mean_accepted_length": num_committed / num_steps if num_steps else 0.0,
    }


def side_summary(side: dict) -> dict:
    """Throughput, latency, phases and acceptance of one side."""
    reqs = side["requests"]
    tokens = sum(r["output_tokens"] for r in reqs)
    wall_ms = sum(r["wall_ms"] for r in reqs)
    decode_ms = sum(r["wall_ms"] - r["ttft_ms"] for r in reqs)
    decode_tokens = sum(max(0, r["output_tokens"] - 1) for r in reqs)
    span_ms = sum(s["dur_ms"] for r in reqs for s in r["spans"]
                  if not s.get("args", {}).get("ahead") and s["name"] not in NESTED_PHASES)
    phases = phase_stats(reqs)
    return {
        "num_requests": len(reqs),
        "output_tokens": tokens,
        "wall_ms": wall_ms,
        "span_ms": span_ms,
        "span_coverage": span_ms / wall_ms if wall_ms else 0.0,  # phases add up to wall time at 1.0
        "tokens_per_s": tokens / wall_ms * 1e3 if wall_ms else 0.0,
        "tpot_ms": decode_ms / decode_tokens if decode_tokens else None,
        "ttft_ms": percentiles([r["ttft_ms"] for r in reqs]),
        "tpot_ms_per_request": percentiles([r["tpot_ms"] for r in reqs if r["tpot_ms"] is not None]),
        "phases": phases,
        "acceptance": acceptance(reqs) if side["k"] else None,
        "overlap": overlap(reqs),
    }


def overlap(requests: list[dict]) -> dict | None:
    """Overlapped drafting over the side's requests: pre-drafts launched, hits, the hit rate, the
    worker's time and how much of it the engine waited for (the rest was hidden by the verify)."""
    counts = [r["overlap"] for r in requests if r.get("overlap")]
    if not counts:
        return None
    s = OverlapStats(**{key: sum(c[key] for c in counts) for key in OVERLAP_COUNTS})
    return {"launched": s.launched, "hits": s.hits, "misses": s.misses, "hit_rate": s.hit_rate,
            "ahead_ms": s.ahead_s * 1e3, "waited_ms": s.exposed_s * 1e3, "hidden_ms": s.hidden_s * 1e3}


def predictions(requests: list[dict]) -> dict:
    """The k policy's cost model, before each step (the verify span's `expected_*`), against what the
    step realised (tokens its commit spans committed, the time all its spans took); `by_draft` splits the
    steps by how many tokens they drafted, with the drafter's and the target's share of the time, so a
    draft length whose steps cost more than the model expects shows itself."""
    steps: dict[tuple, dict] = defaultdict(lambda: {"tokens": 0, "ms": 0.0, "draft_ms": 0.0, "verify_ms": 0.0,
                                                    "drafted": 0})
    for r in requests:
        for s in r["spans"]:
            args = s.get("args", {})
            if args.get("ahead"):
                continue  # beside the step's other spans: the engine paid only its `wait`
            step = steps[(r["prompt_index"], s.get("step"))]
            step["ms"] += s["dur_ms"]
            if s["name"] in ("draft", "verify"):
                step[f"{s['name']}_ms"] += s["dur_ms"]
            if s["name"] == "verify" and "expected_tokens" in args:
                step["expected_tokens"], step["expected_ms"] = args["expected_tokens"], args["expected_ms"]
            if s["name"] == "commit" and "num_draft" in args:
                step["tokens"] += args["num_accepted"] + 1
                step["drafted"] += args["num_draft"]
    measured = [st for st in steps.values() if "expected_tokens" in st]
    if not measured:
        return {}
    by_draft = {}
    for drafted in sorted({st["drafted"] for st in measured}):
        group = [st for st in measured if st["drafted"] == drafted]
        by_draft[str(drafted)] = {"num_steps": len(group),
                                  **{key: sum(st[key] for st in group) / len(group)
                                     for key in ("expected_tokens", "tokens", "expected_ms", "ms", "draft_ms",
                                                 "verify_ms")}}
    return {**_prediction_totals(measured), "by_draft": by_draft}


def _prediction_totals(measured: list[dict]) -> dict:
    n = len(measured)
    got_tokens, got_ms = sum(st["tokens"] for st in measured), sum(st["ms"] for st in measured)
    want_tokens, want_ms = sum(st["expected_tokens"] for st in measured), sum(st["expected_ms"] for st in measured)
    return {"num_steps": n, "predicted_tokens_per_step": want_tokens / n, "realised_tokens_per_step": got_tokens / n,
            "predicted_ms_per_step": want_ms / n, "realised_ms_per_step": got_ms / n,
            # realised tokens/s over predicted tokens/s: 1.0 when the model foresaw the step exactly
            "rate_ratio": (got_tokens / got_ms) / (want_tokens / want_ms) if got_ms and want_ms else 0.0}


def speculation(side: dict, summary: dict, base: dict) -> dict:
    """Speedup over the baseline, α, c, the Leviathan bound and achieved / bound, and how well the
    k policy's cost model predicted the steps."""
    acc, phases = summary["acceptance"], summary["phases"]
    num_drafted = sum(acc["drafted_per_position"])
    # drafting on the critical path: drafts made there, and waits for a pre-draft that outlasted the verify
    transfer_ms = sum(phases[p]["total_ms"] for p in TRANSFER_PHASES if p in phases)
    nested_ms = sum(phases[p]["total_ms"] for p in NESTED_PHASES if p in phases)
    draft_ms = sum(phases.get(p, {}).get("total_ms", 0.0) for p in ("draft", "wait")) - nested_ms
    target_step_ms = base["tpot_ms"]
    c = (draft_ms + transfer_ms) / num_drafted / target_step_ms if num_drafted and target_step_ms else 0.0
    # the auto policy varies k: its bound uses the mean draft length it chose
    k = side["k"] if side.get("policy", "fixed") != "auto" else num_drafted / max(1, acc["num_verify_steps"])
    bound = leviathan_bound(acc["alpha"], k, c)
    speedup_decode = target_step_ms / summary["tpot_ms"] if summary["tpot_ms"] else 0.0
    # v: a verify step's own cost (all but drafting, transfers and the prefill) in baseline steps
    verify_ms = sum(st["total_ms"] for p, st in phases.items()
                    if p not in ("draft", "wait", "prefill", *TRANSFER_PHASES) and not is_ahead(p))
    v = verify_ms / acc["num_verify_steps"] / target_step_ms if acc["num_verify_steps"] and target_step_ms else 1.0
    return {
        "k": side["k"],
        "policy": side.get("policy", "fixed"),
        "mean_k": num_drafted / max(1, acc["num_verify_steps"]),
        "speedup": summary["tokens_per_s"] / base["tokens_per_s"] if base["tokens_per_s"] else 0.0,
        "speedup_decode": speedup_decode,
        "alpha": acc["alpha"],
        "c": c,
        "draft_ms_per_token": draft_ms / num_drafted if num_drafted else 0.0,
        "transfer_ms_per_token": transfer_ms / num_drafted if num_drafted else 0.0,
        "target_step_ms": target_step_ms,
        "transfer_phases": [p for p in TRANSFER_PHASES if p in phases],
        "bound": bound,
        "efficiency": speedup_decode / bound if bound else 0.0,
        "verify_cost": v,
        "prediction": predictions(side["requests"]),
    }


def summarize(run: dict, headline: str | None = None) -> dict:
    """Adds `summary` to every side and a run-level `summary` (of the `headline` side: by default the
    auto policy's when it ran, else the middle fixed k); returns the run."""
    for side in run["sides"]:
        side["summary"] = side_summary(side)
    base = next(s for s in run["sides"] if s["name"] == BASELINE)["summary"]
    spec = {}
    for side in run["sides"]:
        if side["k"]:
            side["summary"]["speculation"] = spec[side["name"]] = speculation(side, side["summary"], base)
    fixed = sorted((s["k"], s["name"]) for s in run["sides"] if s["k"] and s.get("policy", "fixed") == "fixed")
    if headline not in spec:
        headline = "auto" if "auto" in spec else fixed[len(fixed) // 2][1]
    h = spec[headline]
    run["summary"] = {"baseline": BASELINE, "headline": headline, "ks": [k for k, _ in fixed],
                      "efficiency_goal": 0.85, **{f: h[f] for f in ("speedup", "speedup_decode", "alpha", "c", "bound",
                                                                    "efficiency", "verify_cost", "mean_k")},
                      "prediction": h["prediction"]}
    run["summary"]["efficiency_goal_met"] = run["summary"]["efficiency"] >= 0.85
    return run
