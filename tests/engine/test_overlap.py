"""The pre-drafter's bookkeeping on a real n-gram drafter: what counts as a hit, what the drafter
is left with, and a drafter that cannot draft ahead being refused."""

import pytest

from orchestrator.config import CombinedDrafterConfig, EngineConfig, NgramDrafterConfig, OnnxDrafterConfig
from orchestrator.drafters.combined import CombinedDrafter
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.engine.drafter import DraftRequest
from orchestrator.engine.overlap import OverlapGate, PreDrafter
from orchestrator.engine.speculation import CostModel
from orchestrator.errors import InvalidRequestError
from orchestrator.tracing import Tracer, Track

# a lookup continues "1 2 3 4 5 6 7" after "... 1 2"
PROMPT = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2]


def launched(assumed: list[int], k: int = 3):
    drafter = NgramDrafter()
    drafter.start(0, PROMPT)
    ahead = PreDrafter(drafter, Tracer(), Track("cpu", "drafter (ngram)"))
    ahead.launch([DraftRequest(0, k)], {0: len(PROMPT)}, {0: assumed}, step=0)
    ahead.wait()
    return drafter, ahead


@pytest.mark.parametrize("committed, expected", [
    ([3, 4, 5], [6, 7]),  # drafts 3, 4 accepted, the target's next token 5 is the guess: hit
    ([3, 4, 5, 6], [7]),  # (a lossy policy may commit further into what the worker drafted)
    ([3, 8], None),  # a draft rejected: miss
    ([3, 4, 8], None),  # all accepted, the target's next token is not the guess: miss
])
def test_a_predraft_is_used_only_when_the_commits_are_a_prefix_of_what_it_assumed(committed, expected):
    drafter, ahead = launched([3, 4])
    # the worker drafted from PROMPT + [3, 4] and left the drafter's committed tokens as they were
    assert drafter._tokens[0] == PROMPT
    line = PROMPT + committed
    proposal = ahead.take(0, lambda start: line[start:])
    assert (proposal.draft_ids if proposal is not None else None) == expected
    assert (ahead.stats.hits, ahead.stats.misses) == ((1, 0) if expected else (0, 1))
    assert ahead.take(0, lambda start: line[start:]) is None  # taken once
    ahead.tracer.flush()
    spans = [s for s in ahead.tracer.spans if s.name == "draft"]
    assert len(spans) == 1 and spans[0].args["ahead"] is True
    ahead.close()


def test_a_new_launch_drops_predrafts_of_sequences_that_sat_a_step_out():
    drafter, ahead = launched([3, 4])
    ahead.launch([], {}, {}, step=1)
    line = PROMPT + [3, 4, 5]
    assert ahead.take(0, lambda start: line[start:]) is None
    ahead.close()


def test_drafters_that_cannot_draft_ahead_are_refused():
    assert CombinedDrafter([NgramDrafter(), NgramDrafter()]).overlaps is False
    config = EngineConfig(overlap=True, drafter=CombinedDrafterConfig((NgramDrafterConfig(), OnnxDrafterConfig())))
    with pytest.raises(InvalidRequestError, match="overlap needs a single drafter"):
        config.validate()


def test_the_gate_drafts_ahead_only_where_the_hits_save_more_than_the_slowdown_costs():
    """Hand-computed: forwards of 4 tokens take 0.112 s with the worker running and 0.100 s without: a
    12% slowdown costs 0.012 s of a 0.1 s forward; hits save hit rate * 0.03 s per sequence: at 0.3
    that is 0.009 s (no), with two sequences 0.018 s (yes), at a hit rate of 0.5 0.015 s (yes).
    Until both ways are measured at one size it alternates; every 16th step it tries the other way."""
    gate = OverlapGate()
    explored = []
    for _ in range(6):  # nothing measured: both ways in turn, each forward recorded as the engine does
        explored.append(gate.wanted(1, 0.1))
        gate.record_forward(4, 0.112 if explored[-1] else 0.100, explored[-1])
        gate.record_forward(9, 0.5, explored[-1])  # a size seen both ways with no difference ...
    gate.record_forward(5, 9.9, True)  # ... and one seen one way only: neither moves the median much
    assert explored == [True, False] * 3
    gate.fresh_s.add(0.03)
    gate.hit_rate = 0.3
    assert gate.slowdown() == pytest.approx(0.06)  # median of 12% (4 tokens) and 0% (9 tokens)
    for _ in range(9):
        gate.record_forward(9, 0.56, True)  # now 12% at 9 tokens too (the mean of the last 9)
    assert gate.slowdown() == pytest.approx(0.12)
    assert [gate.wanted(1, 0.1), gate.wanted(2, 0.1)] == [False, True]
    gate.hit_rate = 0.5
    assert gate.wanted(1, 0.1) is True
    gate.hit_rate = 0.3
    decisions = [gate.wanted(1, 0.1) for _ in range(16)]  # the gate's steps 10..25
    assert decisions.count(True) == 1 and decisions.index(True) == 6  # step 16: a probe of the other way
    assert gate.to_dict()["steps_ahead"] == 6 and gate.to_dict()["forward_slowdown"] == pytest.approx(0.12)


def measured_gate(beside_s: float, hit_rate: float) -> OverlapGate:
    """A gate past its first step that has measured 4-token forwards at 0.1 s alone and `beside_s`
    beside the worker (3 each), fresh drafts at 0.03 s a sequence, and hits at `hit_rate`."""
    gate = OverlapGate()
    for _ in range(3):
        gate.record_forward(4, 0.100, False)
        gate.record_forward(4, beside_s, True)
    gate.fresh_s.add(0.03)
    gate.hit_rate = hit_rate
    gate.steps = {True: 0, False: 1}
    return gate


def test_the_gate_probes_less_once_one_side_is_twice_the_other():
    """Hand-computed: a 12% slowdown of a 0.1 s forward costs 0.012 s. Hits at a rate of 0.9 save
    0.027 s a step, more than twice that: the other way is tried every 64th step, not every 16th.
    At a rate of 0.3 (0.009 s, within 2x of the cost) every 16th step again."""
    gate = measured_gate(beside_s=0.112, hit_rate=0.9)
    decisions = [gate.wanted(1, 0.1) for _ in range(126)]  # the gate's steps 2..127
    assert [i + 2 for i, d in enumerate(decisions) if not d] == [64]
    gate.hit_rate = 0.3
    decisions = [gate.wanted(1, 0.1) for _ in range(32)]  # steps 128..159
    assert [i + 128 for i, d in enumerate(decisions) if d] == [128, 144]


def test_the_gate_probes_a_firm_choice_half_as_often_after_each_probe_it_outlives():
    """Hand-computed: the forward 150% slower beside the worker (0.15 s of a 0.1 s forward) against hits
    saving 0.027 s: firmly not ahead. Tries of the other way after 64, 128, 256, 512 and 512 steps
    (steps 64, 192, 448, 960, 1472). Once the sides are close (hits saving 0.135 s against 0.15 s) every
    16th step again; firm once more, the wait starts again from 64."""
    gate = measured_gate(beside_s=0.250, hit_rate=0.9)
    decisions = [gate.wanted(1, 0.1) for _ in range(1600)]  # the gate's steps 2..1601
    assert [i + 2 for i, d in enumerate(decisions) if d] == [64, 192, 448, 960, 1472]
    assert not gate.favoured
    gate.fresh_s.add(0.15)
    gate.fresh_s.add(0.15)  # the median 0.15 s: 0.135 s saved against 0.15 s of slowdown
    decisions = [gate.wanted(1, 0.1) for _ in range(32)]  # steps 1602..1633: last probe 1472
    assert [i + 1602 for i, d in enumerate(decisions) if d] == [1602, 1618]
    gate.hit_rate = 0.3  # 0.045 s saved: firm again, the next try 64 steps after the last
    decisions = [gate.wanted(1, 0.1) for _ in range(80)]  # steps 1634..1713
    assert [i + 1634 for i, d in enumerate(decisions) if d] == [1682]


def test_the_hit_rate_follows_the_takes_from_a_weak_prior():
    """Hand-computed: prior 0.3 worth 2 takes. Three hits: (2.8525 + 0.6) / (2.8525 + 2) = 0.71
    (1 + 0.95 + 0.9025 decayed hits); then a miss: (2.7099 + 0.6) / (3.7099 + 2) = 0.58."""
    gate = OverlapGate()
    assert gate.hit_rate == pytest.approx(0.3)
    for _ in range(3):
        gate.record_take(True)
    assert gate.hit_rate == pytest.approx(3.4525 / 4.8525)
    gate.record_take(False)
    assert gate.hit_rate == pytest.approx((0.95 * 2.8525 + 0.6) / (0.95 * 2.8525 + 1 + 2))


def test_the_gate_counts_the_mean_slowdown_and_the_wait_for_the_worker():
    """Hand-computed: without the worker 4-token forwards take 0.1 s; with it, five take 0.1 s, two
    0.17 s and one 2.0 s (a stall): the median says no slowdown; the mean without the largest sample
    0.84 / 7 = 0.12 s, 20%: 0.02 s of a 0.1 s forward. Two sequences at hit rate 0.5 save
    0.5 * 0.03 * 2 = 0.03 s: ahead. Once the engine has waited 0.02 s for the worker after each forward
    (a drafter slower than the target), the cost is 0.04 s: not ahead."""
    gate = OverlapGate()
    for _ in range(5):
        gate.record_forward(4, 0.1, False)
    for seconds in (0.1, 0.17, 0.1, 2.0, 0.1, 0.17, 0.1, 0.1):
        gate.record_forward(4, seconds, True)
    gate.fresh_s.add(0.03)
    gate.hit_rate = 0.5
    gate.steps = {True: 1, False: 2}  # not a probing step
    assert gate.slowdown() == pytest.approx(0.2)
    assert gate.wanted(2, 0.1) is True
    for _ in range(3):
        gate.record_exposed(0.02)
    assert gate.to_dict()["waited_ms"] == pytest.approx(20.0)
    assert gate.wanted(2, 0.1) is False
    assert gate.wanted(4, 0.1) is True  # four sequences' hits save 0.06 s


def test_the_predrafter_hands_the_cost_model_its_gate_and_measures_how_long_predrafts_run():
    cost = CostModel(8)
    for tokens in (2, 4, 6, 2, 4, 6, 2):  # the drafter measured on its own: 0.01 s per draft token
        cost.record_draft(1, tokens, 0, 0.01 * tokens)
    drafter = NgramDrafter()
    drafter.start(0, PROMPT)
    ahead = PreDrafter(drafter, Tracer(), Track("cpu", "drafter (ngram)"), cost)
    assert cost.ahead is ahead.gate and ahead.gate.ahead_factor == 1.0  # before any pre-draft
    ahead.launch([DraftRequest(0, 3)], {0: len(PROMPT)}, {0: [3, 4]}, step=0)
    ahead.wait()
    assert not ahead.gate.ahead_ratio.samples  # 7 calls fitted: too few to compare with
    cost.record_draft(1, 4, 0, 0.04)
    first = ahead.stats.ahead_s
    ahead.launch([DraftRequest(0, 3)], {0: len(PROMPT)}, {0: [3, 4]}, step=1)
    ahead.wait()
    drafted = len(ahead._ready[0].proposal.draft_ids)
    assert drafted == 3
    assert ahead.gate.ahead_factor == pytest.approx((ahead.stats.ahead_s - first) / cost.draft(1, drafted, 0, 0.0, drafted))
    ahead.close()


def test_the_gate_favours_drafting_ahead_only_once_measured_and_not_on_its_probes():
    gate = OverlapGate()
    assert [gate.wanted(1, 0.1) for _ in range(2)] == [True, False] and not gate.favoured  # measuring
    for _ in range(3):
        gate.record_forward(4, 0.100, False)
        gate.record_forward(4, 0.100, True)
    gate.fresh_s.add(0.03)
    gate.hit_rate = 0.9
    decisions = [(gate.wanted(1, 0.1), gate.favoured) for _ in range(62)]  # the gate's steps 3..64
    assert decisions[-1] == (False, True)  # step 64 tries not drafting ahead; ahead stays the choice
    assert all(d == (True, True) for d in decisions[:-1])
