"""report.md for one summarized run, and the side-by-side table of two runs (`profile compare`)."""

from orchestrator.latency.summary import PERCENTILES
from orchestrator.tracing import PHASES


def _f(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)] + \
           ["| " + " | ".join(r) + " |" for r in rows]


def _throughput(run: dict) -> list[str]:
    rows = []
    for side in run["sides"]:
        sm = side["summary"]
        spec = sm.get("speculation") or {}
        rows.append([side["name"], str(sm["output_tokens"]), _f(sm["tokens_per_s"]), _f(sm["ttft_ms"].get("p50"), 1),
                     _f(sm["tpot_ms"], 1), _f(spec.get("speedup")), _f(spec.get("speedup_decode")),
                     _f(sm["span_coverage"] * 100, 1)])
    return _table(["side", "tokens", "tokens/s", "TTFT p50 ms", "TPOT ms", "speedup", "decode speedup",
                   "phases / wall %"], rows)


def _phases(side: dict) -> list[str]:
    sm = side["summary"]
    rows = []
    for phase, st in sm["phases"].items():
        pct = st["per_step_ms"]
        tracks = ", ".join(sorted(st["by_track_ms"]))
        rows.append([phase, tracks, *(_f(pct[f"p{q}"]) for q in PERCENTILES), _f(st["total_ms"], 0),
                     _f(100 * st["total_ms"] / sm["wall_ms"], 1)])
    absent = [p for p in PHASES if p not in sm["phases"]]
    lines = _table(["phase", "device track", *(f"p{q} ms/step" for q in PERCENTILES), "total ms", "% of wall"], rows)
    if absent:
        lines.append(f"\nNot present in this run (no such work happened): {', '.join(absent)}.")
    return lines


def _acceptance(run: dict) -> list[str]:
    rows = []
    for side in run["sides"]:
        if not side["k"]:
            continue
        acc, spec = side["summary"]["acceptance"], side["summary"]["speculation"]
        per_pos = " ".join(_f(a) for a in acc["acceptance_per_position"])
        pred = spec["prediction"]
        rows.append([side["name"], per_pos, _f(acc["alpha"]), _f(spec["mean_k"]), _f(acc["mean_accepted_length"]),
                     _f(spec["c"], 3), _f(spec["bound"]), _f(spec["speedup_decode"]), _f(spec["efficiency"]),
                     _f(spec["verify_cost"]), _f(pred.get("predicted_tokens_per_step")),
                     _f(pred.get("realised_tokens_per_step")), _f(pred.get("predicted_ms_per_step"), 1),
                     _f(pred.get("realised_ms_per_step"), 1), _f(pred.get("rate_ratio"))])
    return _table(["side", "acceptance by position", "α", "mean k", "mean accepted length", "c", "bound",
                   "decode speedup", "efficiency", "v", "predicted tok/step", "realised tok/step",
                   "predicted ms/step", "realised ms/step", "realised ÷ predicted rate"], rows)


def _headline(run: dict) -> list[str]:
    s = run["summary"]
    met = "met" if s["efficiency_goal_met"] else "NOT met"
    spec = next(side for side in run["sides"] if side["name"] == s["headline"])["summary"]["speculation"]
    transfer = ", ".join(spec["transfer_phases"]) or "none occurred in this run"
    k = f"k = {spec['k']}" if spec["policy"] == "fixed" else f"{spec['policy']} k (mean {spec['mean_k']:.2f})"
    lines = [
        f"**{k}: decode speedup {s['speedup_decode']:.2f}× (end to end {s['speedup']:.2f}×), "
        f"Leviathan bound {s['bound']:.2f}×, efficiency {s['efficiency']:.2f} "
        f"(goal ≥ {s['efficiency_goal']}: {met}).**",
        "",
        f"Bound = (1 − α^(k+1)) / ((1 − α)(k·c + 1)) with α = {s['alpha']:.3f} "
        f"(accepted ÷ (accepted + rejected) draft tokens) and c = {s['c']:.3f} = "
        f"(draft {spec['draft_ms_per_token']:.2f} ms + transfer {spec['transfer_ms_per_token']:.2f} ms per draft token)"
        f" ÷ target step {spec['target_step_ms']:.2f} ms (baseline TPOT). Transfer phases: {transfer}. "
        f"The bound counts a verify over k + 1 positions as one target step; measured, it cost "
        f"v = {s['verify_cost']:.2f}.",
    ]
    p = s.get("prediction") or {}
    if p:
        lines += ["", f"The k policy's cost model, before each of {p['num_steps']} steps, expected "
                  f"{p['predicted_tokens_per_step']:.2f} tokens in {p['predicted_ms_per_step']:.1f} ms; the steps "
                  f"committed {p['realised_tokens_per_step']:.2f} in {p['realised_ms_per_step']:.1f} ms "
                  f"(realised ÷ predicted tokens/s: {p['rate_ratio']:.2f})."]
    return lines


def _verification(run: dict) -> list[str]:
    """The acceptance policy the speculating sides ran; a lossy one is said so, with its drift."""
    reqs = [r["stats"] for side in run["sides"] if side["k"] for r in side["requests"]]
    policies = sorted({(s.get("acceptance", "rejection"), bool(s.get("lossy"))) for s in reqs})
    if not policies:
        return []
    lines = []
    for name, lossy in policies:
        if not lossy:
            lines.append(f"Acceptance policy: {name} (lossless: the output is the target's own).")
            continue
        mine = [s for s in reqs if s.get("acceptance") == name]
        differing = sum(s.get("tokens_differing", 0) for s in mine)
        lines.append(f"Acceptance policy: **{name} (LOSSY)**: {differing} committed tokens the target would not "
                     f"have chosen, over {len(mine)} requests; the quality budget ran out in "
                     f"{sum(s.get('budget_exhausted_at', -1) >= 0 for s in mine)}.")
    return [*lines, ""]


def _overlap(run: dict) -> list[str]:
    """Overlapped drafting per side that ran it: pre-draft hits and the drafting the verify hid."""
    rows = []
    for side in run["sides"]:
        ov = side["summary"].get("overlap")
        if ov and ov["launched"]:
            rows.append([side["name"], str(ov["launched"]), str(ov["hits"]), str(ov["misses"]), _f(ov["hit_rate"]),
                         _f(ov["ahead_ms"], 1), _f(ov["hidden_ms"], 1), _f(ov["waited_ms"], 1)])
    if not rows:
        return []
    return ["## Overlapped drafting", "",
            "Pre-drafts made while the target verified (phase `draft_ahead`); a hit became the next step's "
            "drafts at no cost on the critical path, a miss drafted afresh. Of the worker's time, the engine "
            "waited for what outlasted the verify (phase `wait`); the rest was hidden.", "",
            *_table(["side", "pre-drafts", "hits", "misses", "hit rate", "worker ms", "hidden ms", "waited ms"],
                    rows), ""]


def _by_draft(run: dict) -> list[str]:
    """The cost model's prediction against each step, grouped by the tokens the step drafted."""
    rows = []
    for side in run["sides"]:
        pred = (side["summary"].get("speculation") or {}).get("prediction") or {}
        for drafted, g in (pred.get("by_draft") or {}).items():
            rows.append([side["name"], drafted, str(g["num_steps"]), _f(g["expected_tokens"]), _f(g["tokens"]),
                         _f(g["expected_ms"], 1), _f(g["ms"], 1), _f(g["draft_ms"], 1), _f(g["verify_ms"], 1)])
    if not rows:
        return []
    return ["## The cost model's prediction by draft length", "",
            "Steps grouped by the tokens they drafted: what the model expected before each step against what "
            "it realised (ms: all the step's spans; draft and verify: those spans alone).", "",
            *_table(["side", "drafted", "steps", "predicted tok/step", "realised tok/step", "predicted ms/step",
                     "realised ms/step", "draft ms/step", "verify ms/step"], rows), ""]


def render_report(run: dict) -> str:
    env, wl = run["environment"], run["workload"]
    lines = [f"# Profiling run: profile `{run['profile']['name']}`, workload `{wl['name']}`", "",
             f"{wl['num_prompts']} prompts × {wl['max_new_tokens']} new tokens, sides interleaved prompt by prompt; "
             f"{run['created']}; torch {env['torch']} ({env['torch_threads']} threads), onnxruntime "
             f"{env['onnxruntime']}, {env['cpu_count']} CPUs, commit {env['git_commit']}. Schema `{run['schema']}`.",
             "", *_headline(run), "", *_verification(run), "## Throughput and latency", "", *_throughput(run), "",
             "## Acceptance and the bound", "", *_acceptance(run), "", *_overlap(run), *_by_draft(run)]
    for side in run["sides"]:
        lines += [f"## Phases: {side['name']}", "", *_phases(side), ""]
    lines += ["## Plots", "", "![latency](latency.png)", "![acceptance](acceptance.png)", "![speedup](speedup.png)", ""]
    return "\n".join(lines)


_COMPARE = [  # (label, getter on a side summary, higher is better)
    ("tokens/s", lambda sm: sm["tokens_per_s"]),
    ("TPOT ms", lambda sm: sm["tpot_ms"]),
    ("TTFT p50 ms", lambda sm: sm["ttft_ms"].get("p50")),
    ("speedup", lambda sm: (sm.get("speculation") or {}).get("speedup")),
    ("α", lambda sm: (sm.get("acceptance") or {}).get("alpha")),
    ("mean accepted length", lambda sm: (sm.get("acceptance") or {}).get("mean_accepted_length")),
    ("efficiency", lambda sm: (sm.get("speculation") or {}).get("efficiency")),
    ("realised ÷ predicted rate", lambda sm: ((sm.get("speculation") or {}).get("prediction") or {}).get("rate_ratio")),
]


def render_compare(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> str:
    """A Markdown table: every side both runs have, each metric in A and B, and B ÷ A."""
    sides_b = {s["name"]: s for s in b["sides"]}
    rows = []
    for side in a["sides"]:
        if side["name"] not in sides_b:
            continue
        sa, sb = side["summary"], sides_b[side["name"]]["summary"]
        metrics = _COMPARE + [(f"{p} p50 ms/step", _phase_p50(p)) for p in PHASES
                              if p in sa["phases"] or p in sb["phases"]]
        for label, get in metrics:
            va, vb = get(sa), get(sb)
            if va is None and vb is None:
                continue
            ratio = _f(vb / va, 3) if va and vb is not None else "–"
            rows.append([side["name"], label, _f(va), _f(vb), ratio])
    header = f"A = {name_a} ({a['profile']['name']}, {a['workload']['name']}); " \
             f"B = {name_b} ({b['profile']['name']}, {b['workload']['name']})"
    return "\n".join([header, "", *_table(["side", "metric", "A", "B", "B / A"], rows)])


def _phase_p50(phase: str):
    return lambda sm: sm["phases"][phase]["per_step_ms"]["p50"] if phase in sm["phases"] else None

