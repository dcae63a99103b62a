"""The acceptance policies' judgements: pure tensor functions beside `verify.greedy_verify` and
`verify.rejection_verify`. What each policy means, its options and their checks:
`orchestrator.acceptance_policy`."""

import math

import torch
import torch.nn.functional as F

from orchestrator.acceptance_policy import AcceptancePolicy
from orchestrator.engine.sampling import logits_to_probs
from orchestrator.engine.verify import VerifyResult, accept_prefix, greedy_verify, match_verify, rejection_verify

# ---- the judgements: [num_seqs, k] drafts against [num_seqs, k + 1, vocab] target logits ---------------


def lossy_accepted(
    policy: AcceptancePolicy,
    draft_ids: torch.Tensor,  # [num_seqs, k] int64
    num_draft: torch.Tensor,  # [num_seqs] int64
    target_logits: torch.Tensor,  # [num_seqs, k + 1, vocab]
    draft_probs: torch.Tensor | None = None,  # [num_seqs, k, vocab] q, or None: one-hot (greedy drafter)
    start_pos: torch.Tensor | None = None,  # [num_seqs] output index of each row's first draft
) -> torch.Tensor:
    """How many leading drafts of each row a lossy policy keeps -> [num_seqs] int64."""
    k = draft_ids.shape[1]
    real = torch.arange(k, device=draft_ids.device) < num_draft[:, None]  # [num_seqs, k]
    safe = torch.where(real, draft_ids, 0)
    logits = target_logits[:, :k].float()  # [num_seqs, k, vocab]
    o = dict(policy.options)
    if policy.name == "block":
        return _block(safe == logits.argmax(-1), real, int(o["m"]))
    if policy.name in ("nkl", "position-adaptive"):
        nkl = normalised_kl(safe, logits, draft_probs, o["temperature"])  # [num_seqs, k]
        delta = torch.full_like(nkl, o["delta"])
        if policy.name == "position-adaptive":
            pos = torch.arange(k, device=nkl.device)[None] + (0 if start_pos is None else start_pos[:, None])
            delta = (o["delta"] * (1 + o["a"] * torch.log2(pos.float() + 1))).clamp(max=o["delta_max"])
        ok = nkl < delta
    elif policy.name == "typical":
        p = F.softmax(logits / o["temperature"], dim=-1)
        entropy = -(p * torch.log(p.clamp(min=1e-30))).sum(-1)  # [num_seqs, k]
        ok = p.gather(2, safe[..., None]).squeeze(2) > torch.clamp(o["alpha"] * torch.exp(-entropy), max=o["epsilon"])
    elif policy.name == "relaxed":
        p = F.softmax(logits, dim=-1)
        top = p.topk(int(o["top_n"]), dim=-1)  # values/indices [num_seqs, k, top_n]
        in_top = (top.indices == safe[..., None]).any(-1)
        ok = in_top & (p.gather(2, safe[..., None]).squeeze(2) >= top.values[..., 0] - o["delta"])
    else:
        raise ValueError(f"{policy.name!r} is not a lossy policy")
    return (ok & real).long().cumprod(dim=1).sum(dim=1)


def normalised_kl(
    draft_ids: torch.Tensor,  # [num_seqs, k]
    target_logits: torch.Tensor,  # [num_seqs, k, vocab]
    draft_probs: torch.Tensor | None,  # [num_seqs, k, vocab] or None (one-hot at draft_ids)
    temperature: float,
) -> torch.Tensor:
    """KL(q || p) / log(vocab) per position, p at `temperature`; a q given as probabilities is brought
    to the same temperature (q^(1/T), renormalised)."""
    vocab = target_logits.shape[-1]
    log_p = F.log_softmax(target_logits / temperature, dim=-1)  # [num_seqs, k, vocab]
    if draft_probs is None:  # one-hot q: KL = -log p(draft)
        kl = -log_p.gather(2, draft_ids[..., None]).squeeze(2)
    else:
        q = draft_probs.float()
        if q.shape[-1] < vocab:
            q = F.pad(q, (0, vocab - q.shape[-1]))
        log_q = F.log_softmax(torch.log(q.clamp(min=1e-30)) / temperature, dim=-1)
        kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    return kl / math.log(vocab)


def _block(match: torch.Tensor, real: torch.Tensor, m: int) -> torch.Tensor:
    """Exact prefix, or through the end of the longest run (the later of equals) of >= m matches."""
    match = match & real  # [num_seqs, k]
    exact = match.long().cumprod(dim=1).sum(dim=1)
    out = exact.clone()
    for row in range(match.shape[0]):  # k is small: runs by a scan per row
        run, best, end = 0, 0, 0
        for j, ok in enumerate(match[row].tolist()):
            run = run + 1 if ok else 0
            if run >= best:
                best, end = run, j + 1
        if best >= m and end > int(exact[row]):
            out[row] = end
    return out


def strict_sample_targets(target_probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """`strict` above temperature 0: the target's own token at each position, sampled from p."""
    # target_probs: [num_seqs, k + 1, vocab] -> [num_seqs, k + 1]
    rows = target_probs.reshape(-1, target_probs.shape[-1])
    return torch.multinomial(rows, 1, generator=generator).reshape(target_probs.shape[:-1])


def drift(committed: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, float]:
    """For committed tokens at their positions: (how many the target would not have chosen, the sum of
    p(argmax) - p(token), the probability the target put above them); p at temperature 1."""
    # committed: [n] int64, target_logits: [n, vocab]
    p = F.softmax(target_logits.float(), dim=-1)
    chosen = p.gather(1, committed[:, None]).squeeze(1)
    top = p.max(dim=-1)
    return int((committed != top.indices).sum()), float((top.values - chosen).sum())


def verify_request(
    policy: AcceptancePolicy,
    draft_ids: torch.Tensor,  # [1, k] int64
    target_logits: torch.Tensor,  # [1, k + 1, vocab]
    temperature: float, top_k: int, top_p: float,
    draft_probs: torch.Tensor | None = None,  # [1, k, vocab] q, or None (greedy drafter)
    generator: torch.Generator | None = None,
    output_pos: int = 0,  # the first draft's index in the request's output
    allowance: int = 0,  # tokens the target would not choose that the quality budget still allows
) -> tuple[VerifyResult, int, float]:
    """One request's verify step under its policy -> (result, committed tokens the target would not
    have chosen, their summed probability gap). A lossy policy never commits more such tokens than
    `allowance`: the drafts are cut before the one that would exceed it."""
    n = draft_ids.shape[1]
    num_draft = torch.tensor([n], dtype=torch.long)
    if temperature == 0.0 and (not policy.lossy or allowance <= 0 or n == 0):
        return greedy_verify(draft_ids, num_draft, target_logits), 0, 0.0
    if target_logits.device != draft_ids.device:  # a device target: judge on the host (the request's
        target_logits = target_logits.float().to(draft_ids.device)  # generator and q live there)
    if policy.lossy:
        target_ids = target_logits.argmax(dim=-1)  # [1, k + 1]
        num_accepted = lossy_accepted(policy, draft_ids, num_draft, target_logits, draft_probs,
                                      torch.tensor([output_pos]))
        differs = (draft_ids != target_ids[:, :n]) & (torch.arange(n) < num_accepted[:, None])
        over = differs.long().cumsum(dim=1) > allowance  # [1, k]: past the budget from here on
        if bool(over.any()):
            num_accepted = torch.minimum(num_accepted, over.long().argmax(dim=1))
        result = accept_prefix(draft_ids, num_accepted, target_ids)
        kept = int(num_accepted[0])
        differing, gap = drift(draft_ids[0, :kept], target_logits[0, :kept])
        return result, differing, gap
    probs = logits_to_probs(target_logits, temperature, top_k, top_p)  # [1, k + 1, vocab]
    if policy.name == "strict":
        return match_verify(draft_ids, num_draft, strict_sample_targets(probs, generator)), 0, 0.0
    q = draft_probs
    if q is not None and q.shape[-1] < probs.shape[-1]:  # a drafter with a padded-off vocabulary
        q = F.pad(q, (0, probs.shape[-1] - q.shape[-1]))
    return rejection_verify(draft_ids, num_draft, q, probs, generator), 0, 0.0
