"""The Leviathan bound, acceptance from commit spans, and per-phase statistics, on hand-made cases."""

import math

import pytest

from orchestrator.latency.summary import acceptance, leviathan_bound, phase_stats


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
