"""A real profiling run (SmolLM2-135M fp32 target, INT4 ONNX drafter) and everything it writes."""

import json
import subprocess
import sys
from collections import defaultdict
from itertools import zip_longest
from pathlib import Path

import pytest

from orchestrator.config import EngineConfig
from orchestrator.latency.outputs import write_outputs
from orchestrator.latency.report import render_compare
from orchestrator.latency.runner import BASELINE, SCHEMA, run_profile
from orchestrator.latency.workloads import load_workload

TRACE_PHASES = {"X", "M", "s", "f"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    name, prompts = load_workload("chat")
    run = run_profile(EngineConfig(), "cpu", (name, prompts[:2]), [2, 4], max_new_tokens=16, progress=False,
                      auto=True)
    out = tmp_path_factory.mktemp("profile")
    write_outputs(run, out, headline="auto")
    return out


@pytest.fixture(scope="module")
def run(run_dir):
    return json.loads((run_dir / "run.json").read_text())


def test_phase_times_add_up_to_wall_time(run):
    for side in run["sides"]:
        for r in side["requests"]:
            span_ms = sum(s["dur_ms"] for s in r["spans"])
            assert 0.95 * r["wall_ms"] <= span_ms <= r["wall_ms"], (side["name"], span_ms, r["wall_ms"])
            names = {s["name"] for s in r["spans"]}
            assert {"prefill", "verify", "accept", "commit", "rollback", "emit", "schedule"} <= names
            if side["policy"] == "fixed":
                assert ("draft" in names) == (side["k"] > 0)
            # the cpu profile's drafter is the target's own export: KV handoff (auto) at a sequence's first
            # draft, spans beside the draft's; nothing goes over a wire in process
            handed = {"d2h", "serialize", "deserialize", "h2d"}
            assert names & handed == (handed if "draft" in names else set()) and "wire" not in names


def test_speculative_output_is_the_baseline_output_and_counts_match_engine_stats(run):
    sides = {s["name"]: s for s in run["sides"]}
    for name in ("k=2", "k=4", "auto"):
        for spec, base in zip(sides[name]["requests"], sides[BASELINE]["requests"]):
            assert spec["output_ids"] == base["output_ids"] and len(spec["output_ids"]) == 16
        acc = sides[name]["summary"]["acceptance"]
        stats = [r["stats"] for r in sides[name]["requests"]]
        drafted = [sum(col) for col in zip_longest(*(s["drafted_per_position"] for s in stats), fillvalue=0)]
        assert acc["drafted_per_position"] == drafted
        assert sum(acc["accepted_per_position"]) == sum(s["num_accepted"] for s in stats)
        assert 0.0 <= acc["alpha"] <= 1.0


def test_run_json_schema_and_summary(run):
    assert run["schema"] == SCHEMA
    assert {"environment", "profile", "workload", "sides", "summary"} <= set(run)
    assert run["environment"]["torch"] and run["profile"]["engine_config"]["dtype"] == "float32"
    s = run["summary"]
    assert s["headline"] == "auto" and s["ks"] == [2, 4]
    assert s["bound"] > 0 and s["efficiency"] == pytest.approx(s["speedup_decode"] / s["bound"])
    assert s["c"] > 0.0  # auto drafts little here, so its first drafts' catch-up weighs on c
    k4 = next(side for side in run["sides"] if side["name"] == "k=4")["summary"]["speculation"]
    assert 0.0 < k4["c"] < 1.0
    # every speculative side's steps were predicted by the cost model before they ran
    p = s["prediction"]
    assert p["num_steps"] >= 4 and 0.2 < p["rate_ratio"] < 5.0
    assert p["predicted_ms_per_step"] > 0 and p["realised_tokens_per_step"] >= 1.0
    # split by draft length, the groups add back up to the totals; a step with n drafts commits 1..n+1
    groups = p["by_draft"]
    assert sum(g["num_steps"] for g in groups.values()) == p["num_steps"]
    total_ms = sum(g["ms"] * g["num_steps"] for g in groups.values())
    assert total_ms == pytest.approx(p["realised_ms_per_step"] * p["num_steps"])
    for drafted, g in groups.items():
        assert 1.0 <= g["tokens"] <= int(drafted) + 1
        assert 0.0 < g["verify_ms"] and g["draft_ms"] + g["verify_ms"] <= g["ms"] + 1e-9
        assert g["draft_ms"] > 0 or drafted == "0"  # a step that drafted ran the drafter


def test_report_has_the_figures_and_names_absent_phases(run_dir, run):
    report = (run_dir / "report.md").read_text()
    for needle in ("p50 ms/step", "p99 ms/step", "acceptance by position", "mean accepted length", "TTFT",
                   "TPOT", "Leviathan bound", "efficiency", "Not present in this run", "d2h",
                   "realised ÷ predicted", "cost model", "prediction by draft length", "Acceptance policy: rejection (lossless"):
        assert needle in report, needle
    assert f"{run['summary']['efficiency']:.2f}" in report


def _validate_trace(trace: dict) -> None:
    """The Chrome trace-event format (JSON object form) as documented, for the events we use."""
    assert isinstance(trace["traceEvents"], list) and trace["displayTimeUnit"] in ("ms", "ns")
    slices = defaultdict(list)
    flows = defaultdict(lambda: {"s": [], "f": []})
    for e in trace["traceEvents"]:
        assert e["ph"] in TRACE_PHASES and isinstance(e["pid"], int) and isinstance(e["tid"], int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name") and e["args"]["name"]
        elif e["ph"] == "X":
            assert e["name"] and e["ts"] >= 0 and e["dur"] >= 0
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        else:
            assert isinstance(e["id"], int) and e["cat"] and e["name"]
            flows[e["id"]][e["ph"]].append(e)
    for fid, ends in flows.items():
        assert len(ends["s"]) == 1 and ends["f"], fid  # one send, at least one receive
        for e in ends["s"] + ends["f"]:  # every flow point lies inside a slice of its own track
            assert any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])]), e
        assert all(f["bp"] == "e" and f["ts"] >= ends["s"][0]["ts"] for f in ends["f"])


def test_trace_is_valid_trace_event_json_with_device_tracks_and_flows(run_dir):
    trace = json.loads((run_dir / "trace.json").read_text())
    _validate_trace(trace)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M"}
    assert {"cpu", "cpu target", "cpu host", "cpu drafter (onnx+kv-handoff)"} <= names
    assert sum(e["ph"] == "s" for e in trace["traceEvents"]) > 5  # draft -> verify hand-offs


def test_trace_validator_catches_a_dangling_flow(run_dir):
    trace = json.loads((run_dir / "trace.json").read_text())
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e["ph"] != "f"]
    with pytest.raises(AssertionError):
        _validate_trace(trace)


def test_plots_are_nonblank_pngs(run_dir):
    import matplotlib.image as mpimg

    for name in ("latency.png", "acceptance.png", "speedup.png"):
        path = run_dir / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(path)  # [height, width, channels]
        assert img.shape[0] > 300 and img.shape[1] > 500
        assert (img[..., :3] < 0.9).mean() > 0.01  # more than a blank canvas


def test_compare_of_a_run_with_itself_is_all_ones(run):
    table = render_compare(run, run)
    ratios = [line.split("|")[-2].strip() for line in table.splitlines()[4:]]
    assert ratios and all(r in ("1.000", "–") for r in ratios)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "profile", *args], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).parents[2])


def test_cli_compare_and_one_line_errors(run_dir, tmp_path):
    ok = _cli("compare", str(run_dir), str(run_dir / "run.json"))
    assert ok.returncode == 0 and "B / A" in ok.stdout and "tokens/s" in ok.stdout
    (tmp_path / "run.json").write_text(json.dumps({"schema": "other/9"}))
    bad = _cli("compare", str(run_dir), str(tmp_path))
    assert bad.returncode == 1 and "schema" in bad.stderr and bad.stderr.count("\n") == 1
    (tmp_path / "w.jsonl").write_text('{"prompt": "a"}\n{"prompt": ""}\n')
    bad = _cli("run", "--workload", str(tmp_path / "w.jsonl"), "--out", str(tmp_path / "o"))
    assert bad.returncode == 1 and "w.jsonl line 2: field 'prompt'" in bad.stderr
    assert _cli("run", "--sweep", "k=x").returncode == 1


def test_an_overlapped_run_reports_hits_and_counts_only_the_drafting_it_waited_for(tmp_path):
    """A profile with `overlap`: pre-drafts are their own phase (`draft_ahead`, beside the verify), the
    engine's waits for them are `wait`; the report gives hits and hidden time, matching the engine.
    No warm-up: the overlap gate's first steps draft ahead every other step, whatever it then measures."""
    name, prompts = load_workload("grounded")
    run = run_profile(EngineConfig(overlap=True), "cpu", (name, prompts[:2]), [3], max_new_tokens=24,
                      progress=False, warmup=0)
    write_outputs(run, tmp_path, headline="k=3")
    side = next(s for s in run["sides"] if s["name"] == "k=3")
    for r in side["requests"]:
        assert r["output_ids"] == run["sides"][0]["requests"][r["prompt_index"]]["output_ids"]
        ahead = [s for s in r["spans"] if s["name"] == "draft" and s.get("args", {}).get("ahead")]
        waits = [s for s in r["spans"] if s["name"] == "wait"]
        assert len(ahead) == len(waits) == r["overlap"]["launched"]
        assert r["overlap"]["hits"] == r["stats"]["steps_predrafted"]
        # the spans the engine ran one after another still add up to the wall time
        span_ms = sum(s["dur_ms"] for s in r["spans"] if not s.get("args", {}).get("ahead"))
        assert 0.95 * r["wall_ms"] <= span_ms <= r["wall_ms"]
    sm = side["summary"]
    assert sm["phases"]["draft_ahead"]["by_track_ms"].keys() == sm["phases"]["draft"]["by_track_ms"].keys()
    ov = sm["overlap"]
    assert ov["launched"] == sum(r["overlap"]["launched"] for r in side["requests"]) >= 3
    assert ov["hidden_ms"] + ov["waited_ms"] == pytest.approx(ov["ahead_ms"])
    report = (tmp_path / "report.md").read_text()
    assert "## Overlapped drafting" in report and f"| k=3 | {ov['launched']} | {ov['hits']} |" in report
    assert run["sides"][0]["summary"]["overlap"] is None or run["sides"][0]["summary"]["overlap"]["launched"] == 0
