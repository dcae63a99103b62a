"""A drafter that runs a small torch model (e.g. on npu:0) with the target's own runner and paged KV.

The runner's pool holds the K/V of the tokens we have run; the committed/cached bookkeeping
is `CachedDrafter`'s.
"""

import torch

from orchestrator.drafters.cached import CachedDrafter, CachedSequence
from orchestrator.models import Checkpoint, TargetRunner


class TorchDrafter(CachedDrafter):
    """Greedy or sampled drafts from a torch model; one forward per draft position for all the
    sequences drafting (the runner batches sequences of any lengths)."""

    name = "torch"
    batched = True

    def __init__(self, ckpt: Checkpoint, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 max_kv_tokens: int = 8192, block_size: int = 16):
        super().__init__()
        self.device = device
        self.runner = TargetRunner(ckpt, device=device, dtype=dtype, block_size=block_size,
                                   max_kv_tokens=max_kv_tokens)
        self.max_length = self.runner.max_context
        self.torch_on_cpu = self.runner.device.type == "cpu"

    def _open(self, seq_id: int, prompt_ids: list[int]) -> None:
        return None  # the runner's pool opens the sequence on its first forward

    def _run(self, seq_id: int, seq: CachedSequence, new_ids: list[int]) -> torch.Tensor:
        return self._run_batch([(seq_id, seq, new_ids)])[0]

    def _run_batch(self, items: list[tuple[int, CachedSequence, list[int]]]) -> list[torch.Tensor]:
        outs = self.runner.forward([(seq_id, new_ids, 1) for seq_id, _, new_ids in items])
        return [out.logits[0].float() for out in outs]

    def _truncate(self, seq_id: int, seq: CachedSequence, length: int) -> None:
        self.runner.rollback(seq_id, length)

    def _close(self, seq_id: int, seq: CachedSequence) -> None:
        self.runner.free(seq_id)

    def close(self) -> None:
        for seq_id in list(self._seqs):
            self.finish(seq_id)
