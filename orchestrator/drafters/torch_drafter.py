"""A drafter that runs a small torch model (e.g. on npu:0) with the target's own runner and paged KV.

Per sequence we keep the committed tokens; the runner's pool holds K/V for a prefix of the
tokens we have run (`cached_ids`), which may run ahead of the committed tokens over our own
drafts. Before drafting, the cache is cut back to its longest common prefix with the committed
tokens, leaving at least one committed token to run (its logits give the first draft).
"""

from dataclasses import dataclass, field

import torch

from orchestrator.checkpoints import Checkpoint
from orchestrator.drafters.base import DraftProposal, Drafter
from orchestrator.errors import InvalidRequestError
from orchestrator.sampling import logits_to_probs, sample
from orchestrator.target import TargetRunner


@dataclass
class _Sequence:
    committed_ids: list[int]
    cached_ids: list[int] = field(default_factory=list)  # tokens whose K/V are in the pool


class TorchDrafter(Drafter):
    """Greedy or sampled drafts from a torch model; one forward per draft token, batch 1."""

    name = "torch"

    def __init__(self, ckpt: Checkpoint, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 max_kv_tokens: int = 8192, block_size: int = 16):
        self.runner = TargetRunner(ckpt, device=device, dtype=dtype, block_size=block_size,
                                   max_kv_tokens=max_kv_tokens)
        self.max_length = self.runner.max_context
        self._seqs: dict[int, _Sequence] = {}

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        if seq_id in self._seqs:
            raise InvalidRequestError(f"sequence {seq_id} is already open in the drafter")
        if not prompt_ids:
            raise InvalidRequestError("the drafter needs a non-empty prompt")
        self._seqs[seq_id] = _Sequence(committed_ids=list(prompt_ids))

    def propose(self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0,
                top_p: float = 1.0, generator: torch.Generator | None = None) -> DraftProposal:
        seq = self._seq(seq_id)
        k = max(0, min(k, self.max_length - len(seq.committed_ids)))
        if k == 0:
            return DraftProposal(draft_ids=[])
        self._sync_cache(seq_id, seq)
        logits = self._advance(seq_id, seq, seq.committed_ids[len(seq.cached_ids):])  # [vocab]
        draft_ids, draft_probs = [], []
        for i in range(k):
            if temperature > 0:
                probs = logits_to_probs(logits, temperature, top_k, top_p)  # [vocab]
                draft_probs.append(probs)
                draft_ids.append(int(sample(probs, generator)))
            else:
                draft_ids.append(int(torch.argmax(logits)))
            if i < k - 1:  # the last draft's K/V is only needed if it is accepted
                logits = self._advance(seq_id, seq, draft_ids[-1:])
        probs = torch.stack(draft_probs) if draft_probs else None  # [k, vocab]
        return DraftProposal(draft_ids=draft_ids, draft_probs=probs)

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        seq = self._seq(seq_id)
        seq.committed_ids.extend(int(t) for t in token_ids)
        self._sync_cache(seq_id, seq)

    def rollback(self, seq_id: int, n: int) -> None:
        seq = self._seq(seq_id)
        if not 0 <= n <= len(seq.committed_ids):
            raise InvalidRequestError(
                f"cannot roll back {n} of {len(seq.committed_ids)} committed tokens of sequence {seq_id}")
        del seq.committed_ids[len(seq.committed_ids) - n:]
        self._sync_cache(seq_id, seq)

    def finish(self, seq_id: int) -> None:
        if self._seqs.pop(seq_id, None) is not None:
            self.runner.free(seq_id)

    def close(self) -> None:
        for seq_id in list(self._seqs):
            self.finish(seq_id)

    def cached_length(self, seq_id: int) -> int:
        return len(self._seq(seq_id).cached_ids)

    def _seq(self, seq_id: int) -> _Sequence:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise InvalidRequestError(f"sequence {seq_id} is not open in the drafter") from None

    def _sync_cache(self, seq_id: int, seq: _Sequence) -> None:
        """Cut the cache to its common prefix with the committed tokens, leaving >= 1 to run."""
        keep = 0
        limit = min(len(seq.cached_ids), len(seq.committed_ids) - 1)
        while keep < limit and seq.cached_ids[keep] == seq.committed_ids[keep]:
            keep += 1
        if keep < len(seq.cached_ids):
            del seq.cached_ids[keep:]
            self.runner.rollback(seq_id, keep)

    def _advance(self, seq_id: int, seq: _Sequence, new_ids: list[int]) -> torch.Tensor:
        """Run `new_ids` (>= 1) on top of the cache; logits at the last one, [vocab] float32."""
        (out,) = self.runner.forward([(seq_id, new_ids, 1)])
        seq.cached_ids.extend(new_ids)
        return out.logits[0].float()
