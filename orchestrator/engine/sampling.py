"""Turn logits into a sampling distribution and draw from it; pure tensor functions.

The drafter and the target apply the same transform (temperature, then top-k, then top-p),
so q and p in rejection sampling are distributions over the same filtered vocabulary.
Greedy decoding (temperature 0) is not a distribution: callers use `greedy` for it.
"""

import torch

from orchestrator.config import check_sampling


def logits_to_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Float32 probabilities over the last dim after temperature, top-k and top-p filtering.

    `top_k=0` and `top_p=1.0` switch the filters off. Tokens tied with the k-th largest
    probability are all kept; top-p always keeps the most likely token. Each row is computed
    independently, so a batch gives bit-identical rows to the rows computed one at a time.
    """
    # logits: [..., vocab]
    _check_params(temperature, top_k, top_p)
    if logits.ndim < 1 or not logits.is_floating_point():
        raise ValueError(f"logits must be a float tensor [..., vocab], got {logits.dtype} "
                         f"{tuple(logits.shape)}")
    # softmax(logits / T): T < 1 sharpens, T > 1 flattens
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [..., vocab]
    if 0 < top_k < probs.shape[-1]:
        probs = _top_k(probs, top_k)
    if top_p < 1.0:
        probs = _top_p(probs, top_p)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One multinomial draw per row of the last dim; int64 ids with the leading shape."""
    # probs: [..., vocab], rows need not be normalised but must have positive mass
    if probs.ndim < 1:
        raise ValueError("probs must have a vocab dimension")
    rows = probs.reshape(-1, probs.shape[-1])  # [num_rows, vocab]
    ids = torch.multinomial(rows, num_samples=1, generator=generator)  # [num_rows, 1]
    return ids.reshape(probs.shape[:-1])  # [...]


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the last dim (temperature 0)."""
    # logits: [..., vocab] -> [...]
    return logits.argmax(dim=-1)


def _check_params(temperature: float, top_k: int, top_p: float) -> None:
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        raise ValueError("temperature 0 is greedy decoding, not a distribution: use greedy()")


def _top_k(probs: torch.Tensor, top_k: int) -> torch.Tensor:
    """Zero everything below the k-th largest probability, then renormalise."""
    # probs: [..., vocab]
    kth = probs.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
    kept = probs.masked_fill(probs < kth, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest most-likely set whose mass reaches top_p, then renormalise."""
    # probs: [..., vocab]
    sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)  # [..., vocab] x2
    # keep token i iff the tokens ranked above it hold less than top_p; i = 0 always has 0
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)
