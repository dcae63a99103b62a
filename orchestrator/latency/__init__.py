"""Cross-device latency profiling runs: where every millisecond of speculative decoding went.

    run = run_profile(config, "cpu", load_workload("chat"), ks=[2, 4], max_new_tokens=128)
    write_outputs(run, Path("prof"))        # run.json, report.md, PNG plots, trace.json (Perfetto)

A run measures a target-only baseline and one speculative side per k, interleaved prompt by
prompt, from the spans the engine records (`orchestrator.tracing`); `summary` turns them into
phase percentiles per device track, acceptance per position, speedup and the Leviathan bound.
"""

from orchestrator.latency.outputs import read_run, write_outputs
from orchestrator.latency.report import render_compare, render_report
from orchestrator.latency.runner import BASELINE, SCHEMA, run_profile
from orchestrator.latency.summary import leviathan_bound, summarize
from orchestrator.latency.workloads import BUILTIN, WorkloadPrompt, load_workload

__all__ = ["BASELINE", "BUILTIN", "SCHEMA", "WorkloadPrompt", "leviathan_bound", "load_workload", "read_run",
           "render_compare", "render_report", "run_profile", "summarize", "write_outputs"]
