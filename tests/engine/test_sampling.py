"""logits_to_probs / sample / greedy: filters, determinism, argument checks."""

import math

import pytest
import torch

from orchestrator.engine.sampling import greedy, logits_to_probs, sample


def _logits(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 3


def test_top_k_1_is_one_hot_argmax():
    logits = _logits(4, 32)  # [num_rows, vocab]
    probs = logits_to_probs(logits, temperature=0.7, top_k=1)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 32).float())


def test_top_k_keeps_k_tokens_renormalised():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    probs = logits_to_probs(logits, temperature=1.0, top_k=2)
    expected = torch.zeros(4)
    expected[[1, 3]] = torch.softmax(torch.tensor([3.0, 2.0]), dim=-1)
    torch.testing.assert_close(probs, expected)


def test_top_k_at_least_vocab_is_off():
    logits = _logits(3, 10)
    assert torch.equal(logits_to_probs(logits, 1.3, top_k=10), logits_to_probs(logits, 1.3))
    assert torch.equal(logits_to_probs(logits, 1.3, top_k=99), logits_to_probs(logits, 1.3))


def test_tiny_top_p_keeps_exactly_the_argmax():
    logits = _logits(5, 40)
    probs = logits_to_probs(logits, temperature=2.0, top_p=1e-9)
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), 40).float())


@pytest.mark.parametrize(
    "top_p, expected",
    [
        (0.6, [0.5 / 0.8, 0.3 / 0.8, 0.0]),  # 0.5 alone is short of 0.6, 0.5 + 0.3 reaches it
        (0.9, [0.5, 0.3, 0.2]),  # needs all three
        (0.4, [1.0, 0.0, 0.0]),  # the top token alone reaches it
    ],
)
def test_top_p_keeps_smallest_set_reaching_mass(top_p, expected):
    logits = torch.tensor([0.5, 0.3, 0.2]).log()
    probs = logits_to_probs(logits, temperature=1.0, top_p=top_p)
    torch.testing.assert_close(probs, torch.tensor(expected))


def test_top_p_applies_after_top_k():
    # top_k=2 leaves [0.5, 0.5, 0, 0]; top_p=0.45 then keeps the first (stable order) alone,
    # where on the unfiltered [0.3, 0.3, 0.2, 0.2] it would keep two
    logits = torch.tensor([0.3, 0.3, 0.2, 0.2]).log()
    probs = logits_to_probs(logits, temperature=1.0, top_k=2, top_p=0.45)
    assert torch.equal(probs, torch.tensor([1.0, 0.0, 0.0, 0.0]))
    unfiltered = logits_to_probs(logits, temperature=1.0, top_p=0.45)
    torch.testing.assert_close(unfiltered, torch.tensor([0.5, 0.5, 0.0, 0.0]))


@pytest.mark.parametrize("temperature", [0.25, 1.0, 3.0])
def test_temperature_divides_logits(temperature):
    logits = _logits(3, 16)
    probs = logits_to_probs(logits, temperature)
    torch.testing.assert_close(probs, torch.softmax(logits / temperature, dim=-1))


def test_lower_temperature_sharpens():
    logits = _logits(16)
    cold, hot = logits_to_probs(logits, 0.5), logits_to_probs(logits, 2.0)
    assert cold.max() > hot.max()
    assert cold.argmax() == hot.argmax()


def test_output_is_float32_and_normalised():
    logits = _logits(2, 3, 50).to(torch.bfloat16)  # [num_seqs, k + 1, vocab]
    probs = logits_to_probs(logits, 0.8, top_k=20, top_p=0.9)
    assert probs.dtype == torch.float32
    assert probs.shape == (2, 3, 50)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 3))


@pytest.mark.parametrize(
    "temperature, top_k, top_p", [(1.0, 0, 1.0), (0.6, 5, 1.0), (1.4, 0, 0.8), (0.9, 7, 0.7)]
)
def test_batch_matches_rows_bit_for_bit(temperature, top_k, top_p):
    logits = _logits(3, 4, 64)  # [num_seqs, k + 1, vocab]
    batch = logits_to_probs(logits, temperature, top_k, top_p)
    for i in range(3):
        for j in range(4):
            row = logits_to_probs(logits[i, j], temperature, top_k, top_p)
            assert torch.equal(batch[i, j], row)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"temperature": -1.0},
        {"temperature": math.nan},
        {"temperature": math.inf},
        {"temperature": 1.0, "top_k": -1},
        {"temperature": 1.0, "top_p": 0.0},
        {"temperature": 1.0, "top_p": 1.5},
    ],
)
def test_bad_params_raise(kwargs):
    with pytest.raises(ValueError):
        logits_to_probs(_logits(8), **kwargs)


def test_sample_keeps_leading_shape_and_follows_one_hot():
    ids = torch.tensor([[3, 0], [1, 2]])  # [2, 2]
    probs = torch.nn.functional.one_hot(ids, 5).float()  # [2, 2, vocab]
    out = sample(probs, torch.Generator().manual_seed(0))
    assert out.dtype == torch.int64
    assert torch.equal(out, ids)


def test_sample_is_reproducible_with_a_seeded_generator():
    probs = logits_to_probs(_logits(64, 10), 1.0)
    a = sample(probs, torch.Generator().manual_seed(7))
    b = sample(probs, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_greedy_is_argmax():
    logits = _logits(2, 3, 11)
    assert torch.equal(greedy(logits), logits.argmax(-1))
    assert greedy(torch.tensor([0.0, 5.0, 1.0])).item() == 1
