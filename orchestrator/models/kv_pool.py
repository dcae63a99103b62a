"""Paged KV cache: fixed-size blocks shared by all sequences, one block table per sequence."""

from collections import deque

import torch


class PoolExhausted(RuntimeError):
    """Not enough free blocks for the request; the scheduler waits or preempts."""


class BlockPool:
    """KV storage `[layers, 2, num_blocks, block_size, kv_heads, head_dim]` plus an allocator.

    A sequence's token at position p lives in block `table[p // block_size]`, row
    `p % block_size`. `length` is how many positions hold valid K/V.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device | str = "cpu"):
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv = torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim,
                              dtype=dtype, device=device)
        self._slots = self.kv.view(num_layers, 2, num_blocks * block_size, num_kv_heads, head_dim)
        self._free: deque[int] = deque(range(num_blocks))
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}

    # ---- allocation ------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_needed(self, seq_id: int, new_length: int) -> int:
        have = len(self.tables.get(seq_id, ()))
        return max(0, -(-new_length // self.block_size) - have)

    def can_grow(self, seq_id: int, new_length: int) -> bool:
        return self.blocks_needed(seq_id, new_length) <= self.num_free_blocks

    def grow(self, seq_id: int, new_length: int) -> None:
        """Make room for positions [length, new_length) of `seq_id` (opening it if new)."""
        need = self.blocks_needed(seq_id, new_length)
        if need > self.num_free_blocks:
            raise PoolExhausted(f"need {need} KV blocks, {self.num_free_blocks} free")
        table = self.tables.setdefault(seq_id, [])
        self.lengths.setdefault(seq_id, 0)
        table.extend(self._free.popleft() for _ in range(need))

    def commit_length(self, seq_id: int, length: int) -> None:
        self.lengths[seq_id] = length

    def truncate(self, seq_id: int, length: int) -> None:
        """Keep positions [0, length); return the blocks past them to the pool."""
        if length > self.lengths.get(seq_id, 0):
            raise ValueError(f"cannot truncate sequence {seq_id} forward to {length}")
        table = self.tables[seq_id]
        keep = -(-length // self.block_size)
        self._free.extend(table[keep:])
        del table[keep:]
        self.lengths[seq_id] = length

    def free(self, seq_id: int) -> None:
        self._free.extend(self.tables.pop(seq_id, ()))
        self.lengths.pop(seq_id, None)

    # ---- moving a sequence's K/V out and back (swap, handoff) ----------------------------

    def read_blocks(self, seq_id: int) -> torch.Tensor:
        """A copy of the sequence's blocks, in table order: [layers, 2, num_blocks, block_size, kv_heads, head_dim]."""
        table = torch.tensor(self.tables[seq_id], dtype=torch.long, device=self.kv.device)
        return self.kv.index_select(2, table)

    def write_blocks(self, seq_id: int, blocks: torch.Tensor, length: int) -> None:
        """Open `seq_id` with K/V of positions [0, length) taken from `blocks` (as read_blocks gives)."""
        if self.tables.get(seq_id):
            raise ValueError(f"sequence {seq_id} already holds KV blocks")
        if blocks.shape[2] != -(-length // self.block_size) or blocks.shape[3] != self.block_size:
            raise ValueError(f"{blocks.shape[2]} blocks of {blocks.shape[3]} do not hold exactly {length} tokens")
        self.grow(seq_id, length)
        table = torch.tensor(self.tables[seq_id], dtype=torch.long, device=self.kv.device)
        self.kv.index_copy_(2, table, blocks.to(self.kv.device, self.kv.dtype))
        self.commit_length(seq_id, length)

    # ---- addressing ------------------------------------------------------------------

    def slots(self, seq_id: int, start: int, end: int) -> torch.Tensor:
        """Flat slot indices of positions [start, end) -> LongTensor [end - start]."""
        table = torch.tensor(self.tables[seq_id], dtype=torch.long)
        pos = torch.arange(start, end)
        slots = table[pos // self.block_size] * self.block_size + pos % self.block_size
        return slots.to(self.kv.device)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [num_slots, kv_heads, head_dim]."""
        self._slots[layer, 0].index_copy_(0, slots, k)
        self._slots[layer, 1].index_copy_(0, slots, v)

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> keys, values: [num_slots, kv_heads, head_dim]."""
        return self._slots[layer, 0].index_select(0, slots), self._slots[layer, 1].index_select(0, slots)
