"""Verify draft tokens against one target forward over k + 1 positions; pure tensor functions.

Vocabulary (as in vLLM's rejection_sampler.py):
    draft tokens      proposed by the drafter, up to k per sequence (`num_draft` of them)
    target tokens     what the target model emits at each of the k + 1 positions
    accepted tokens   the longest prefix of draft tokens that passes verification
    recovered tokens  sampled by the target at the first rejected position
    bonus tokens      sampled by the target at position num_draft when every draft is accepted

A sequence commits its accepted tokens followed by exactly one recovered or bonus token, so
every step makes progress even when every draft is rejected.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from orchestrator.engine.sampling import sample

PAD_ID = -1  # fills output_ids after the committed tokens


@dataclass
class VerifyResult:
    """Tokens to commit: row i commits output_ids[i, : num_accepted[i] + 1]."""

    output_ids: torch.Tensor  # [num_seqs, k + 1] int64: accepted drafts, recovered/bonus, -1s
    num_accepted: torch.Tensor  # [num_seqs] int64, 0..num_draft


def greedy_verify(
    draft_ids: torch.Tensor,  # [num_seqs, k] int64, padding past num_draft is ignored
    num_draft: torch.Tensor,  # [num_seqs] int64, 0..k
    target_logits: torch.Tensor,  # [num_seqs, k + 1, vocab]
) -> VerifyResult:
    """Accept drafts while they equal the target argmax; lossless w.r.t. target-only greedy. The argmax
    is taken where the logits are (a GPU's) and only the ids come to the drafts' device."""
    k = _check_drafts(draft_ids, num_draft)
    _check_scores("target_logits", target_logits, draft_ids.shape[0], k + 1)
    _check_draft_values(draft_ids, num_draft, target_logits.shape[-1])
    return match_verify(draft_ids, num_draft, target_logits.argmax(dim=-1).to(draft_ids.device))


def match_verify(
    draft_ids: torch.Tensor,  # [num_seqs, k] int64
    num_draft: torch.Tensor,  # [num_seqs] int64
    target_ids: torch.Tensor,  # [num_seqs, k + 1] the target's own token at each position
) -> VerifyResult:
    """Accept drafts while they equal the target's own tokens (its argmax, or its samples: `strict`)."""
    k = draft_ids.shape[1]
    num_accepted = _accepted_prefix(draft_ids == target_ids[:, :k], num_draft)  # [num_seqs]
    return accept_prefix(draft_ids, num_accepted, target_ids)


def accept_prefix(
    draft_ids: torch.Tensor,  # [num_seqs, k]
    num_accepted: torch.Tensor,  # [num_seqs] drafts kept (by whatever policy)
    target_ids: torch.Tensor,  # [num_seqs, k + 1]
) -> VerifyResult:
    """Commit each row's first num_accepted drafts, then the target's own token at the first unaccepted
    position: recovered, or bonus at num_draft."""
    next_ids = target_ids.gather(1, num_accepted[:, None]).squeeze(1)  # [num_seqs]
    return _commit(draft_ids, num_accepted, next_ids)


def rejection_verify(
    draft_ids: torch.Tensor,  # [num_seqs, k] int64, padding past num_draft is ignored
    num_draft: torch.Tensor,  # [num_seqs] int64, 0..k
    draft_probs: torch.Tensor | None,  # [num_seqs, k, vocab] q, or None: one-hot (greedy drafter)
    target_probs: torch.Tensor,  # [num_seqs, k + 1, vocab] p, after logits_to_probs
    generator: torch.Generator | None = None,
) -> VerifyResult:
    """Speculative sampling (Leviathan et al. 2023, Chen et al. 2023): commits are distributed
    exactly as if sampled from the target alone."""
    k = _check_drafts(draft_ids, num_draft)
    num_seqs = draft_ids.shape[0]
    _check_scores("target_probs", target_probs, num_seqs, k + 1)
    vocab = target_probs.shape[-1]
    if draft_probs is not None:
        _check_scores("draft_probs", draft_probs, num_seqs, k, vocab)
    _check_draft_values(draft_ids, num_draft, vocab)

    target_probs = target_probs.float()
    safe_ids = torch.where(_real(num_draft, k), draft_ids, 0)  # [num_seqs, k], pads gatherable
    p_draft = target_probs[:, :k].gather(2, safe_ids[..., None]).squeeze(2)  # [num_seqs, k]
    if draft_probs is None:
        q_draft = torch.ones_like(p_draft)  # a greedy drafter puts all its mass on its draft
    else:
        q_draft = draft_probs.float().gather(2, safe_ids[..., None]).squeeze(2)  # [num_seqs, k]

    u = torch.rand(p_draft.shape, generator=generator, device=p_draft.device)  # [num_seqs, k]
    # accept x_j with probability min(1, p(x_j) / q(x_j)); u * q < p is the same test, no 0/0
    accepted = u * q_draft < p_draft  # [num_seqs, k]
    num_accepted = _accepted_prefix(accepted, num_draft)  # [num_seqs]

    next_probs = _next_token_probs(safe_ids, num_draft, num_accepted, draft_probs, target_probs)
    next_ids = sample(next_probs, generator)  # [num_seqs]
    return _commit(draft_ids, num_accepted, next_ids)


def _next_token_probs(
    safe_ids: torch.Tensor,  # [num_seqs, k]
    num_draft: torch.Tensor,  # [num_seqs]
    num_accepted: torch.Tensor,  # [num_seqs]
    draft_probs: torch.Tensor | None,  # [num_seqs, k, vocab] or None
    target_probs: torch.Tensor,  # [num_seqs, k + 1, vocab] float32
) -> torch.Tensor:
    """Where the recovered or bonus token comes from: norm(max(0, p - q)) after a rejection,
    p itself at position num_draft."""
    num_seqs, k = safe_ids.shape
    rows = torch.arange(num_seqs, device=safe_ids.device)
    p = target_probs[rows, num_accepted]  # [num_seqs, vocab]
    if k == 0:
        return p
    rejected = num_accepted < num_draft  # [num_seqs]; the others take the bonus
    pos = num_accepted.clamp(max=k - 1)  # bonus rows may point past the drafts; masked below
    if draft_probs is None:
        q = F.one_hot(safe_ids[rows, pos], p.shape[-1]).float()  # [num_seqs, vocab]
    else:
        q = draft_probs[rows, pos].float()  # [num_seqs, vocab]
    # residual max(0, p - q); with q = 0 on bonus rows it is p itself
    residual = (p - q * rejected[:, None]).clamp(min=0.0)  # [num_seqs, vocab]
    mass = residual.sum(dim=-1, keepdim=True)  # [num_seqs, 1]
    # p <= q everywhere (only through round-off or an unnormalised q): fall back to p
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)


def _real(num_draft: torch.Tensor, k: int) -> torch.Tensor:
    """Mask of real (non-padding) draft positions."""
    return torch.arange(k, device=num_draft.device) < num_draft[:, None]  # [num_seqs, k]


def _accepted_prefix(accepted: torch.Tensor, num_draft: torch.Tensor) -> torch.Tensor:
    """Length of each row's leading run of accepted drafts among its num_draft real ones."""
    # accepted: [num_seqs, k] bool
    passed = accepted & _real(num_draft, accepted.shape[1])
    # the product stays 1 until the first failure, so its sum is the run length
    return passed.long().cumprod(dim=1).sum(dim=1)  # [num_seqs]


def _commit(
    draft_ids: torch.Tensor,  # [num_seqs, k]
    num_accepted: torch.Tensor,  # [num_seqs]
    next_ids: torch.Tensor,  # [num_seqs] recovered or bonus token
) -> VerifyResult:
    """Lay out accepted drafts, then next_ids at position num_accepted, then PAD_ID."""
    k = draft_ids.shape[1]
    pos = torch.arange(k + 1, device=draft_ids.device)  # [k + 1]
    padded = F.pad(draft_ids, (0, 1), value=PAD_ID)  # [num_seqs, k + 1]
    output_ids = torch.where(pos < num_accepted[:, None], padded, PAD_ID)
    output_ids.scatter_(1, num_accepted[:, None], next_ids[:, None].to(output_ids.dtype))
    return VerifyResult(output_ids=output_ids, num_accepted=num_accepted)


def _check_drafts(draft_ids: torch.Tensor, num_draft: torch.Tensor) -> int:
    """Check the draft batch's ranks and dtypes; return k."""
    if draft_ids.ndim != 2 or draft_ids.dtype != torch.int64:
        raise ValueError(f"draft_ids must be int64 [num_seqs, k], got {draft_ids.dtype} "
                         f"{tuple(draft_ids.shape)}")
    if num_draft.ndim != 1 or num_draft.dtype != torch.int64:
        raise ValueError(f"num_draft must be int64 [num_seqs], got {num_draft.dtype} "
                         f"{tuple(num_draft.shape)}")
    if num_draft.shape[0] != draft_ids.shape[0]:
        raise ValueError(f"num_draft has {num_draft.shape[0]} rows, draft_ids has "
                         f"{draft_ids.shape[0]}")
    return draft_ids.shape[1]


def _check_scores(
    name: str, scores: torch.Tensor, num_seqs: int, num_pos: int, vocab: int | None = None
) -> None:
    """Check a [num_seqs, num_pos, vocab] float tensor of logits or probabilities."""
    want = f"[{num_seqs}, {num_pos}, {'vocab' if vocab is None else vocab}]"
    if scores.ndim != 3 or not scores.is_floating_point():
        raise ValueError(f"{name} must be a float tensor {want}, got {scores.dtype} "
                         f"{tuple(scores.shape)}")
    if scores.shape[:2] != (num_seqs, num_pos) or (vocab is not None and scores.shape[2] != vocab):
        raise ValueError(f"{name} must have shape {want}, got {tuple(scores.shape)}")
    if scores.shape[2] == 0:
        raise ValueError(f"{name} has an empty vocab dimension")


def _check_draft_values(draft_ids: torch.Tensor, num_draft: torch.Tensor, vocab: int) -> None:
    """num_draft in 0..k and real draft ids in the vocab (reads two scalars back)."""
    k = draft_ids.shape[1]
    if num_draft.numel() and (num_draft.min() < 0 or num_draft.max() > k):
        raise ValueError(f"num_draft must lie in 0..{k}, got min {int(num_draft.min())} "
                         f"max {int(num_draft.max())}")
    real_ids = draft_ids[_real(num_draft, k)]
    if real_ids.numel() and (real_ids.min() < 0 or real_ids.max() >= vocab):
        raise ValueError(f"draft ids must lie in 0..{vocab - 1}, got min {int(real_ids.min())} "
                         f"max {int(real_ids.max())}")
