"""Acceptance policies against hand-computed tables: exact accept counts for given logits."""

import math

import pytest
import torch

from orchestrator.acceptance_policy import DEFAULT_BUDGET, AcceptancePolicy
from orchestrator.config import SamplingParams
from orchestrator.engine.acceptance import drift, lossy_accepted, normalised_kl, verify_request
from orchestrator.errors import InvalidRequestError

LOG4 = math.log(4)


def logits(*rows: list[float]) -> torch.Tensor:
    """[1, len(rows), 4] logits whose softmax is exactly each row of probabilities."""
    return torch.log(torch.tensor([rows], dtype=torch.float64).clamp(min=1e-12)).float()


def judge(name: str, drafts: list[int], target: torch.Tensor, start_pos: int = 0, **options) -> int:
    policy = AcceptancePolicy.parse(name, options)
    ids = torch.tensor([drafts])
    return int(lossy_accepted(policy, ids, torch.tensor([len(drafts)]), target, None, torch.tensor([start_pos]))[0])


# the target's probabilities at four positions (the fourth is the bonus position, never judged)
P = ([0.5, 0.3, 0.1, 0.1],  # draft 1: p = 0.3, not the argmax
     [0.1, 0.1, 0.8, 0.0],  # draft 2: p = 0.8, the argmax
     [0.05, 0.05, 0.1, 0.8],  # draft 2: p = 0.1
     [0.25, 0.25, 0.25, 0.25])


def test_nkl_of_a_greedy_draft_is_minus_log_p_over_log_vocab():
    """One-hot q: KL(q || p) = -log p(draft). At temperature 1: -log 0.3 / log 4 = 0.868,
    -log 0.8 / log 4 = 0.161, -log 0.1 / log 4 = 1.661."""
    nkl = normalised_kl(torch.tensor([[1, 2, 2]]), logits(*P)[:, :3], None, temperature=1.0)
    assert nkl[0].tolist() == pytest.approx([-math.log(0.3) / LOG4, -math.log(0.8) / LOG4, -math.log(0.1) / LOG4],
                                            rel=1e-4)


@pytest.mark.parametrize("delta, drafts, accepted", [
    (0.9, [1, 2, 2], 2),  # 0.868 < 0.9, 0.161 < 0.9, 1.661 > 0.9
    (0.8, [1, 2, 2], 0),  # the first draft already fails
    (0.6, [0, 2, 3], 3),  # the argmax each time (p 0.5, 0.8, 0.8): 0.5, 0.161, 0.161 < 0.6
    (0.4, [0, 2, 3], 0),  # 0.5 > 0.4: even the argmax fails a threshold below its own nkl
])
def test_nkl_table(delta, drafts, accepted):
    assert judge("nkl", drafts, logits(*P), delta=delta, temperature=1.0) == accepted


def test_nkl_with_the_drafters_distribution_is_zero_where_q_equals_p():
    q = torch.tensor([[P[0], P[1], P[2]]])
    nkl = normalised_kl(torch.tensor([[1, 2, 2]]), logits(*P)[:, :3], q, temperature=1.0)
    assert nkl[0].tolist() == pytest.approx([0.0, 0.0, 0.0], abs=1e-5)


def test_position_adaptive_threshold_grows_with_log2_of_the_output_position():
    """delta_pos = min(0.3, 0.15 (1 + 0.08 log2(pos + 1))): 0.15 at pos 0, 0.234 at 127, 0.27 at
    1023, capped at 0.3 by pos 2^14. A draft with nkl 0.2 (p = 4^-0.2 = 0.758) fails at 0, passes at 127."""
    p = 4 ** -0.2
    rest = (1 - p) / 3
    target = logits([rest, p, rest, rest], [0.25] * 4)
    assert judge("position-adaptive", [1], target, start_pos=0, temperature=1.0) == 0
    assert judge("position-adaptive", [1], target, start_pos=127, temperature=1.0) == 1
    p = 4 ** -0.29  # nkl 0.29: fails at pos 1023 (0.27), passes once capped at 0.3
    rest = (1 - p) / 3
    target = logits([rest, p, rest, rest], [0.25] * 4)
    assert judge("position-adaptive", [1], target, start_pos=1023, temperature=1.0) == 0
    assert judge("position-adaptive", [1], target, start_pos=1 << 14, temperature=1.0) == 1


def _matching(pattern: str) -> tuple[list[int], torch.Tensor]:
    """Drafts that equal the target's argmax where the pattern says T."""
    rows = [[0.7, 0.1, 0.1, 0.1]] * (len(pattern) + 1)
    return [0 if c == "T" else 1 for c in pattern], logits(*rows)


@pytest.mark.parametrize("pattern, m, accepted", [
    ("TFTTTF", 3, 5),  # exact prefix 1; a run of 3 ends at 5: accepted through it
    ("TFTTF", 3, 1),  # the run of 2 is short of m: the exact prefix
    ("TTTTFTTT", 3, 4),  # the longest run (4) is the prefix itself
    ("FTTTFTTT", 3, 8),  # two runs of 3: the later one
    ("FFFF", 1, 0),
    ("TFT", 1, 3),  # m = 1: any match after a miss carries the block through it
])
def test_block_table(pattern, m, accepted):
    drafts, target = _matching(pattern)
    assert judge("block", drafts, target, m=m) == accepted


def test_typical_acceptance_table():
    """epsilon 0.09, alpha 0.3, temperature 1. Uniform p: H = log 4, alpha e^-H = 0.075 < 0.09, so a
    token of p 0.25 passes. Peaked p (0.97, 0.01 x 3): H = 0.168, alpha e^-H = 0.254, the threshold is
    epsilon = 0.09: the 0.01 tokens fail, the 0.97 one passes."""
    peaked = [0.97, 0.01, 0.01, 0.01]
    assert judge("typical", [3], logits([0.25] * 4, [0.25] * 4), temperature=1.0) == 1
    assert judge("typical", [0, 3], logits(peaked, peaked, peaked), temperature=1.0) == 1
    assert judge("typical", [0, 0], logits(peaked, peaked, peaked), temperature=1.0) == 2


def test_relaxed_acceptance_table():
    """top_n 2, delta 0.1: p (0.5, 0.45, 0.05, 0) accepts token 1 (in the top 2, 0.45 >= 0.4);
    p (0.6, 0.3, 0.1, 0) does not (0.3 < 0.5); p (0.4, 0.38, 0.22, 0) refuses token 2 (not in the top 2)."""
    assert judge("relaxed", [1], logits([0.5, 0.45, 0.05, 0.0], [0.25] * 4), top_n=2, delta=0.1) == 1
    assert judge("relaxed", [1], logits([0.6, 0.3, 0.1, 0.0], [0.25] * 4), top_n=2, delta=0.1) == 0
    assert judge("relaxed", [2], logits([0.4, 0.38, 0.22, 0.0], [0.25] * 4), top_n=2, delta=0.3) == 0


def test_lossy_step_commits_the_targets_argmax_after_its_drafts_and_counts_the_drift():
    """block m = 1 over drafts 1, 2, 2 (F T F by argmax): accepted through draft 2, then the target's
    argmax at position 2 (token 3). Draft 1 differs from the argmax: one differing token, gap 0.5 - 0.3."""
    policy = AcceptancePolicy.parse("block", {"m": 1})
    result, differing, gap = verify_request(policy, torch.tensor([[1, 2, 2]]), logits(*P), 0.0, 0, 1.0,
                                            allowance=10)
    assert result.output_ids[0].tolist() == [1, 2, 3, -1] and int(result.num_accepted[0]) == 2
    assert differing == 1 and gap == pytest.approx(0.2, abs=1e-5)


def test_the_quality_budget_cuts_drafts_before_the_one_that_would_exceed_it():
    """Drafts 1, 1, 1 against argmax 0 everywhere, all passing relaxed (top 2, delta 0.5): with one
    differing token allowed, the second draft is cut and the target's argmax (0) follows the first."""
    rows = [[0.5, 0.4, 0.05, 0.05]] * 4
    policy = AcceptancePolicy.parse("relaxed", {"top_n": 2, "delta": 0.5})
    result, differing, _ = verify_request(policy, torch.tensor([[1, 1, 1]]), logits(*rows), 0.0, 0, 1.0, allowance=1)
    assert result.output_ids[0].tolist() == [1, 0, -1, -1] and differing == 1
    result, differing, _ = verify_request(policy, torch.tensor([[1, 1, 1]]), logits(*rows), 0.0, 0, 1.0, allowance=0)
    assert result.output_ids[0].tolist() == [0, -1, -1, -1] and differing == 0  # spent: exact match only


def test_drift_counts_tokens_off_the_argmax_and_the_probability_above_them():
    n, gap = drift(torch.tensor([1, 2]), logits(*P)[0, :2])
    assert n == 1 and gap == pytest.approx(0.5 - 0.3, abs=1e-5)


@pytest.mark.parametrize("name, options, message", [
    ("nkll", {}, "unknown acceptance policy 'nkll'; allowed: rejection, strict, nkl"),
    ("nkl", {"gamma": 1.0}, "acceptance.gamma: policy 'nkl' has no option 'gamma'; its options: delta, temperature, budget"),
    ("nkl", {"delta": 2.0}, "acceptance.delta: must be in [0, 1], got 2"),
    ("block", {"m": 2.5}, "acceptance.m: must be a whole number >= 1, got 2.5"),
    ("strict", {"budget": 0.1}, "policy 'strict' has no option 'budget'; its options: none"),
    ("typical", {"temperature": "hot"}, "acceptance.temperature: must be a finite number, got 'hot'"),
])
def test_bad_policy_names_and_options_name_the_option_and_what_is_allowed(name, options, message):
    with pytest.raises(InvalidRequestError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        AcceptancePolicy.parse(name, options)


def test_defaults_are_filled_in_and_lossy_ones_say_so():
    policy = AcceptancePolicy.parse("nkl", {"delta": 0.2})
    assert policy.lossy and policy.label == "nkl (lossy)" and policy.budget == DEFAULT_BUDGET
    assert dict(policy.options) == {"delta": 0.2, "temperature": 0.6, "budget": DEFAULT_BUDGET}
    assert "LOSSY" in policy.describe()
    assert not AcceptancePolicy().lossy and "lossless" in AcceptancePolicy().describe()


def test_a_sampled_request_naming_a_lossy_policy_is_refused_and_a_lossy_default_does_not_apply_to_it():
    lossy = AcceptancePolicy.parse("nkl")
    with pytest.raises(InvalidRequestError, match="acceptance: nkl is lossy and judges greedy requests only"):
        SamplingParams(temperature=0.7, acceptance="nkl").validate()
    assert SamplingParams(temperature=0.7).policy(lossy).name == "rejection"
    assert SamplingParams().policy(lossy) is lossy
    assert SamplingParams(acceptance="block", acceptance_options=(("m", 2.0),)).policy(lossy).option("m") == 2.0


def test_options_without_a_policy_name_apply_to_the_engines_default():
    """A request giving only options (e.g. a tighter delta) is valid under a lossy default that has them,
    and refused, naming the option, under the lossless default that has none."""
    params = SamplingParams(acceptance_options=(("delta", 0.05),))
    params.validate()  # the engine's default is not known here
    assert params.policy(AcceptancePolicy.parse("nkl")).option("delta") == 0.05
    with pytest.raises(InvalidRequestError, match="policy 'rejection' has no option 'delta'"):
        params.policy(AcceptancePolicy())
