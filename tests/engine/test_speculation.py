"""The k policies: the cost model's choices against hand-computed tables, and the fixed-rule baselines."""

from dataclasses import replace

import pytest

from orchestrator.engine import CatchUp
from orchestrator.engine.overlap import OverlapGate
from orchestrator.engine.speculation import (
    PRIOR_ACCEPTANCE,
    Acceptance,
    Candidate,
    CostModel,
    DraftCost,
    KPolicy,
    VerifyCurve,
    scheduled_k,
)


def model(verify: dict[int, float], draft_per_token: float | None = None, k_max: int = 8,
          batched: bool = False) -> CostModel:
    """A cost model that has measured exactly these costs (an EMA's first sample is the value)."""
    m = CostModel(k_max, batched_drafter=batched)
    for n, seconds in verify.items():
        m.record_forward(n, seconds)
    if draft_per_token is not None:  # no cost per sequence or per catch-up token, so a = c = 0
        for seqs, tokens, catch_up in ((1, 10, 0), (2, 10, 0), (1, 5, 20), (3, 4, 0)):
            m.record_draft(seqs, tokens, catch_up, tokens * draft_per_token)
    return m


def decoding(seq_id: int, k_cap: int = 8, acceptance: Acceptance | None = None, lag: int = 1,
             remaining: int = 1000) -> Candidate:
    return Candidate(seq_id, k_cap, pending=1, acceptance=acceptance or Acceptance(), lag=lag, remaining=remaining)


def linear(v1: float, slope: float, up_to: int = 64) -> dict[int, float]:
    return {n: v1 + slope * (n - 1) for n in range(1, up_to + 1)}


def test_verify_curve_interpolates_between_sizes_and_extrapolates_with_the_prior_slope():
    curve = VerifyCurve(slope=0.05)
    assert not curve.measured and curve(3) == pytest.approx(1.1)  # relative units before any measurement
    curve.record(1, 0.100)
    curve.record(5, 0.150)
    assert curve(1) == 0.100 and curve(3) == pytest.approx(0.125)
    assert curve(9) == pytest.approx(0.150 * (1 + 0.05 * 8) / (1 + 0.05 * 4))


def test_acceptance_rates_are_conditional_per_position_and_shrunk_towards_the_prior():
    own = Acceptance()
    own.record(3, 1)  # position 1 accepted, 2 rejected, 3 never judged
    own.record(3, 3)
    own.record(3, 0)  # position 1 rejected
    # position 1: 2 of 3 accepted; position 2: 1 of 2 judged; position 3: 1 of 1 judged
    assert own.rate(0, prior=0.5, weight=2) == pytest.approx((2 + 1) / (3 + 2))
    assert own.rate(1, prior=0.5, weight=2) == pytest.approx((1 + 1) / (2 + 2))
    assert own.rate(2, prior=0.5, weight=2) == pytest.approx((1 + 1) / (1 + 2))
    assert own.rate(5, prior=0.3, weight=2) == pytest.approx(0.3)  # never drafted: the prior


def test_unmeasured_positions_continue_at_the_last_measured_rate():
    m = CostModel(8, prior_weight=2.0)
    for _ in range(500):
        m.record_verify(Acceptance(), 2, 2)  # the drafter is always right, but only 2 deep was tried
    rates = m.pooled_rates()
    assert rates[0] > 0.99 and rates[1] > 0.99 and rates[5] > 0.99  # not the 0.6 prior
    assert m.p_through(Acceptance(), 5) > 0.95


# (verify seconds by tokens in the forward, draft seconds per token, expected k) for one decoding
# sequence with nothing measured about acceptance: P(drafts 1..j accepted) = 0.6 ** j.
# Expected tokens / step time, from k = 0 upwards (the greedy stops at the first k that lowers it):
SINGLE = [
    # free verify and drafts: every draft adds tokens and no time -> the cap
    (linear(1.0, 0.0), 0.0, 8),
    # verify +0.5 per token: k=0 1/1, k=1 1.6/1.5 = 1.067, k=2 1.96/2.0 = 0.98 -> 1
    (linear(1.0, 0.5), 0.0, 1),
    # verify +0.1, drafts 0.1: k=1 1.6/1.2 = 1.333, k=2 1.96/1.4 = 1.4, k=3 2.176/1.6 = 1.36 -> 2
    (linear(1.0, 0.1), 0.1, 2),
    # drafts cost 0.7 of a step: k=1 1.6/1.7 = 0.94 < 1 -> 0, speculation does not pay
    (linear(1.0, 0.0), 0.7, 0),
]


@pytest.mark.parametrize("verify, draft, expected", SINGLE)
def test_one_sequence_gets_the_hand_computed_k(verify, draft, expected):
    assert PRIOR_ACCEPTANCE == 0.6
    plan = model(verify, draft).plan([decoding(0)])
    assert plan.ks == {0: expected}


def test_measured_acceptance_raises_k_and_the_expectation_matches_it():
    m = model(linear(1.0, 0.1), 0.1)
    good = Acceptance()
    for _ in range(200):
        good.record(8, 8)  # everything accepted: P -> (200 + 8 * prior) / 208, close to 1
    plan = m.plan([decoding(0, acceptance=good)])
    # k=8: 1 + 8 * ~0.99 = 8.9 tokens over 1 + 0.8 + 0.8 = 2.6 s beats every shorter draft
    assert plan.ks == {0: 8}
    assert plan.expected_tokens == pytest.approx(m.expected_tokens(good, 8))
    assert plan.expected_s == pytest.approx(1.0 + 0.1 * 8 + 0.1 * 8, rel=1e-3)


def test_a_bigger_batch_drafts_less_because_verify_grows_with_batch_times_k():
    """Verify cost 1 + 0.1 per token in the forward, free drafts: alone a sequence drafts 3; in a
    batch of 8 the step already costs 1.7, and only a first draft beats the batch's rate."""
    m = model(linear(1.0, 0.1, up_to=128), 0.0)
    alone = m.plan([decoding(0)]).ks[0]
    batch = m.plan([decoding(i) for i in range(8)]).ks
    # alone: k=0 1.0, k=1 1.6/1.1 = 1.455, k=2 1.96/1.2 = 1.633, k=3 2.176/1.3 = 1.674,
    # k=4 2.306/1.4 = 1.647 -> 3. batch of 8: rate 8/1.7 = 4.71 per s; a first draft (0.6 tokens
    # for 0.1 s) is 6/s > 4.71, a second (0.36 for 0.1) is 3.6/s: every sequence drafts 1 at most
    assert alone == 3
    assert set(batch.values()) == {1}


def test_a_prompt_prefilled_in_the_step_does_not_make_drafts_look_cheap():
    """Verify 1 + 0.01 s per token after the first; sequence 0 decodes (k <= 1, first draft accepted at
    0.6), sequence 1 prefills 99 tokens. Counting the prefill, the step commits 2 tokens in V(100) = 1.99
    s (1.005/s) and a draft costing 0.4 s raises that to 2.6 / 2.39 = 1.088/s. But the prompt is run
    either way, and the two sequences then decode at 2 / V(2) = 1.98/s: the draft's 2.6 / (1.02 + 0.4) =
    1.83/s falls short of it. A draft costing 0.2 s gives 2.6 / 1.22 = 2.13/s: it pays."""
    prefill = Candidate(1, 0, pending=99, acceptance=Acceptance())
    assert model(linear(1.0, 0.01, up_to=128), 0.4).plan([decoding(0, k_cap=1), prefill]).ks == {0: 0, 1: 0}
    assert model(linear(1.0, 0.01, up_to=128), 0.2).plan([decoding(0, k_cap=1), prefill]).ks == {0: 1, 1: 0}
    # alone, the 0.4 s draft pays: 1.6 / 1.42 = 1.13/s against 1 / V(1) = 1/s
    assert model(linear(1.0, 0.01, up_to=128), 0.4).plan([decoding(0, k_cap=1)]).ks == {0: 1}


def test_after_a_long_run_without_drafts_the_cheapest_sequence_is_probed():
    m = model(linear(1.0, 0.0), 0.4)
    batch = [decoding(0, lag=40), decoding(1, lag=3), decoding(2, lag=9)]
    for _ in range(31):
        assert set(m.plan(batch).ks.values()) == {0}
    assert m.plan(batch).ks == {0: 0, 1: 1, 2: 0}  # the one with the least to catch up
    assert set(m.plan(batch).ks.values()) == {0}


def test_a_probe_waits_until_it_costs_a_small_share_of_the_time_since_the_last_draft():
    """A probe's draft costs 0.99 s against flat 1 s steps: within 2% of the idle time after 50 steps,
    not after 32."""
    m = model(linear(1.0, 0.0), 0.99)
    batch = [decoding(0, lag=1), decoding(1, lag=1)]
    assert [sum(m.plan(batch).ks.values()) for _ in range(50)] == [0] * 49 + [1]


def test_each_probe_that_leaves_every_plan_at_k0_halves_what_the_next_may_cost():
    """A probe's draft costs 0.983 s against flat 1 s steps: at 2% of the idle time after 50 steps (49.15
    s); then at 1%, 0.5% and 0.25% after 99, 197 and 394 steps (98.3, 196.6, 393.2 s), and 0.25% from then
    on. Once a plan drafts on its own (drafts turned cheap), the next probe waits for 2% again."""
    m = model(linear(1.0, 0.0), 0.983)
    batch = [decoding(0, lag=1), decoding(1, lag=1)]
    probes = [i + 1 for i in range(1134) if sum(m.plan(batch).ks.values())]
    assert probes == [50, 149, 346, 740, 1134]
    slow, m.draft = m.draft, model({}, 0.01).draft  # drafts now 0.01 s a token: k > 0 pays
    assert sum(m.plan(batch).ks.values()) > 1
    m.draft = slow  # and 0.983 s again
    assert [i + 1 for i in range(50) if sum(m.plan(batch).ks.values())] == [50]


def test_draft_cost_is_fitted_per_sequence_token_and_catch_up_token():
    m = CostModel(8)
    a, b, c = 0.004, 0.010, 0.001
    for seqs, tokens, catch_up in ((1, 4, 0), (4, 4, 0), (2, 12, 100), (3, 3, 10), (1, 8, 500)):
        m.record_draft(seqs, tokens, catch_up, a * seqs + b * tokens + c * catch_up)
    assert m.draft(2, 6, 50, prior=1.0) == pytest.approx(a * 2 + b * 6 + c * 50, rel=1e-2)
    # a catch-up is paid once for the rest of the sequence: 399 tokens (0.4 s) are not worth it for a
    # sequence with 4 tokens to go, and are for one with 1000 to go (0.4 s over ~600 steps)
    cheap_verify = model(linear(0.1, 0.0), None)
    cheap_verify.draft = m.draft
    plan = cheap_verify.plan([decoding(0, k_cap=1, lag=1), decoding(1, k_cap=1, lag=400, remaining=4)])
    assert plan.ks == {0: 1, 1: 0}
    plan = cheap_verify.plan([decoding(0, k_cap=1, lag=1), decoding(1, k_cap=1, lag=400, remaining=1000)])
    assert plan.ks == {0: 1, 1: 1}
    assert plan.expected_s == pytest.approx(0.1 + a * 2 + b * 2 + c * 399, rel=1e-2)  # the step pays it all


def test_caps_and_prefilling_sequences_are_respected():
    m = model(linear(1.0, 0.0, up_to=256), 0.0)
    prefill = Candidate(1, k_cap=0, pending=100, acceptance=Acceptance())
    plan = m.plan([decoding(0, k_cap=3), prefill])
    assert plan.ks == {0: 3, 1: 0}


@pytest.mark.parametrize("batch, disable, schedule, expected", [
    (1, None, (), 6),
    (4, 4, (), 0),  # vLLM: off from batch size 4 on
    (3, 4, (), 6),
    (1, None, ((1, 8), (4, 4), (16, 2)), 6),  # TensorRT-LLM: min(k, scheduled)
    (5, None, ((1, 8), (4, 4), (16, 2)), 4),
    (16, None, ((1, 8), (4, 4), (16, 2)), 2),
])
def test_fixed_rules(batch, disable, schedule, expected):
    assert scheduled_k(6, batch, disable, schedule) == expected
    policy = KPolicy("fixed", 6, disable, schedule)
    plan = policy.plan([decoding(i) for i in range(batch)], {})
    assert set(plan.ks.values()) == {expected}


def test_confidence_early_stop_threshold_is_calibrated_on_acceptance():
    m = CostModel(8)
    assert m.confidence.threshold(0.5) == 0.0  # nothing calibrated yet: no early stop
    for i in range(50):
        m.confidence.record([0.92], num_accepted=int(i % 10 != 0))  # 90% of confident drafts accepted
        m.confidence.record([0.31], num_accepted=int(i % 5 == 0))  # 20% of doubtful ones
    # bin [0.30, 0.35) falls short of a 0.5 break-even: stop below 0.35; the 0.9 bin stands
    assert m.confidence.threshold(0.5) == pytest.approx(0.35)
    assert m.confidence.threshold(0.1) == 0.0  # both pay when a draft is that cheap


def test_confidence_is_binned_by_the_whole_drafts_probability_against_all_drafts_so_far_accepted():
    """0.9 x 0.8 x 0.5: the three tokens fall in the bins of 0.9, 0.72 and 0.36; with the first accepted
    and the second rejected, only the first counts as accepted, and the third (never judged on its own)
    counts against its bin: a draft through it was not accepted."""
    bins = CostModel(8).confidence
    bins.record([0.9, 0.8, 0.5], num_accepted=1)
    assert [b for b, n in enumerate(bins.drafted) if n] == [7, 14, 18]
    assert bins.accepted[18] == 1.0 and bins.accepted[14] == 0.0 and bins.accepted[7] == 0.0


def test_a_draft_runs_past_the_plan_only_from_measured_confident_bins_that_pay():
    """Bins from the top: 0.95+ accepted 95%, 0.9+ 70%, 0.85+ 40%. At a break-even of 0.6 a draft past
    the plan goes on while the whole draft's probability is >= 0.9; at 0.3, >= 0.85; at 0.96 none. A
    gap at the top (0.95+ never measured) stretches nothing, whatever the rest."""
    bins = CostModel(8).confidence
    for i in range(40):
        bins.record([0.97], num_accepted=int(i % 20 != 0))
        bins.record([0.92], num_accepted=int(i % 10 < 7))
        bins.record([0.87], num_accepted=int(i % 10 < 4))
    assert bins.stretch_threshold(0.6) == pytest.approx(0.90)
    assert bins.stretch_threshold(0.3) == pytest.approx(0.85)
    assert bins.stretch_threshold(0.96) is None
    gap = CostModel(8).confidence
    for _ in range(40):
        gap.record([0.92], num_accepted=1)
    assert gap.stretch_threshold(0.1) is None


def test_the_stretch_break_even_prices_positions_a_sequence_drafts_alone_past_the_plan():
    """One sequence at k = 1 (verify 1.0 + 0.1 a token, 0.2 a draft token): 4 drafts more add 0.4 of
    verify and 0.8 of drafting, 0.3 s a token, times the plan's expected rate."""
    m = model(linear(1.0, 0.1), 0.2)
    plan = m.plan([decoding(0)])
    assert plan.ks == {0: 1}
    rate = plan.expected_tokens / plan.expected_s
    assert m.stretch_break_even(plan) == pytest.approx(0.3 * rate, rel=1e-3)
    policy = KPolicy("auto", 8)
    policy.cost, policy.stretch = m, True
    assert policy.early_stop(plan, stretches=True)[1] is None  # nothing calibrated: no stretch
    for _ in range(40):
        m.confidence.record([0.97], num_accepted=1)
    assert policy.early_stop(plan, stretches=True)[1] == pytest.approx(0.95)
    assert policy.early_stop(plan, stretches=False)[1] is None  # a drafter that cannot stop early
    assert KPolicy("fixed", 4).early_stop(plan, stretches=True) == (0.0, None)


def test_break_even_is_the_marginal_draft_time_times_the_expected_rate():
    m = model(linear(1.0, 0.1), 0.2)
    assert m.break_even(m.plan([decoding(0)])) == 0.0  # a single draft (k = 1) is never trimmed
    plan = m.plan([decoding(0), decoding(1)])
    assert plan.ks == {0: 1, 1: 1}
    rate = plan.expected_tokens / plan.expected_s
    assert m.break_even(plan) == pytest.approx((0.2 + 0.1) * rate, rel=1e-3)


def test_a_batched_drafters_run_per_position_is_shared_by_the_batch():
    """A drafter that pays 0.3 s per draft position whatever the rows (batched), a flat verify of 1 s.
    In a batch of 4 one sequence's draft alone does not pay (4.6 / 1.3 = 3.54 < 4 tokens/s), a first
    position for all four does (6.4 / 1.3 = 4.92), a second does not (7.84 / 1.6 = 4.90)."""
    m = model(linear(1.0, 0.0), batched=True)
    for positions, seqs, tokens, catch_up in ((1, 1, 1, 0), (2, 4, 8, 0), (4, 2, 5, 10), (3, 3, 9, 0), (1, 4, 4, 0)):
        m.record_draft(seqs, tokens, catch_up, 0.3 * positions, positions=positions)
    assert m.draft(4, 4, 0, prior=1.0, positions=1) == pytest.approx(0.3, abs=1e-3)
    plan = m.plan([decoding(i) for i in range(4)])
    assert plan.ks == {0: 1, 1: 1, 2: 1, 3: 1}
    assert plan.expected_tokens == pytest.approx(4 * 1.6) and plan.expected_s == pytest.approx(1.3, rel=1e-3)
    # alone, one position pays for itself: 1.6 / 1.3 = 1.23 > 1; a second: 1.96 / 1.6 = 1.225 does not
    assert m.plan([decoding(0)]).ks == {0: 1}


@pytest.mark.parametrize("batched, four_rows", [(True, 0.535), (False, 1.24)])
def test_one_sequence_calls_are_read_the_way_the_drafter_runs(batched, four_rows):
    """Calls that all draft one sequence cannot tell a per-call cost from a per-sequence one, nor a
    position from a token. Measured: 0.01 s + 0.3 s per token. A batched drafter reads a quarter of
    a position as per row at that position (four rows at one position: 0.01 + 0.75 x 0.3 + 4 x 0.25
    x 0.3 = 0.535; within 3%: a batched drafter's per-call term is held near 0 by the ridge, and part
    of its 0.01 s is read per position); one that drafts sequence by sequence as all per row (four
    rows cost four times one)."""
    m = CostModel(8, batched_drafter=batched)
    for _ in range(20):
        for k in (1, 2, 4):
            m.record_draft(1, k, 0, 0.01 + 0.3 * k, positions=k)
    assert m.draft(1, 3, 0, prior=1.0, positions=3) == pytest.approx(0.91, rel=1e-2)  # either way
    assert m.draft(4, 4, 0, prior=1.0, positions=1) == pytest.approx(four_rows, rel=3e-2)
    for n, seconds in linear(1.0, 0.0).items():
        m.record_forward(n, seconds)
    # a flat 1 s verify, p = 0.6: four sequences at one position commit 6.4 tokens in 1.54 s (4.15/s)
    # batched, 2.24 s (2.9/s) row by row, against 4 tokens in 1 s without drafts
    assert set(m.plan([decoding(i) for i in range(4)]).ks.values()) == ({1} if batched else {0})


def test_lookahead_finds_drafts_that_pay_only_together():
    """A verify curve with a step: two tokens cost 1.7 s against 1 s for one, and more cost no more.
    One draft alone loses (1.6 / 1.71 = 0.94 tokens/s < 1), eight win (2.475 / 1.78 = 1.39): a
    one-draft-at-a-time greedy would stop at k = 0."""
    m = model({1: 1.0, **{n: 1.7 for n in range(2, 10)}}, 0.01)
    plan = m.plan([decoding(0)])
    assert plan.ks == {0: 8}
    assert plan.expected_tokens == pytest.approx(1 + 0.6 * (1 - 0.6 ** 8) / 0.4)
    assert plan.expected_s == pytest.approx(1.78, rel=1e-3)


def test_a_dip_in_the_measured_verify_curve_is_pooled_with_its_neighbour():
    """Measured V(8) = 0.2 s below V(4) = 0.3 s (noise), each once: the isotonic fit pools them at
    0.25, so V(6) = 0.25 and the token after 4 does not look free; V(12) interpolates to V(16)."""
    curve = VerifyCurve(decay=1.0)
    for n, seconds in ((1, 0.1), (4, 0.3), (8, 0.2), (16, 0.5)):
        curve.record(n, seconds)
    assert [curve(n) for n in (4, 6, 8, 12)] == pytest.approx([0.25, 0.25, 0.25, 0.375])


def test_a_spike_at_a_size_seen_once_is_outweighed_by_well_measured_larger_sizes():
    """Size 3 spiked once at 0.5 s; sizes 4 and 5 were measured 9 times each at 0.12 s. The running
    maximum would have held 0.5 s for every size from 3 on (and the plan would never draft two again
    to correct it); pooled by weight, V(3) = V(4) = V(5) = (0.5 + 18 x 0.12) / 19."""
    curve = VerifyCurve(decay=1.0)
    curve.record(1, 0.1)
    curve.record(3, 0.5)
    for _ in range(9):
        curve.record(4, 0.12)
        curve.record(5, 0.12)
    pooled = (0.5 + 18 * 0.12) / 19
    assert [curve(n) for n in (1, 3, 4, 5)] == pytest.approx([0.1, pooled, pooled, pooled])


def test_an_old_measurement_weighs_less_than_a_fresh_one():
    """Same spike, but 300 records ago: its weight 0.99^300 = 0.049 against one fresh sample at 4."""
    curve = VerifyCurve(decay=0.99)
    curve.record(3, 0.5)
    for _ in range(299):
        curve.record(1, 0.1)
    curve.record(4, 0.12)
    w = 0.99 ** 300
    assert curve(3) == pytest.approx((0.5 * w + 0.12) / (w + 1))


def test_one_stalled_forward_does_not_move_a_measured_size():
    """Five forwards over 3 tokens, one stalled at 1 s: the size reads the median, 0.07 s."""
    curve = VerifyCurve()
    for seconds in (0.07, 0.069, 1.0, 0.071, 0.07):
        curve.record(3, seconds)
    assert curve(3) == pytest.approx(0.07)


def test_a_batched_drafters_rows_cost_per_position_once_calls_of_several_rows_tell():
    """One row at one position took 12 ms, 16 rows at one position (a step drafting a token a row)
    48 ms: a run costs a + 16 b, so b = 36 / 15 = 2.4 ms and a = 9.6 ms, and 16 rows at 5 positions
    5 x (9.6 + 16 x 2.4) = 240 ms.
    With a per-call and a per-sequence term also free to take a share (the fit before), half the run
    and half the rows were read once per call: 144 ms (in this VM's trace such a fit foresaw 91 ms
    for a step that took 264)."""
    cost = DraftCost(batched=True)
    for _ in range(3):
        cost.record(1, 1, 0, 0.012, positions=1)
        cost.record(16, 16, 0, 0.048, positions=1)
    assert cost(16, 80, 0, 0.0, positions=5) == pytest.approx(0.240, rel=1e-2)


def test_a_stalled_drafter_call_barely_moves_the_fit():
    """Calls of two positions took 0.02 s; one stalled at 2 s. Weighted by 1 / t^2 it counts 10^4
    times less than an ordinary call: the next prediction stays within 0.01 s of 0.02 s, where an
    unweighted fit would read about 0.14 s."""
    cost = DraftCost(batched=True)
    for _ in range(20):
        cost.record(1, 2, 0, 0.02, positions=2)
    cost.record(1, 2, 0, 2.0, positions=2)
    assert 0.02 < cost(1, 2, 0, 0.0, positions=2) < 0.03


def test_draft_cost_holds_a_term_at_zero_and_refits_the_rest():
    """One-sequence calls at 1, 2 and 3 positions took 0.016, 0.04 and 0.06 s. The line t = o + a x
    positions has o < 0 whatever the weights (unweighted o = -0.0053 s, a = 0.022 s). No cost is
    negative, so o is held at 0 and a refitted through the origin. Weighted by the fit's own foresight
    (1 / (a k)^2) that settles at the mean of t / k: (0.016 + 0.02 + 0.02) / 3 = 0.018667 s per position,
    two positions 0.037333 s. Clipping o afterwards and keeping a would predict two positions at 0.044
    s, 18% dear. (Within 0.5%: the first call is weighed by its own time, the fit decays older calls
    and has a small ridge.)"""
    cost = DraftCost(batched=True)
    for _ in range(5):
        for k, seconds in ((1, 0.016), (2, 0.04), (3, 0.06)):
            cost.record(1, k, 0, seconds, positions=k)
    assert cost(1, 2, 0, 0.0, positions=2) == pytest.approx(2 * 0.056 / 3, rel=5e-3)
    assert cost(1, 1, 0, 0.0, positions=1) == pytest.approx(0.056 / 3, rel=5e-3)


def test_draft_cost_reads_the_mean_of_calls_that_alternate_fast_and_slow():
    """16 rows at one position taking 45 and 120 ms by turns (the INT4 drafter at 16 streams on a 2-core
    Xeon): weighted by their own times the fast calls count 7x the slow ones and the fit reads
    (1/45 + 1/120) / (1/45^2 + 1/120^2) = 54.3 ms; weighted by what the fit foresaw, every call of the
    shape weighs alike: the mean, 82.5 ms (within 3%: the fit decays older calls)."""
    cost = DraftCost(batched=True)
    for _ in range(20):
        cost.record(16, 16, 0, 0.045, positions=1)
        cost.record(16, 16, 0, 0.120, positions=1)
    assert cost(16, 16, 0, 0.0, positions=1) == pytest.approx(0.0825, rel=0.03)


def test_a_long_catch_up_does_not_decide_the_fit_for_ordinary_steps():
    """Sixteen sequences' first draft catches up 2,400 prompt tokens in 3.9 s; then steps of 4
    positions take 0.2 s. Fitted in absolute terms the catch-up call dominates; in relative terms the
    ordinary step is predicted within 10%."""
    cost = DraftCost(batched=True)
    cost.record(16, 64, 2400, 3.9, positions=4)
    for _ in range(6):
        cost.record(16, 64, 0, 0.2, positions=4)
        cost.record(16, 32, 16, 0.17, positions=2)
    assert cost(16, 64, 0, 0.0, positions=4) == pytest.approx(0.2, rel=0.1)
    assert cost(16, 32, 16, 0.0, positions=2) == pytest.approx(0.17, rel=0.1)


PROBE_S, PROBE_CATCH_UP = 0.0837, CatchUp(0.0741, 39)  # one row drafts one token after 39 to catch up


def test_a_probe_whose_catch_up_is_timed_apart_prices_drafts_at_what_they_took():
    """The INT4 drafter here: 7 ms a run and 2.6 ms a row per position, 1.9 ms a catch-up token. A probe
    (one row, one draft, 39 tokens caught up) takes 83.7 ms. Fitted together the catch-up term takes it
    all and 16 rows drafting cost under 1 ms; timed apart, the 9.6 ms draft is read 3:1 per run : per
    row at the position (a = 7.2 ms, b = 2.4 ms): 16 rows at one position 7.2 + 16 x 2.4 = 45.6 ms
    (48.9 measured), a catch-up token 74.1 / 39 = 1.9 ms."""
    joint, timed = DraftCost(batched=True), DraftCost(batched=True)
    joint.record(1, 1, 39, PROBE_S, positions=1)
    timed.record(1, 1, 39, PROBE_S, positions=1, timed=PROBE_CATCH_UP)
    assert joint(16, 16, 0, 0.0, positions=1) < 0.001
    assert timed(16, 16, 0, 0.0, positions=1) == pytest.approx(0.0456, rel=2e-3)
    assert timed(1, 1, 0, 0.0, positions=1) == pytest.approx(PROBE_S - PROBE_CATCH_UP.seconds, rel=1e-3)
    assert timed(1, 0, 10, 0.0, positions=0) - timed(1, 0, 0, 0.0, positions=0) == pytest.approx(0.019, rel=1e-3)


@pytest.mark.parametrize("catch_up, starts", [(None, True), (PROBE_CATCH_UP, False)])
def test_after_one_probe_a_wave_of_16_starts_drafting_only_if_drafts_look_free(catch_up, starts):
    """The probe above, then 16 new sequences 44 prompt tokens behind with 48 to generate (30 steps at
    1.6 tokens: the catch-up is spread over them), verify 0.085 + 0.001 per token (V(16) 0.1 s: 160
    tokens/s without drafts). Fitted together (c 2.1 ms, drafts ~0): three positions each commit 16 x
    2.18 = 34.9 tokens in V(64) 0.148 + 16 x 44 x 2.1 ms / 30 = 0.049: 178 tokens/s, so all 16 start
    (the bench's x16 cell lost this way). Timed apart: the 16 rows' three positions cost 0.091 s and the
    catch-ups 0.045: 122 tokens/s; one sequence alone 16.6 / (V(17) 0.101 + 0.0096 + 0.0028) = 146: none
    starts."""
    m = CostModel(8, batched_drafter=True)
    for n, seconds in linear(0.085, 0.001, up_to=160).items():
        m.record_forward(n, seconds)
    m.record_draft(1, 1, 39, PROBE_S, positions=1, timed=catch_up)
    wave = m.plan([decoding(i, lag=45, remaining=48) for i in range(16)])
    assert (set(wave.ks.values()) != {0}) == starts


def test_break_even_averages_the_plans_draft_time_over_its_drafts():
    """One token costs 1 s, two to five 1.5 s (a step), six 3 s; drafts 0.01 s each: the plan drafts 4
    (the cap). The next token's own cost (0.01 + V(6) - V(5) = 1.51 s) times the rate would put the
    break-even above 1, stopping every draft; the plan's average draft costs (1.54 - 1) / 4 = 0.135 s:
    break-even 0.135 x 2.3056 / 1.54 = 0.202."""
    m = model({1: 1.0, **{n: 1.5 for n in range(2, 6)}, 6: 3.0}, 0.01, k_max=4)
    plan = m.plan([decoding(0, k_cap=4)])
    assert plan.ks == {0: 4} and plan.expected_s == pytest.approx(1.54, rel=1e-3)
    assert m.break_even(plan) == pytest.approx(0.135 * 2.3056 / 1.54, rel=1e-3)


def overlapped(hit_rate: float, factor: float, favoured: bool = True) -> OverlapGate:
    """The overlap gate as the engine leaves it: its choice, the hit rate, one pre-draft measured at
    `factor` times the drafter's cost on its own."""
    gate = OverlapGate()
    gate.favoured, gate.hit_rate = favoured, hit_rate
    gate.ahead_ratio.add(factor)
    return gate


# (verify, draft seconds per token, hit rate, ahead factor, expected k) for one greedy sequence drafting
# ahead; P(drafts 1..j accepted) = 0.6 ** j. A step costs V(1 + k) + (1 - hit) * D(k) + the wait
# max(0, factor * D(k + 1) - V(1 + k)).
OVERLAPPED = [
    # V = 1 + 0.05 per token, drafts 0.1: the pre-draft always fits; T = 1 + 0.05k + 0.02k:
    # k=3 2.176/1.21 = 1.798, k=4 2.3056/1.28 = 1.801, k=5 2.38336/1.35 = 1.765 -> 4 (sequential: 2)
    (linear(1.0, 0.05), 0.1, 0.8, 1.0, 4),
    # flat V = 1, drafts 0.3: k=1 1.6/1.06 = 1.509, k=2 1.96/1.12 = 1.75 (the pre-draft of 3 takes 0.9),
    # k=3 waits 0.2: 2.176/1.38 = 1.577 -> 2 (sequential: 1)
    (linear(1.0, 0.0), 0.3, 0.8, 1.0, 2),
    # the same pre-draft running 1.5x as long beside the target: k=2 waits 0.35, 1.96/1.47 = 1.333 < k=1 -> 1
    (linear(1.0, 0.0), 0.3, 0.8, 1.5, 1),
]


@pytest.mark.parametrize("verify, draft, hit_rate, factor, expected", OVERLAPPED)
def test_drafting_ahead_plans_k_against_the_hidden_and_the_waited_draft_time(verify, draft, hit_rate, factor,
                                                                              expected):
    m = model(verify, draft)
    sequential = m.plan([decoding(0)])
    m.ahead = overlapped(hit_rate, factor)
    plan = m.plan([Candidate(0, 8, pending=1, acceptance=Acceptance(), ahead=True)])
    assert plan.ks == {0: expected} and plan.overlapped
    k = expected
    wait = max(0.0, factor * draft * (k + 1) - verify[1 + k])
    assert plan.expected_s == pytest.approx(verify[1 + k] + (1 - hit_rate) * draft * k + wait, rel=1e-3)
    assert sequential.ks == {0: {4: 2, 2: 1, 1: 1}[expected]} and not sequential.overlapped


def test_drafting_ahead_is_costed_only_when_the_gate_favours_it_and_no_drafting_sequence_samples():
    m = model(linear(1.0, 0.05), 0.1)
    greedy = Candidate(0, 8, pending=1, acceptance=Acceptance(), ahead=True)
    sampled = Candidate(1, 8, pending=1, acceptance=Acceptance(), ahead=False)
    prefilling = Candidate(2, 0, pending=50, acceptance=Acceptance(), ahead=False)
    m.ahead = overlapped(0.8, 1.0, favoured=False)
    assert not m.overlapped([greedy]) and m.plan([greedy]).ks == {0: 2}
    m.ahead.favoured = True
    assert m.overlapped([greedy, prefilling]) and not m.overlapped([greedy, sampled])
    assert m.plan([greedy]).ks == {0: 4}


def test_break_even_drafting_ahead_counts_only_the_draft_time_the_engine_pays():
    """Two greedy sequences, verify 1 + 0.1 per token, drafts 0.2 each, all hidden but the misses (hit
    rate 0.8): a draft costs 0.1 + 0.2 * 0.2 = 0.14 s, not 0.3 s."""
    m = model(linear(1.0, 0.1), 0.2)
    m.ahead = overlapped(0.8, 1.0)
    plan = m.plan([Candidate(i, 8, pending=1, acceptance=Acceptance(), ahead=True) for i in range(2)])
    drafted = sum(plan.ks.values())
    assert plan.overlapped and drafted >= 2
    assert m.break_even(plan) == pytest.approx(0.14 * plan.expected_tokens / plan.expected_s, rel=1e-3)


def test_before_any_drafter_call_catching_up_is_not_free():
    """Verify 1 + 0.01 per token, nothing measured of the drafter (a batched one: 0.1 per position of
    one row before any call, a quarter of it per row: 16 rows 0.475; 0.03 per catch-up token). 16
    sequences 48 tokens from the end: drafting one token each gains 16 x 0.6 tokens; with nothing to
    catch up that pays (25.6 / (V(32) 1.31 + 0.475) = 14.3 > 16 / V(16) 1.15 = 13.9 tokens per unit).
    With 44 prompt tokens each to catch up first, spread over the 30 steps a sequence has left
    (48 / 1.6): 16 x 1.47 x 0.03 = 0.70 more: 10.3, so no sequence starts (alone: 16.6 / (1.16 + 0.1 +
    0.044) = 12.7, also below)."""
    m = CostModel(8, batched_drafter=True)
    for n, seconds in linear(1.0, 0.01, up_to=160).items():
        m.record_forward(n, seconds)
    assert not m.draft.measured
    caught_up = [decoding(i, lag=1, remaining=48) for i in range(16)]
    assert set(m.plan(caught_up).ks.values()) != {0}
    behind = [decoding(i, lag=45, remaining=48) for i in range(16)]
    assert set(m.plan(behind).ks.values()) == {0}


@pytest.mark.parametrize("opening_per_token, starts", [(None, False), (0.0, True), (0.01, False)])
def test_a_hand_off_is_priced_like_a_catch_up(opening_per_token, starts):
    """The case above with nothing to catch up (16 rows drafting one token: 25.6 / (V(32) 1.31 + 0.475)
    = 14.3 > 13.9 tokens per unit), but each sequence's first draft takes over 45 tokens of the
    target's K/V. Hand-offs timed at 0.01 a token: 0.45 a sequence, spread over its 30 steps, 16 x
    0.015 = 0.24 more: 12.6, and alone 16.6 / (1.16 + 0.1 + 0.015) = 13.0: none starts. Before any is
    timed, a token costs 5% of a draft token's prior (0.005): 16 x 0.0075 more, 13.4: none starts
    either. Timed free (an n-gram drafter, say) they all start. A plan whose sequences do start pays the
    hand-offs whole."""
    m = CostModel(8, batched_drafter=True)
    for n, seconds in linear(1.0, 0.01, up_to=160).items():
        m.record_forward(n, seconds)
    if opening_per_token is not None:
        m.record_opening(100, 100 * opening_per_token)
    batch = [replace(decoding(i, lag=1, remaining=48), opening=45) for i in range(16)]
    assert (set(m.plan(batch).ks.values()) != {0}) == starts
    assert m.opening_seconds(45) == pytest.approx(45 * (0.005 if opening_per_token is None else opening_per_token))
    forced = m.evaluate(batch, {c.seq_id: 1 for c in batch})
    assert forced.expected_s == pytest.approx(1.31 + 0.475 + 16 * m.opening_seconds(45))


def test_rows_beyond_the_widest_call_seen_cost_at_least_the_priors_share():
    """Two-row calls cannot tell a run from a row: here one row of two stopped early now and then at no
    saving, so they fit 10 ms a position and (almost) nothing a row. 16 rows at 5 positions are then
    priced with each row-position at 0.25 of a one-row position, not at ~50 ms; once a 16-row call is
    measured, the fit prices it."""
    d = DraftCost(batched=True)
    for positions, stopped in ((2, 0), (3, 1), (2, 1), (3, 0), (4, 1), (4, 0)):
        d.record(2, 2 * positions - stopped, 0, 0.010 * positions, positions)
    coef = d._coef
    assert coef[3] < 0.0005 and d(2, 8, 0, 0.0, 4) == pytest.approx(0.040, rel=0.05)
    a_plus_b = coef[1] + coef[3]
    assert d(16, 80, 0, 0.0, 5) == pytest.approx(5 * coef[1] + 80 * 0.25 * a_plus_b + 16 * coef[2], rel=1e-6)
    assert d(16, 80, 0, 0.0, 5) > 0.2
    for _ in range(6):
        d.record(16, 80, 0, 0.300, 5)
    assert d.max_rows == 16 and d(16, 80, 0, 0.0, 5) == pytest.approx(0.300, rel=0.15)
