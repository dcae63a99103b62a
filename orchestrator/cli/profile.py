"""`hetspec profile check|run|compare`: a profile against this machine, and profiling runs."""

import argparse
import json
import sys
from pathlib import Path

from orchestrator.cli.common import k_value
from orchestrator.config import MAX_SPECULATIVE_TOKENS
from orchestrator.errors import HetspecError
from orchestrator.latency import load_workload, read_run, render_compare, run_profile, write_outputs
from orchestrator.profiles import check_profile, format_check, load_profile


def add_parser(sub, parser_class) -> None:
    p = sub.add_parser("profile", help="device-placement profiles (check) and profiling runs (run, compare)")
    psub = p.add_subparsers(dest="profile_command", required=True, parser_class=parser_class)
    c = psub.add_parser("check", help="check a profile against the devices on this machine")
    c.add_argument("profile", metavar="FILE|NAME", help="a shipped profile name (e.g. cpu) or a YAML file")
    c.add_argument("--json", action="store_true", help="print the placement plan as JSON")
    c.set_defaults(func=check)

    r = psub.add_parser("run", help="profile a workload: spans, report.md, plots, trace.json")
    r.add_argument("--profile", default="cpu", help="a shipped profile name or a YAML file (default cpu)")
    r.add_argument("--workload", default=None, help="chat | grounded | code | a JSONL file of prompts")
    r.add_argument("--out", default=None, help="output directory (default: the profile's, or hetspec-profile)")
    r.add_argument("--sweep", default=None, metavar="k=2,4,6,8", help="draft lengths to measure")
    r.add_argument("-k", "--num-speculative-tokens", type=k_value, default=None, metavar="auto|N",
                   help="the side the headline figures use (default: the profile's k; auto adds the cost "
                        "model's side)")
    r.add_argument("--max-new-tokens", type=int, default=None)
    r.add_argument("--num-prompts", type=int, default=None, help="use the first N prompts of the workload")
    r.add_argument("--stop-at-eos", action="store_true", help="end requests at EOS (default: fixed lengths)")
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=run)

    m = psub.add_parser("compare", help="side-by-side table of two profiling runs with ratios")
    m.add_argument("a", help="run directory or run.json")
    m.add_argument("b", help="run directory or run.json")
    m.set_defaults(func=compare)


def check(args: argparse.Namespace) -> int:
    """Exit 0 when the profile runs here, 1 when it cannot (the plan says why)."""
    report = check_profile(load_profile(args.profile))
    print(json.dumps(report, indent=2) if args.json else format_check(report))
    return 0 if report["ok"] else 1


def parse_sweep(text: str) -> list[int]:
    """`k=2,4,6,8` (or `2,4,6,8`) -> [2, 4, 6, 8]; one-line errors."""
    body = text.split("=", 1)[1] if text.startswith("k=") else text
    try:
        ks = sorted({int(v) for v in body.split(",") if v.strip()})
    except ValueError:
        raise HetspecError(f"--sweep must look like k=2,4,6,8, got {text!r}") from None
    if not ks or not all(1 <= k <= MAX_SPECULATIVE_TOKENS for k in ks):
        raise HetspecError(f"--sweep values must be draft lengths in [1, {MAX_SPECULATIVE_TOKENS}], got {text!r}")
    return ks


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    spec, config = profile.profiling, profile.engine_config()
    ks = parse_sweep(args.sweep) if args.sweep else spec.draft_lengths()
    headline = args.num_speculative_tokens or ("auto" if config.k_policy == "auto" else config.num_speculative_tokens)
    auto = headline == "auto"
    if not auto and headline not in ks:
        ks = sorted({*ks, headline})
    max_new = args.max_new_tokens or spec.max_new_tokens
    if max_new <= 0 or (args.num_prompts is not None and args.num_prompts <= 0):
        raise HetspecError("--max-new-tokens and --num-prompts must be positive")
    wl_name, prompts = load_workload(args.workload or spec.workload)
    prompts = prompts[:args.num_prompts or spec.num_prompts]
    run_ = run_profile(config, profile.name, (wl_name, prompts), ks, max_new, ignore_eos=not args.stop_at_eos,
                       progress=not args.no_progress, warmup=spec.warmup, auto=auto)
    paths = write_outputs(run_, Path(args.out or spec.output_dir), "auto" if auto else f"k={headline}",
                          trace=spec.trace)
    s = run_["summary"]
    print(f"{s['headline']}: decode speedup {s['speedup_decode']:.2f}x (end to end {s['speedup']:.2f}x), "
          f"bound {s['bound']:.2f}x, efficiency {s['efficiency']:.2f} "
          f"({'meets' if s['efficiency_goal_met'] else 'below'} the {s['efficiency_goal']} goal)", file=sys.stderr)
    for p in paths:
        print(p)
    return 0


def compare(args: argparse.Namespace) -> int:
    print(render_compare(read_run(args.a), read_run(args.b), args.a, args.b))
    return 0
