"""The profiling report names the acceptance policy; a lossy one is labelled so, with its drift."""

from orchestrator.latency.report import _verification


def _run(*stats: dict) -> dict:
    return {"sides": [{"name": "baseline", "k": 0, "requests": [{"stats": {"acceptance": "rejection"}}]},
                      {"name": "k=4", "k": 4, "requests": [{"stats": s} for s in stats]}]}


def test_a_lossless_run_says_so():
    assert _verification(_run({"acceptance": "rejection", "lossy": False})) == [
        "Acceptance policy: rejection (lossless: the output is the target's own).", ""]


def test_a_lossy_run_is_labelled_with_its_drift_and_budget():
    lines = _verification(_run({"acceptance": "nkl", "lossy": True, "tokens_differing": 3, "budget_exhausted_at": 40},
                               {"acceptance": "nkl", "lossy": True, "tokens_differing": 1, "budget_exhausted_at": -1}))
    assert lines[0] == ("Acceptance policy: **nkl (LOSSY)**: 4 committed tokens the target would not have chosen, "
                        "over 2 requests; the quality budget ran out in 1.")
