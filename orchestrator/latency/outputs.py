"""A run's outputs: write run.json, report.md, the PNG plots and trace.json; read a run back."""

import json
from pathlib import Path

from orchestrator.errors import HetspecError
from orchestrator.latency.plots import write_plots
from orchestrator.latency.report import render_report
from orchestrator.latency.runner import SCHEMA
from orchestrator.latency.summary import summarize
from orchestrator.latency.trace_events import write_trace


def write_outputs(run: dict, out_dir: Path, headline: str | None = None, trace: bool = True) -> list[Path]:
    """Summarize `run` and write everything into `out_dir` -> the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summarize(run, headline)
    paths = [out_dir / "run.json", out_dir / "report.md"]
    paths[0].write_text(json.dumps(run, indent=1))
    paths[1].write_text(render_report(run))
    paths += write_plots(run, out_dir)
    if trace:
        paths.append(write_trace(run, out_dir / "trace.json"))
    return paths


def read_run(ref: str) -> dict:
    """A run directory or run.json -> the run, with a one-line error for anything else."""
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
