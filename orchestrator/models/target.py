"""The target runner: scores new tokens of several sequences in one forward over the paged pool."""

from dataclasses import dataclass

import torch

from devices import DeviceUnavailable, resolve_torch_device
from orchestrator.errors import HetspecError
from orchestrator.models.checkpoints import Checkpoint
from orchestrator.models.kv_pool import BlockPool
from orchestrator.models.transformer import Segment, Transformer


@dataclass
class TargetOutput:
    logits: torch.Tensor  # [num_scored, vocab] float32: the last `num_scored` new positions
    hidden: torch.Tensor | None = None  # [num_new, hidden] final-layer hidden states of every new position


class TargetRunner:
    """Owns the target model and its KV pool.

    For each sequence the pool holds K/V of positions [0, kv_length). A forward appends the
    K/V of the new tokens and returns logits for the last `num_scored` of them.
    """

    def __init__(self, ckpt: Checkpoint, device: str = "cpu", dtype: torch.dtype = torch.float32,
                 block_size: int = 16, max_kv_tokens: int = 16384):
        try:
            self.device = resolve_torch_device(device)
        except DeviceUnavailable as e:
            raise HetspecError(str(e)) from e
        self.dtype = dtype
        self.model_id = ckpt.key  # names the model in the blocks this runner sends
        self.model = Transformer.load(ckpt.hf_dir, self.device, dtype)
        s = self.model.spec
        self.max_context = s.max_position_embeddings
        self.pool = BlockPool(s.num_layers, s.num_kv_heads, s.head_dim,
                              num_blocks=-(-max_kv_tokens // block_size), block_size=block_size,
                              dtype=dtype, device=self.device)

    @property
    def vocab_size(self) -> int:
        return self.model.spec.vocab_size

    def kv_length(self, seq_id: int) -> int:
        return self.pool.lengths.get(seq_id, 0)

    @torch.inference_mode()
    def forward(self, batch: list[tuple[int, list[int], int]], return_hidden: bool = False) -> list[TargetOutput]:
        """batch: (seq_id, new_token_ids, num_scored) per sequence; one forward for all. `return_hidden`:
        each output also carries the hidden states of all its new positions (an MTP drafter reads them)."""
        ids, positions, segments, scored_rows = [], [], [], []
        for seq_id, new_ids, num_scored in batch:
            start = self.kv_length(seq_id)
            end = start + len(new_ids)
            self.pool.grow(seq_id, end)
            ctx_slots = self.pool.slots(seq_id, 0, end)
            seg = Segment(start=len(ids), num_new=len(new_ids), ctx_len=end,
                          new_slots=ctx_slots[start:], ctx_slots=ctx_slots)
            segments.append(seg)
            ids.extend(new_ids)
            positions.extend(range(start, end))
            scored_rows.append((seg.start + seg.num_new - num_scored, seg.start + seg.num_new))
        hidden = self.model.forward(torch.tensor(ids, device=self.device),
                                    torch.tensor(positions, device=self.device), self.pool, segments)
        for (seq_id, new_ids, _), seg in zip(batch, segments):
            self.pool.commit_length(seq_id, seg.ctx_len)
        rows = torch.cat([torch.arange(a, b) for a, b in scored_rows]).to(self.device)
        picked = hidden.index_select(0, rows)  # [sum num_scored, hidden]
        logits = self.model.logits(picked)
        outputs, offset = [], 0
        for (a, b), seg in zip(scored_rows, segments):
            n = b - a
            outputs.append(TargetOutput(logits[offset:offset + n],
                                        hidden[seg.start:seg.start + seg.num_new] if return_hidden else None))
            offset += n
        return outputs

    def rollback(self, seq_id: int, length: int) -> None:
        """Keep K/V of positions [0, length) and free the blocks past them."""
        self.pool.truncate(seq_id, length)

    def free(self, seq_id: int) -> None:
        self.pool.free(seq_id)
