"""greedy_verify / rejection_verify: hand-written tables, argument checks, and one statistical
test that rejection sampling reproduces the target distribution."""

import math

import pytest
import torch
import torch.nn.functional as F

from orchestrator.engine.verify import PAD_ID, greedy_verify, rejection_verify

VOCAB = 8
_ = PAD_ID  # shorthand for padding in the tables below


def _target_logits(target_ids: list[list[int]]) -> torch.Tensor:
    """Logits whose argmax at [i, j] is target_ids[i][j]."""
    return F.one_hot(torch.tensor(target_ids), VOCAB).float() * 5  # [num_seqs, k + 1, vocab]


def _one_hot_probs(ids: list[list[int]]) -> torch.Tensor:
    return F.one_hot(torch.tensor(ids), VOCAB).float()  # [num_seqs, num_pos, vocab]


# ---------------------------------------------------------------------------- greedy tables

GREEDY_CASES = {
    # name: (draft_ids, num_draft, target argmax ids, expected output_ids, expected num_accepted)
    "perfect_match": ([[1, 2, 3]], [3], [[1, 2, 3, 4]], [[1, 2, 3, 4]], [3]),
    "early_mismatch": ([[1, 2, 3]], [3], [[5, 2, 3, 4]], [[5, _, _, _]], [0]),
    "middle_mismatch": ([[1, 2, 3]], [3], [[1, 5, 3, 4]], [[1, 5, _, _]], [1]),
    "last_mismatch": ([[1, 2, 3]], [3], [[1, 2, 6, 4]], [[1, 2, 6, _]], [2]),
    "no_drafts_gives_next_token": ([[_, _, _]], [0], [[4, 1, 1, 1]], [[4, _, _, _]], [0]),
    # padding that happens to equal the target is still not a draft; bonus at num_draft
    "short_draft_bonus_at_num_draft": ([[1, 2, 6]], [2], [[1, 2, 6, 7]], [[1, 2, 6, _]], [2]),
    "match_after_mismatch_ignored": ([[1, 2, 3]], [3], [[0, 2, 3, 4]], [[0, _, _, _]], [0]),
    "k1_accept": ([[1]], [1], [[1, 2]], [[1, 2]], [1]),
    "k1_reject": ([[1]], [1], [[3, 2]], [[3, _]], [0]),
    "k1_no_draft": ([[7]], [0], [[3, 2]], [[3, _]], [0]),
    "mixed_batch": (
        [[1, 2, 3], [1, 2, _], [5, _, _], [_, _, _], [4, 4, 4]],
        [3, 2, 1, 0, 3],
        [[1, 2, 3, 0], [1, 2, 7, 7], [5, 6, 6, 6], [2, 2, 2, 2], [4, 1, 4, 4]],
        [[1, 2, 3, 0], [1, 2, 7, _], [5, 6, _, _], [2, _, _, _], [4, 1, _, _]],
        [3, 2, 1, 0, 1],
    ),
}


@pytest.mark.parametrize("case", GREEDY_CASES.values(), ids=GREEDY_CASES.keys())
def test_greedy_verify_table(case):
    draft_ids, num_draft, target_ids, output_ids, num_accepted = case
    result = greedy_verify(
        torch.tensor(draft_ids), torch.tensor(num_draft), _target_logits(target_ids)
    )
    assert result.output_ids.tolist() == output_ids
    assert result.num_accepted.tolist() == num_accepted
    assert result.output_ids.dtype == result.num_accepted.dtype == torch.int64


def test_greedy_verify_k0_is_plain_greedy():
    result = greedy_verify(
        torch.zeros(2, 0, dtype=torch.int64), torch.zeros(2, dtype=torch.int64),
        _target_logits([[3], [5]]),
    )
    assert result.output_ids.tolist() == [[3], [5]]
    assert result.num_accepted.tolist() == [0, 0]


def test_greedy_verify_is_lossless_against_a_reference_loop():
    g = torch.Generator().manual_seed(0)
    num_seqs, k, vocab = 300, 4, 3  # small vocab so drafts often match
    target_logits = torch.randn(num_seqs, k + 1, vocab, generator=g)
    draft_ids = torch.randint(vocab, (num_seqs, k), generator=g)
    num_draft = torch.randint(k + 1, (num_seqs,), generator=g)
    result = greedy_verify(draft_ids, num_draft, target_logits)
    target_ids = target_logits.argmax(-1).tolist()
    for i in range(num_seqs):
        n = 0
        while n < num_draft[i] and draft_ids[i, n] == target_ids[i][n]:
            n += 1
        # target-only greedy would emit exactly target_ids[i][: n + 1] given the same context
        assert result.num_accepted[i] == n
        assert result.output_ids[i].tolist() == target_ids[i][: n + 1] + [PAD_ID] * (k - n)


# ------------------------------------------------------------------------- argument checks

def _args(num_seqs=2, k=3, vocab=VOCAB):
    return dict(
        draft_ids=torch.zeros(num_seqs, k, dtype=torch.int64),
        num_draft=torch.full((num_seqs,), k, dtype=torch.int64),
        draft_probs=torch.full((num_seqs, k, vocab), 1.0 / vocab),
        target_probs=torch.full((num_seqs, k + 1, vocab), 1.0 / vocab),
    )


BAD_ARGS = {
    "draft_ids_1d": {"draft_ids": torch.zeros(3, dtype=torch.int64)},
    "draft_ids_int32": {"draft_ids": torch.zeros(2, 3, dtype=torch.int32)},
    "num_draft_2d": {"num_draft": torch.zeros(2, 1, dtype=torch.int64)},
    "num_draft_rows": {"num_draft": torch.zeros(3, dtype=torch.int64)},
    "num_draft_above_k": {"num_draft": torch.tensor([3, 4])},
    "num_draft_negative": {"num_draft": torch.tensor([-1, 0])},
    "draft_id_out_of_vocab": {"draft_ids": torch.tensor([[0, 0, VOCAB], [0, 0, 0]])},
    "draft_id_negative": {"draft_ids": torch.tensor([[0, -1, 0], [0, 0, 0]])},
    "target_k_positions": {"target_probs": torch.full((2, 3, VOCAB), 0.125)},
    "target_2d": {"target_probs": torch.full((2, 4), 0.25)},
    "target_int": {"target_probs": torch.zeros(2, 4, VOCAB, dtype=torch.int64)},
    "target_rows": {"target_probs": torch.full((3, 4, VOCAB), 0.125)},
    "draft_probs_vocab": {"draft_probs": torch.full((2, 3, VOCAB + 1), 0.1)},
    "draft_probs_positions": {"draft_probs": torch.full((2, 4, VOCAB), 0.125)},
}


@pytest.mark.parametrize("bad", BAD_ARGS.values(), ids=BAD_ARGS.keys())
def test_rejection_verify_rejects_bad_args(bad):
    with pytest.raises(ValueError):
        rejection_verify(**{**_args(), **bad})


@pytest.mark.parametrize(
    "bad", [v for n, v in BAD_ARGS.items() if "draft_probs" not in n],
    ids=[n for n in BAD_ARGS if "draft_probs" not in n],
)
def test_greedy_verify_rejects_bad_args(bad):
    args = {**_args(), **bad}
    with pytest.raises(ValueError):
        greedy_verify(args["draft_ids"], args["num_draft"], args["target_probs"])


def test_padding_past_num_draft_may_be_anything():
    args = _args()
    args["draft_ids"] = torch.tensor([[1, -1, -1], [1, 2, 10**6]])
    args["num_draft"] = torch.tensor([1, 2])
    rejection_verify(**args, generator=torch.Generator().manual_seed(0))
    greedy_verify(args["draft_ids"], args["num_draft"], args["target_probs"])


# -------------------------------------------------------------- deterministic rejection cases

REPEATS = 500  # each deterministic row repeated, so every random draw has to agree


@pytest.mark.parametrize("greedy_drafter", [False, True], ids=["q", "one_hot_q"])
def test_rejection_accepts_everything_when_p_equals_one_hot_q(greedy_drafter):
    draft = [[3, 1, 4], [3, 1, 4], [2, _, _]]
    num_draft = [3, 2, 1]
    target = [[3, 1, 4, 5], [3, 1, 6, 6], [2, 7, 0, 0]]  # p one-hot; bonus at num_draft
    draft_probs = _one_hot_probs([[3, 1, 4], [3, 1, 4], [2, 0, 0]])
    result = rejection_verify(
        torch.tensor(draft * REPEATS), torch.tensor(num_draft * REPEATS),
        None if greedy_drafter else draft_probs.repeat(REPEATS, 1, 1),
        _one_hot_probs(target * REPEATS), torch.Generator().manual_seed(0),
    )
    assert result.num_accepted.tolist() == num_draft * REPEATS
    assert result.output_ids.tolist() == [[3, 1, 4, 5], [3, 1, 6, _], [2, 7, _, _]] * REPEATS


@pytest.mark.parametrize("greedy_drafter", [False, True], ids=["q", "one_hot_q"])
@pytest.mark.parametrize("reject_at", [0, 1, 2])
def test_rejection_never_accepts_a_token_p_rules_out(greedy_drafter, reject_at):
    g = torch.Generator().manual_seed(reject_at)
    num_seqs, k, draft_token = REPEATS, 3, 2
    draft_ids = torch.full((num_seqs, k), draft_token)
    num_draft = torch.full((num_seqs,), k)
    draft_probs = torch.softmax(torch.randn(num_seqs, k, VOCAB, generator=g), dim=-1)
    target_probs = torch.softmax(torch.randn(num_seqs, k + 1, VOCAB, generator=g), dim=-1)
    target_probs[:, :reject_at] = _one_hot_probs([[draft_token]])  # accepted surely before
    target_probs[:, reject_at, draft_token] = 0.0  # p(x) = 0 at reject_at
    target_probs /= target_probs.sum(-1, keepdim=True)
    result = rejection_verify(
        draft_ids, num_draft, None if greedy_drafter else draft_probs, target_probs, g
    )
    assert (result.num_accepted == reject_at).all()
    recovered = result.output_ids[:, reject_at]
    assert (recovered >= 0).all() and (recovered != draft_token).all()
    assert (result.output_ids[:, reject_at + 1 :] == PAD_ID).all()


def test_rejection_with_no_drafts_samples_bonus_from_p_at_0():
    result = rejection_verify(
        torch.full((REPEATS, 2), _), torch.zeros(REPEATS, dtype=torch.int64), None,
        _one_hot_probs([[6, 1, 1]] * REPEATS), torch.Generator().manual_seed(0),
    )
    assert result.output_ids.tolist() == [[6, _, _]] * REPEATS


def test_rejection_falls_back_to_p_when_the_residual_is_empty():
    # q over-covers p (unnormalised, as round-off can make it): p - q <= 0 everywhere
    p = torch.tensor([0.0, 0.5, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    q = 2 * p
    result = rejection_verify(
        torch.ones(REPEATS, 1, dtype=torch.int64), torch.ones(REPEATS, dtype=torch.int64),
        q.expand(REPEATS, 1, VOCAB), torch.stack([p, p]).expand(REPEATS, 2, VOCAB),
        torch.Generator().manual_seed(0),
    )
    rejected = result.num_accepted == 0
    assert 0 < rejected.sum() < REPEATS  # accepted with probability p/q = 1/2
    assert set(result.output_ids[rejected, 0].tolist()) <= {1, 2}


def test_rejection_is_reproducible_with_a_seeded_generator():
    args = _args(num_seqs=64)
    args["draft_ids"] = torch.randint(VOCAB, (64, 3), generator=torch.Generator().manual_seed(1))
    a = rejection_verify(**args, generator=torch.Generator().manual_seed(5))
    b = rejection_verify(**args, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.output_ids, b.output_ids)


# -------------------------------------------------------------------------- statistical test

def _chi2_threshold(dof: int, alpha: float) -> float:
    """Laurent & Massart (2000): P(X >= d + 2 sqrt(d x) + 2 x) <= exp(-x) for X ~ chi2(d)."""
    x = math.log(1 / alpha)
    return dof + 2 * math.sqrt(dof * x) + 2 * x


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic of counts against probs, and its degrees of freedom. Tokens expected
    fewer than 5 times are pooled into one bin, as the chi-square approximation needs."""
    assert counts[probs == 0].sum() == 0, "sampled a token the target rules out"
    expected = counts.sum() * probs.double()
    big, small = expected >= 5, (expected > 0) & (expected < 5)
    observed = torch.cat([counts[big], counts[small].sum().view(1)])
    expected = torch.cat([expected[big], expected[small].sum().view(1)])
    if expected[-1] < 5:  # the pooled bin is still too small: fold it into the largest
        observed = observed[:-1].index_add(0, expected[:-1].argmax().view(1), observed[-1:])
        expected = expected[:-1].index_add(0, expected[:-1].argmax().view(1), expected[-1:])
    assert len(expected) >= 2, "too few samples for a chi-square test"
    stat = ((observed - expected) ** 2 / expected).sum()
    return stat.item(), len(expected) - 1


@pytest.mark.parametrize("greedy_drafter", [False, True], ids=["q", "one_hot_q"])
def test_rejection_sampling_reproduces_the_target_distribution(greedy_drafter):
    """Drafts sampled from q, context-free p_j and q_j, random num_draft per row. Speculative
    sampling makes committed token j (given it exists, i.e. num_accepted >= j) ~ p_j, whether it
    is an accepted draft, a recovered token or the bonus token."""
    g = torch.Generator().manual_seed(1234)
    num_seqs, k, vocab = 100_000, 3, 6
    p = torch.softmax(torch.randn(k + 1, vocab, generator=g), dim=-1)  # [k + 1, vocab]
    q = torch.softmax(torch.randn(k, vocab, generator=g) * 1.5, dim=-1)  # [k, vocab]
    p[0, 0] = 0.0  # the drafter proposes tokens the target rules out...
    q[0, 1] = 0.0  # ...and never proposes some the target wants
    p /= p.sum(-1, keepdim=True)
    q /= q.sum(-1, keepdim=True)

    draft_ids = torch.multinomial(q, num_seqs, replacement=True, generator=g).T  # [num_seqs, k]
    num_draft = torch.randint(k + 1, (num_seqs,), generator=g)
    draft_probs = None if greedy_drafter else q.expand(num_seqs, k, vocab)
    result = rejection_verify(
        draft_ids, num_draft, draft_probs, p.expand(num_seqs, k + 1, vocab), g
    )

    out, n = result.output_ids, result.num_accepted
    assert (n <= num_draft).all()
    for j in range(k + 1):
        exists = n >= j
        assert (out[~exists, j] == PAD_ID).all()
        counts = torch.bincount(out[exists, j], minlength=vocab).double()
        stat, dof = _chi2(counts, p[j])
        print(f"position {j}: {int(counts.sum())} samples, chi2 {stat:.1f} on {dof} dof")
        assert stat < _chi2_threshold(dof, alpha=1e-6), f"position {j}: chi2 {stat:.1f}"
