"""Preemption policy: swap a sequence's K/V to host and back, or drop it and recompute it.

swap      = (bytes out + bytes back in) / host copy bandwidth
recompute = num_kv_tokens * prefill seconds per token
Both rates start from priors and follow an EMA of what the engine measures.
"""

import time
from dataclasses import dataclass

from orchestrator.config import PREEMPTION_MODES
from orchestrator.engine.swap import HostKv, swap_in, swap_out

# Priors until measured. The bandwidth is deliberately low (pageable copy plus checksum), so
# a swap has to be shown cheap before "auto" picks it over the engine's old behaviour.
PRIOR_COPY_BYTES_PER_S = 1e9
PRIOR_PREFILL_S_PER_TOKEN = 1e-4
# Per-token time of a forward this small is mostly fixed overhead, not the cost of a token.
MIN_TOKENS_TO_MEASURE = 32


def choose_preemption(num_bytes: int, copy_bytes_per_s: float, num_tokens: int, prefill_s_per_token: float) -> str:
    """'swap' when copying the K/V out and back in is faster than recomputing it, else 'recompute'."""
    swap_s = 2 * num_bytes / copy_bytes_per_s
    recompute_s = num_tokens * prefill_s_per_token
    return "swap" if swap_s < recompute_s else "recompute"


@dataclass
class Ema:
    """A rate: the prior until the first sample, then an exponential moving average."""

    prior: float
    alpha: float = 0.2
    value: float | None = None

    def update(self, sample: float) -> None:
        self.value = sample if self.value is None else (1 - self.alpha) * self.value + self.alpha * sample

    def get(self) -> float:
        return self.prior if self.value is None else self.value


class PreemptionPolicy:
    """The mode ("auto" | "swap" | "recompute") and, for "auto", the measured rates it compares."""

    def __init__(self, mode: str = "auto"):
        if mode not in PREEMPTION_MODES:
            raise ValueError(f"preemption must be one of {', '.join(PREEMPTION_MODES)}, got {mode!r}")
        self.mode = mode
        self.copy_bytes_per_s = Ema(PRIOR_COPY_BYTES_PER_S)
        self.prefill_s_per_token = Ema(PRIOR_PREFILL_S_PER_TOKEN)

    def choose(self, num_bytes: int, num_tokens: int) -> str:
        if num_tokens == 0:  # nothing held: nothing to move or recompute
            return "recompute"
        if self.mode != "auto":
            return self.mode
        return choose_preemption(num_bytes, self.copy_bytes_per_s.get(), num_tokens, self.prefill_s_per_token.get())

    def record_copy(self, num_bytes: int, seconds: float) -> None:
        self.copy_bytes_per_s.update(num_bytes / max(seconds, 1e-9))

    def record_forward(self, num_tokens: int, seconds: float) -> None:
        if num_tokens >= MIN_TOKENS_TO_MEASURE:
            self.prefill_s_per_token.update(seconds / num_tokens)


class Preempter:
    """Takes a preempted sequence's K/V out of the target's pool, to host memory (`staging`) or dropped
    to be recomputed as `policy` chooses, and puts swapped K/V back when the sequence is re-admitted."""

    def __init__(self, target, mode: str, staging):
        self.target, self.policy, self.staging = target, PreemptionPolicy(mode), staging
        self.swapped: dict[int, HostKv] = {}  # seq_id -> K/V of a preempted sequence, on the host
        self.num_swap = 0
        self.num_recompute = 0

    def preempt(self, seq_id: int) -> None:
        pool = self.target.pool
        num_bytes = len(pool.tables.get(seq_id, ())) * pool.kv[:, :, 0].nbytes  # block: [L, 2, bs, H, D]
        if self.policy.choose(num_bytes, self.target.kv_length(seq_id)) == "recompute":
            self.target.free(seq_id)
            self.num_recompute += 1
            return
        t0 = time.perf_counter()
        self.swapped[seq_id] = swap_out(self.target, seq_id, self.staging)
        self.policy.record_copy(num_bytes, time.perf_counter() - t0)
        self.num_swap += 1

    def restore(self, seq_ids: list[int]) -> None:
        """Swap back the K/V of re-admitted sequences (the scheduler reserved their blocks)."""
        for seq_id in seq_ids:
            kv = self.swapped.pop(seq_id, None)
            if kv is None:
                continue
            t0 = time.perf_counter()
            num_bytes = kv.nbytes
            swap_in(self.target, seq_id, kv)
            self.policy.record_copy(num_bytes, time.perf_counter() - t0)

    def release(self, seq_id: int) -> None:
        """Drop the host copy of a sequence finished or cancelled while swapped out."""
        kv = self.swapped.pop(seq_id, None)
        if kv is not None:
            kv.release()
