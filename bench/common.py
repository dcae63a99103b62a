"""What the side-by-side benches share: prompt encoding, the alternating runner, stats, the report file.

Every bench runs both sides of a ratio in one run, prompt by prompt, the side order rotating
(this shared VM drifts by tens of percent over minutes), and writes its figures with the machine
and commit they were measured on (`orchestrator.latency.environment`).
"""

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the prompt sets

from orchestrator.config import SamplingParams  # noqa: E402
from orchestrator.latency.environment import environment  # noqa: E402

FIGURES = Path(__file__).resolve().parent / "figures"


def hetspec_side(engine, tokens: int):
    """One prompt through a hetspec engine -> (generated ids, stats)."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)

    def run(ids):
        seq = engine.generate(ids, params)
        return seq.output_ids, seq.stats
    return run


def hf_side(model, tokens: int, **kw):
    """One prompt through HF `generate` (greedy, exactly `tokens` new tokens) -> (ids, None)."""
    def run(ids):
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids], device=model.device), max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=False, **kw)
        return out[0, len(ids):].tolist(), None
    return run


def alternate(sides: list, prompts: list[list[int]]) -> list[tuple[float, list, list]]:
    """Every side on each prompt in turn, the order rotating per prompt (ABBA for two sides), so
    drifts in machine speed hit all sides alike. -> per side: (tokens/s, outputs, stats)."""
    results = [[0.0, [], []] for _ in sides]
    for i, ids in enumerate(prompts):
        order = list(range(len(sides)))
        order = order[i % len(sides):] + order[:i % len(sides)]
        for j in order:
            t0 = time.perf_counter()
            out, stats = sides[j](ids)
            results[j][0] += time.perf_counter() - t0
            results[j][1].append(out)
            results[j][2].append(stats)
    return [(sum(map(len, out)) / elapsed, out, stats) for elapsed, out, stats in results]


def merge(stats) -> dict:
    """Speculation stats of several requests together."""
    drafted, accepted = [], []
    for s in stats:
        for j, (d, a) in enumerate(zip(s.drafted_per_position, s.accepted_per_position)):
            if j == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[j] += d
            accepted[j] += a
    steps = sum(s.num_steps for s in stats)
    return {
        "alpha_per_position": [round(a / d, 3) if d else 0.0 for a, d in zip(accepted, drafted)],
        "acceptance_rate": round(sum(accepted) / max(1, sum(drafted)), 3),
        "mean_accepted_length": round(sum(s.num_committed for s in stats) / max(1, steps), 3),
        "draft_s": sum(s.time_draft_s for s in stats),
        "verify_s": sum(s.time_verify_s for s in stats),
        "num_drafted": sum(drafted),
        "num_steps": steps,
    }


def agreement(outputs: list, reference: list) -> str:
    """Identical outputs, and tokens before the first divergence (a near-tie flip)."""
    same = sum(a == b for a, b in zip(outputs, reference))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(outputs, reference)]
    return f"identical outputs {same}/{len(outputs)}, first divergence at tokens {prefix}"


def line(name: str, a_name: str, a: float, b_name: str, b: float) -> None:
    print(f"{name:<48} {a_name} {a:7.2f} tok/s | {b_name} {b:7.2f} tok/s | ratio {a / b:5.2f}x", flush=True)


def machine_line() -> dict:
    env = environment()
    c = env["cpu"]
    print(f"machine: {c['model']}, {c['cores']} cores, flags {' '.join(c['flags'])}; torch {env['torch']} "
          f"({env['torch_threads']} threads), onnxruntime {env['onnxruntime']}; commit {env['git_commit']}",
          flush=True)
    if env.get("gpu"):
        print(f"gpu: {env['gpu']}", flush=True)
    return env


def add_name_arg(ap, default: str) -> None:
    """`--name NAME`: write bench/figures/NAME.json instead of the default file, which the README may quote."""
    ap.add_argument("--name", default=None, metavar="NAME",
                    help=f"write bench/figures/NAME.json (default: {default}, the file the README quotes)")


def write_report(name: str, report: dict, quiet: bool = False) -> Path:
    """bench/figures/NAME.json: the figures the README quotes, with their machine and commit."""
    FIGURES.mkdir(exist_ok=True)
    path = FIGURES / f"{name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    if not quiet:
        print(f"wrote {path}", flush=True)
    return path
