"""`hetspec profile run` and `hetspec profile compare`: the verbs this package adds to `profile`."""

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.errors import HetspecError

@dataclass
class _Defaults:
    """`profiling:` defaults of a profile (or ours when it has none); flags override them."""

    workload: str = "chat"
    k_sweep: tuple[int, ...] = (2, 4, 6, 8)
    max_new_tokens: int = 128
    num_prompts: int = 5
    output_dir: str = "hetspec-profile"
    trace: bool = True
    warmup: int = 1  # short requests per side before measuring


def add_parsers(psub) -> None:
    """Register `run` and `compare` on the `profile` group (`psub` is its subparsers action)."""
    r = psub.add_parser("run", help="profile a workload: spans, report.md, plots, trace.json")
    r.add_argument("--profile", default="cpu", help="a shipped profile name or a YAML file (default cpu)")
    r.add_argument("--workload", default=None, help="chat | grounded | code | a JSONL file of prompts")
    r.add_argument("--out", default=None, help="output directory (default: the profile's, or hetspec-profile)")
    r.add_argument("--sweep", default=None, metavar="k=2,4,6,8", help="draft lengths to measure")
    r.add_argument("-k", "--num-speculative-tokens", type=int, default=None,
                   help="the k the headline figures use (default: the profile's)")
    r.add_argument("--max-new-tokens", type=int, default=None)
    r.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts of the workload")
    r.add_argument("--stop-at-eos", action="store_true", help="end requests at EOS (default: fixed lengths)")
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=_run)
    c = psub.add_parser("compare", help="side-by-side table of two profiling runs with ratios")
    c.add_argument("a", help="run directory or run.json")
    c.add_argument("b", help="run directory or run.json")
    c.set_defaults(func=_compare)


def parse_sweep(text: str) -> list[int]:
    """`k=2,4,6,8` (or `2,4,6,8`) -> [2, 4, 6, 8]; one-line errors."""
    body = text.split("=", 1)[1] if text.startswith("k=") else text
    try:
        ks = sorted({int(v) for v in body.split(",") if v.strip()})
    except ValueError:
        raise HetspecError(f"--sweep must look like k=2,4,6,8, got {text!r}") from None
    if not ks or not all(1 <= k <= 32 for k in ks):
        raise HetspecError(f"--sweep values must be draft lengths in [1, 32], got {text!r}")
    return ks


def load_config(ref: str):
    """A profile (shipped name or YAML file) -> (name, EngineConfig, profiling defaults)."""
    from orchestrator.profiles import load_profile

    profile = load_profile(ref)
    spec, defaults = profile.profiling, _Defaults()
    if spec is not None:  # k = 0 in a profile's sweep means the baseline, which always runs
        defaults = _Defaults(spec.workload, tuple(k for k in spec.k_sweep if k > 0) or defaults.k_sweep,
                             spec.max_new_tokens, spec.num_prompts, spec.output_dir, spec.trace, spec.warmup)
    return profile.name, profile.engine_config(), defaults


def _run(args: argparse.Namespace) -> int:
    from orchestrator.profiler.outputs import write_outputs
    from orchestrator.profiler.runner import run_profile
    from orchestrator.profiler.workloads import load_workload

    name, config, defaults = load_config(args.profile)
    ks = parse_sweep(args.sweep) if args.sweep else list(defaults.k_sweep)
    default_k = args.num_speculative_tokens or config.num_speculative_tokens
    if default_k not in ks:
        ks = sorted({*ks, default_k})
    max_new = args.max_new_tokens or defaults.max_new_tokens
    if max_new <= 0 or (args.num_prompts is not None and args.num_prompts <= 0):
        raise HetspecError("--max-new-tokens and --num-prompts must be positive")
    wl_name, prompts = load_workload(args.workload or defaults.workload)
    prompts = prompts[:args.num_prompts or defaults.num_prompts]
    config = replace(config, num_speculative_tokens=max(ks))
    out = Path(args.out or defaults.output_dir)
    run = run_profile(config, name, (wl_name, prompts), ks, max_new, ignore_eos=not args.stop_at_eos,
                      progress=not args.no_progress, warmup=defaults.warmup)
    paths = write_outputs(run, out, default_k, trace=defaults.trace)
    s = run["summary"]
    print(f"k={s['default_k']}: decode speedup {s['speedup_decode']:.2f}x (end to end {s['speedup']:.2f}x), "
          f"bound {s['bound']:.2f}x, efficiency {s['efficiency']:.2f} "
          f"({'meets' if s['efficiency_goal_met'] else 'below'} the {s['efficiency_goal']} goal)", file=sys.stderr)
    for p in paths:
        print(p)
    return 0


def read_run(ref: str) -> dict:
    """A run directory or run.json -> the run, with a one-line error for anything else."""
    from orchestrator.profiler.runner import SCHEMA

    path = Path(ref)
    path = path / "run.json" if path.is_dir() else path
    try:
        run = json.loads(path.read_text())
    except FileNotFoundError:
        raise HetspecError(f"{ref}: no run.json there") from None
    except (OSError, json.JSONDecodeError) as e:
        raise HetspecError(f"{path}: not a readable run.json ({e})") from None
    if not isinstance(run, dict) or run.get("schema") != SCHEMA:
        raise HetspecError(f"{path}: schema is {run.get('schema') if isinstance(run, dict) else None!r}, "
                           f"expected {SCHEMA!r}")
    return run


def _compare(args: argparse.Namespace) -> int:
    from orchestrator.profiler.report import render_compare

    print(render_compare(read_run(args.a), read_run(args.b), args.a, args.b))
    return 0
