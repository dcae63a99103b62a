"""run.json -> trace.json in the Chrome trace-event format (JSON object form), for Perfetto.

One process per device (`cpu`, `cuda:0`, ...) with one thread per role on it (target,
drafter, host, transport), so each device is a track group; a `run` process shows which side
and request ran when. Spans are complete events (`ph: X`, microseconds); a span that sends a
flow (`flow_out`) starts an arrow (`ph: s`) that ends (`ph: f`, `bp: e`) in the span(s) that
receive it. Sides are measured one after another, so their spans never overlap on a track.
"""

import json
from pathlib import Path

RUN_PID = 0


def _ids(run: dict) -> tuple[dict, dict]:
    """Stable pid per device and tid per (device, role), in order of first appearance."""
    pids: dict[str, int] = {}
    tids: dict[tuple[str, str], int] = {}
    for side in run["sides"]:
        for r in side["requests"]:
            for s in r["spans"]:
                pids.setdefault(s["device"], len(pids) + 1)
                tids.setdefault((s["device"], s["role"]), len(tids) + 1)
    return pids, tids


def _metadata(pids: dict, tids: dict, sides: list[dict]) -> list[dict]:
    events = [{"ph": "M", "name": "process_name", "pid": RUN_PID, "tid": 0, "args": {"name": "run"}}]
    for i, side in enumerate(sides):
        events.append({"ph": "M", "name": "thread_name", "pid": RUN_PID, "tid": i + 1,
                       "args": {"name": f"side {side['name']}"}})
    for device, pid in pids.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": device}})
    for (device, role), tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pids[device], "tid": tid,
                       "args": {"name": f"{device} {role}"}})
    return events


def _span_events(span: dict, side_index: int, side: str, t0_ns: int, pids: dict, tids: dict) -> list[dict]:
    pid, tid = pids[span["device"]], tids[(span["device"], span["role"])]
    ts = (span["start_ns"] - t0_ns) / 1e3
    dur = span["dur_ms"] * 1e3
    args = {"side": side, **{k: span[k] for k in ("step", "request") if k in span}, **span.get("args", {})}
    events = [{"ph": "X", "name": span["name"], "cat": "phase", "ts": ts, "dur": dur, "pid": pid, "tid": tid,
               "args": args}]
    # flow ids restart per engine: make them unique across sides
    if span.get("flow_out") is not None:
        events.append({"ph": "s", "name": "handoff", "cat": "flow", "id": (side_index << 32) | span["flow_out"],
                       "ts": ts + dur / 2, "pid": pid, "tid": tid})  # inside the slice it binds to
    for flow in span.get("flow_in", ()):
        events.append({"ph": "f", "bp": "e", "name": "handoff", "cat": "flow", "id": (side_index << 32) | flow,
                       "ts": ts + dur / 2, "pid": pid, "tid": tid})
    return events


def build_trace(run: dict) -> dict:
    """The trace-event JSON object for a run."""
    pids, tids = _ids(run)
    t0 = min((r["start_ns"] for side in run["sides"] for r in side["requests"]), default=0)
    events = _metadata(pids, tids, run["sides"])
    for i, side in enumerate(run["sides"]):
        for r in side["requests"]:
            events.append({"ph": "X", "name": f"{side['name']} prompt {r['prompt_index']}", "cat": "request",
                           "ts": (r["start_ns"] - t0) / 1e3, "dur": r["wall_ms"] * 1e3, "pid": RUN_PID,
                           "tid": i + 1, "args": {"output_tokens": r["output_tokens"]}})
            for span in r["spans"]:
                events.extend(_span_events(span, i, side["name"], t0, pids, tids))
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"schema": run["schema"], "profile": run["profile"]["name"]}}


def write_trace(run: dict, path: Path) -> Path:
    path.write_text(json.dumps(build_trace(run)))
    return path
