"""Admits waiting requests into the running batch while the KV pool and batch limit allow."""

from collections import deque

from orchestrator.kv_pool import BlockPool
from orchestrator.sequence import Sequence, Status


class Scheduler:
    def __init__(self, pool: BlockPool, max_num_seqs: int):
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def schedule(self) -> list[Sequence]:
        """The batch for the next step: everything running plus whatever now fits (FCFS)."""
        reserved = sum(self.pool.blocks_needed(s.seq_id, s.num_tokens + s.k + 1) for s in self.running)
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            need = self.pool.blocks_needed(seq.seq_id, len(seq.prompt_ids) + seq.k + 1)
            if reserved + need > self.pool.num_free_blocks:
                break
            reserved += need
            seq.status = Status.RUNNING
            self.running.append(self.waiting.popleft())
        return list(self.running)

    def remove(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)
