"""Write a run's outputs: run.json, report.md, the PNG plots and trace.json."""

import json
from pathlib import Path

from orchestrator.profiler.summary import summarize


def write_outputs(run: dict, out_dir: Path, default_k: int | None = None, trace: bool = True) -> list[Path]:
    """Summarize `run` and write everything into `out_dir` -> the paths written."""
    from orchestrator.profiler.plots import write_plots
    from orchestrator.profiler.report import render_report
    from orchestrator.profiler.trace import write_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    summarize(run, default_k)
    paths = [out_dir / "run.json", out_dir / "report.md"]
    paths[0].write_text(json.dumps(run, indent=1))
    paths[1].write_text(render_report(run))
    paths += write_plots(run, out_dir)
    if trace:
        paths.append(write_trace(run, out_dir / "trace.json"))
    return paths
