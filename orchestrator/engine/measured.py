"""What the speculation cost model measures: acceptance per draft position, the target's forward
time per size, the drafter's call time (a decayed least-squares fit). `speculation` plans with them."""

import bisect
from dataclasses import dataclass, field

import numpy as np

PRIOR_VERIFY_SLOPE = 0.05  # unmeasured V(n) = V(1) * (1 + slope * (n - 1))
EMA = 0.2  # weight of a new measurement


class Ema:
    """An exponential moving average that is None until its first sample."""
    __slots__ = ("value",)

    def __init__(self):
        self.value: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else (1 - EMA) * self.value + EMA * sample


@dataclass
class Acceptance:
    """Per draft position: how often it was judged (every earlier draft accepted) and accepted
    (decayed counts), so conditional acceptance rates can be estimated position by position."""

    judged: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def record(self, num_draft: int, num_accepted: int, decay: float = 1.0) -> None:
        grow = num_draft - len(self.judged)
        if grow > 0:
            self.judged += [0.0] * grow
            self.accepted += [0.0] * grow
        if decay < 1.0:
            self.judged = [d * decay for d in self.judged]
            self.accepted = [a * decay for a in self.accepted]
        for j in range(min(num_draft, num_accepted + 1)):  # drafts after the first rejection were not judged
            self.judged[j] += 1
            self.accepted[j] += j < num_accepted

    @property
    def drafted(self) -> bool:
        return bool(self.judged)

    def rate(self, j: int, prior: float, weight: float) -> float:
        """P(draft j+1 accepted | drafts 1..j accepted), the counts shrunk towards `prior`."""
        n = self.judged[j] if j < len(self.judged) else 0.0
        a = self.accepted[j] if j < len(self.accepted) else 0.0
        return (a + weight * prior) / (n + weight)


class VerifyCurve:
    """Seconds for a target forward over n tokens, measured per n, interpolated between sizes seen.
    A forward never gets faster with more tokens: each size reads the largest value measured at or
    below it (noise at one size must not make the next token look free, or dear)."""

    def __init__(self, slope: float = PRIOR_VERIFY_SLOPE):
        self.slope = slope
        self._by_size: dict[int, Ema] = {}
        self._sizes: list[int] = []
        self._envelope: dict[int, float] | None = None  # size -> running max (cached)

    def record(self, num_tokens: int, seconds: float) -> None:
        if num_tokens not in self._by_size:
            self._by_size[num_tokens] = Ema()
            bisect.insort(self._sizes, num_tokens)
        self._by_size[num_tokens].add(seconds)
        self._envelope = None

    def _at(self, n: int) -> float:
        if self._envelope is None:
            top, self._envelope = 0.0, {}
            for size in self._sizes:
                top = max(top, self._by_size[size].value)
                self._envelope[size] = top
        return self._envelope[n]

    @property
    def measured(self) -> bool:
        return bool(self._sizes)

    def __call__(self, n: int) -> float:
        if n in self._by_size:
            return self._at(n)
        sizes = self._sizes
        if not sizes:
            return 1.0 + self.slope * (n - 1)  # relative units until something is measured
        i = bisect.bisect_left(sizes, n)
        if 0 < i < len(sizes):  # between two measured sizes: linear interpolation
            lo, hi = sizes[i - 1], sizes[i]
            f = (n - lo) / (hi - lo)
            return (1 - f) * self._at(lo) + f * self._at(hi)
        edge = sizes[0] if i == 0 else sizes[-1]  # outside: the prior's relative slope from the edge
        return self._at(edge) * (1 + self.slope * (n - 1)) / (1 + self.slope * (edge - 1))


class DraftCost:
    """Seconds of one drafter call, fitted by decayed least squares over recent calls:

        t = o + a * positions + s * sequences + b * draft tokens + c * catch-up tokens

    `positions` is the call's longest draft: a batched drafter runs once per position for all its
    sequences (`a`, `o` per call), each row adding `b`; `s` is the per-sequence cost (all of it for a
    drafter that drafts one sequence at a time), `c` a token to catch up (committed while the sequence
    sat out, or its prompt). One-sequence calls cannot tell per call from per sequence, nor a position
    from a token: a weighted ridge reads them the way the drafter runs (`batched`: per call and
    position; else per sequence and token) until other shapes tell. Before any call, `prior` seconds
    per draft token (per position, batched)."""

    def __init__(self, batched: bool = False, decay: float = 0.97, ridge: float = 1e-6):
        self.batched = batched
        self.decay = decay
        # ridge weights on (o, a, s, b, c): the terms the drafter's shape does not expect pay 1000x
        self._penalty = ridge * np.array([1, 1, 1e3, 1e3, 1] if batched else [1e3, 1e3, 1, 1, 1], np.float64)
        self._xx = np.zeros((5, 5))
        self._xy = np.zeros(5)
        self._coef: np.ndarray | None = None

    def record(self, num_seqs: int, num_tokens: int, catch_up: int, seconds: float,
               positions: int | None = None) -> None:
        x = np.array([1, _positions(num_seqs, num_tokens, positions), num_seqs, num_tokens, catch_up], np.float64)
        self._xx = self.decay * self._xx + np.outer(x, x)
        self._xy = self.decay * self._xy + x * seconds
        scale = np.trace(self._xx) / 5
        coef = np.linalg.solve(self._xx + scale * np.diag(self._penalty), self._xy)
        self._coef = np.clip(coef, 0.0, None)

    @property
    def measured(self) -> bool:
        return self._coef is not None

    def per_token(self, prior: float) -> float:
        return float(self._coef[3]) if self._coef is not None else prior

    def __call__(self, num_seqs: int, num_tokens: int, catch_up: int, prior: float,
                 positions: int | None = None) -> float:
        positions = _positions(num_seqs, num_tokens, positions)
        if self._coef is None:
            return prior * (positions if self.batched else num_tokens)
        o, a, s, b, c = self._coef
        return float(o + a * positions + s * num_seqs + b * num_tokens + c * catch_up)


def _positions(num_seqs: int, num_tokens: int, positions: int | None) -> int:
    """The longest draft of a call; unknown: as if the tokens were spread evenly."""
    return positions if positions is not None else -(-num_tokens // max(1, num_seqs))
