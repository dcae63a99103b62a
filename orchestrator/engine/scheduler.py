"""Admits waiting requests into the running batch while the KV pool and batch limit allow."""

from collections import deque
from collections.abc import Callable

from orchestrator.engine.sequence import Sequence, Status
from orchestrator.models import BlockPool


class Scheduler:
    def __init__(self, pool: BlockPool, max_num_seqs: int, preempt: Callable[[Sequence], None] | None = None):
        self.pool = pool
        self.max_num_seqs = max_num_seqs
        # gives up a sequence's pool blocks (swapped to host or dropped); by default, dropped
        self.preempt = preempt or (lambda seq: pool.free(seq.seq_id))
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def _need(self, seq: Sequence) -> int:
        """Blocks `seq` may still have to take in its next step (k drafts + 1)."""
        return self.pool.blocks_needed(seq.seq_id, seq.num_tokens + seq.k + 1)

    def schedule(self) -> list[Sequence]:
        """The batch for the next step: everything running plus whatever now fits (FCFS).

        When the running sequences outgrow the pool, the newest is preempted: `preempt` takes
        its K/V out of the pool (to host, or to be recomputed) and it waits at the head of the
        queue. Out of the pool it holds no blocks, so `_need` counts all it will take back.
        """
        while len(self.running) > 1 and sum(map(self._need, self.running)) > self.pool.num_free_blocks:
            victim = self.running.pop()
            self.preempt(victim)
            victim.status = Status.WAITING
            victim.num_preemptions += 1
            self.waiting.appendleft(victim)
        reserved = sum(map(self._need, self.running))
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            need = self._need(seq)
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
