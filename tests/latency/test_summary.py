"""The Leviathan bound, acceptance from commit spans, and per-phase statistics, on hand-made cases."""

import math

import pytest

from orchestrator.latency.summary import acceptance, leviathan_bound, overlap, phase_stats, predictions, speculation


@pytest.mark.parametrize("alpha, k, c, expected", [
    (0.0, 4, 0.0, 1.0),  # nothing accepted, free drafts: one token per step
    (0.0, 4, 0.25, 0.5),  # nothing accepted, drafts cost a full step: twice as slow
    (1.0, 4, 0.0, 5.0),  # everything accepted, free drafts: k + 1 tokens per step
    (1.0, 4, 0.25, 2.5),
    (0.5, 2, 0.0, 1.75),  # (1 - 0.125) / 0.5
    (0.8, 4, 0.1, (1 - 0.8 ** 5) / (0.2 * 1.4)),
])
def test_leviathan_bound_table(alpha, k, c, expected):
    assert math.isclose(leviathan_bound(alpha, k, c), expected, rel_tol=1e-12)


def test_bound_tends_to_the_alpha_one_limit():
    assert math.isclose(leviathan_bound(1 - 1e-9, 3, 0.2), leviathan_bound(1.0, 3, 0.2), rel_tol=1e-6)


def _commit(step, num_draft, num_accepted):
    return {"name": "commit", "device": "cpu", "role": "host", "start_ns": 0, "dur_ms": 0.1, "step": step,
            "args": {"num_draft": num_draft, "num_accepted": num_accepted}}


def test_acceptance_counts_positions_alpha_and_mean_length():
    prefill = {"name": "commit", "device": "cpu", "role": "host", "start_ns": 0, "dur_ms": 1.0, "step": 0}
    spans = [prefill, _commit(1, 3, 3), _commit(2, 3, 1), _commit(3, 3, 0), _commit(4, 2, 2)]
    acc = acceptance([{"prompt_index": 0, "spans": spans}])
    assert acc["drafted_per_position"] == [4, 4, 3]
    assert acc["accepted_per_position"] == [3, 2, 1]
    # accepted 6; rejections end steps 2 and 3 -> alpha = 6 / (6 + 2)
    assert acc["alpha"] == pytest.approx(0.75)
    assert acc["mean_accepted_length"] == pytest.approx((4 + 2 + 1 + 3) / 4)
    assert acc["num_verify_steps"] == 4


def test_phase_stats_sum_per_step_and_keep_tracks_apart():
    def span(name, step, ms, role="target"):
        return {"name": name, "device": "cpu", "role": role, "start_ns": 0, "dur_ms": ms, "step": step}

    reqs = [{"prompt_index": 0, "spans": [span("accept", 1, 1.0), span("accept", 1, 2.0), span("accept", 2, 5.0),
                                          span("draft", 1, 4.0, "drafter"), span("wire", 1, 0.5, "transport")]}]
    stats = phase_stats(reqs)
    assert list(stats) == ["draft", "wire", "accept"]  # step order, only phases that occurred
    assert stats["accept"]["num_steps"] == 2 and stats["accept"]["total_ms"] == 8.0
    assert stats["accept"]["per_step_ms"]["p50"] == pytest.approx(4.0)  # steps: 3 ms and 5 ms
    assert stats["draft"]["by_track_ms"] == {"cpu drafter": 4.0}


def test_bound_with_measured_verify_cost():
    # verify costing 1.5 target steps: the denominator becomes k c + 1.5
    assert math.isclose(leviathan_bound(0.5, 2, 0.1, v=1.5), 1.75 / 1.7, rel_tol=1e-12)
    assert leviathan_bound(0.7, 4, 0.1, v=1.5) < leviathan_bound(0.7, 4, 0.1)


def test_overlapped_drafting_is_a_phase_apart_and_only_its_wait_costs_the_step():
    """Hand-made: a step that drafted ahead for 30 ms beside a 40 ms verify and waited 2 ms for it,
    then a step whose pre-draft hit (no draft of its own). The pre-draft is `draft_ahead`; the steps'
    realised time and the side's drafting cost count the wait, not the hidden 28 ms."""
    def span(name, step, ms, role="target", **args):
        return {"name": name, "device": "cpu", "role": role, "start_ns": 0, "dur_ms": ms, "step": step,
                "args": args}

    spans = [span("draft", 1, 10.0, "drafter"), span("verify", 1, 40.0), span("draft", 1, 30.0, "drafter", ahead=True),
             span("wait", 1, 2.0, "host"), _commit(1, 3, 3),
             span("verify", 2, 40.0, expected_tokens=4.0, expected_ms=45.0), _commit(2, 3, 1)]
    spans[1]["args"] = {"expected_tokens": 3.5, "expected_ms": 50.0}
    reqs = [{"prompt_index": 0, "spans": spans,
             "overlap": {"launched": 2, "hits": 1, "misses": 0, "ahead_s": 0.030, "exposed_s": 0.002}}]
    stats = phase_stats(reqs)
    assert stats["draft"]["total_ms"] == 10.0 and stats["draft_ahead"]["total_ms"] == 30.0
    assert stats["wait"]["by_track_ms"] == {"cpu host": 2.0}
    p = predictions(reqs)
    assert p["num_steps"] == 2 and p["realised_ms_per_step"] == pytest.approx((10 + 40 + 2 + 0.1 + 40 + 0.1) / 2)
    assert overlap(reqs) == {"launched": 2, "hits": 1, "misses": 0, "hit_rate": 1.0, "ahead_ms": 30.0,
                             "waited_ms": 2.0, "hidden_ms": pytest.approx(28.0)}
    side = {"k": 3, "requests": reqs}
    summary = {"acceptance": acceptance(reqs), "phases": stats, "tokens_per_s": 1.0, "tpot_ms": 10.0}
    spec = speculation(side, summary, {"tpot_ms": 50.0, "tokens_per_s": 1.0})
    assert spec["c"] == pytest.approx((10.0 + 2.0) / 6 / 50.0)  # 6 drafts: the fresh draft and the wait
    assert spec["verify_cost"] == pytest.approx((40 + 40 + 0.2) / 2 / 50.0)


def test_a_remote_drafters_wire_time_inside_its_draft_span_counts_once():
    """Hand-made: a 10 ms draft span that waited on a round trip of which 3 ms were the wire (its own
    span, on the wire track, inside the draft's time). c counts 10 ms of drafting, 7 of them the
    drafter's, 3 the transfer's; the phases cover 10 + 40 ms of wall time, not 53."""
    def span(name, step, ms, role, **args):
        return {"name": name, "device": "cpu", "role": role, "start_ns": 0, "dur_ms": ms, "step": step,
                "args": args}

    from orchestrator.latency.summary import side_summary

    spans = [span("draft", 1, 10.0, "drafter"), span("wire", None, 3.0, "wire", round_trip_ms=10.0),
             span("verify", 1, 40.0, "target"), _commit(1, 2, 2)]
    reqs = [{"prompt_index": 0, "spans": spans, "wall_ms": 50.1, "ttft_ms": 0.0, "tpot_ms": 25.0,
             "output_tokens": 3}]
    summary = side_summary({"k": 2, "requests": reqs})
    assert summary["span_ms"] == pytest.approx(50.1)
    spec = speculation({"k": 2, "requests": reqs}, summary, {"tpot_ms": 40.0, "tokens_per_s": 1.0})
    assert spec["c"] == pytest.approx(10.0 / 2 / 40.0)
    assert spec["draft_ms_per_token"] == pytest.approx(7.0 / 2) and spec["transfer_ms_per_token"] == pytest.approx(1.5)
