"""What the speculation cost model measures: acceptance per draft position, the target's forward
time per size, the drafter's call time (a decayed least-squares fit). `speculation` plans with them."""

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from orchestrator.engine.drafter import CatchUp

PRIOR_VERIFY_SLOPE = 0.05  # unmeasured V(n) = V(1) * (1 + slope * (n - 1))
# before any drafter call, a token to catch up costs this share of a draft token's prior (run in one
# chunk: 0.25-0.33 measured for the INT4 ONNX drafter here, 16 prompts at once and one at a time)
PRIOR_CATCH_UP_SHARE = 0.3
# a batched drafter's one-row calls, until calls of several rows tell: this share is per row, the rest per
# run (the INT4 ONNX drafter on a 2-core Xeon: 7 ms a run + 2.6 ms a row, per position; 16 rows cost 5x one)
BATCHED_ROW_SHARE = 0.25
STALL = 3.0  # a drafter call taking this many times what the fit foresaw weighs as a stall
CONFIDENCE_BINS = 20  # calibration of the drafter's own probability against acceptance
CONFIDENCE_MIN_SAMPLES = 30  # a bin with fewer judged drafts decides nothing


class Recent:
    """The last few samples: their median (one stalled forward, a busy host, does not move it) or their
    trimmed mean (an expected cost, where frequent large samples are part of the cost; the largest one,
    once there are 4, is left out, so a lone stall does not decide)."""
    __slots__ = ("samples",)

    def __init__(self, size: int = 5):
        self.samples: deque[float] = deque(maxlen=size)

    def add(self, sample: float) -> None:
        self.samples.append(sample)

    @property
    def value(self) -> float:
        return statistics.median(self.samples)

    @property
    def mean(self) -> float:
        samples = sorted(self.samples)
        return statistics.fmean(samples[:-1] if len(samples) >= 4 else samples)


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


class ConfidenceBins:
    """The drafter's probability of its greedy drafts against acceptance (early stop, seed 003 6.1): each
    draft token binned by the drafter's probability of the whole draft up to it (the running product),
    against whether drafts 1..j were all accepted, which is what its j-th token is worth."""

    def __init__(self):
        self.drafted = [0.0] * CONFIDENCE_BINS
        self.accepted = [0.0] * CONFIDENCE_BINS

    def record(self, confidence: list[float], num_accepted: int) -> None:
        """The drafter's probability of each draft token of one draft, `num_accepted` of them accepted."""
        joint = 1.0
        for j, p in enumerate(confidence):
            joint *= p
            b = min(int(joint * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)
            self.drafted[b] = self.drafted[b] * 0.999 + 1.0
            self.accepted[b] = self.accepted[b] * 0.999 + (j < num_accepted)

    def rate(self, b: int) -> float | None:
        """Bin b's acceptance, or None while it holds too few drafts to say."""
        return self.accepted[b] / self.drafted[b] if self.drafted[b] >= CONFIDENCE_MIN_SAMPLES else None

    def threshold(self, break_even: float) -> float:
        """Where drafting stops: below the lowest confidence from which every calibrated bin's acceptance
        reaches `break_even`, the acceptance a draft token must have to pay for itself; 0 (no stop) until
        the bins are measured."""
        for b in reversed(range(CONFIDENCE_BINS)):
            rate = self.rate(b)
            if rate is not None and rate < break_even:
                return (b + 1) / CONFIDENCE_BINS
        return 0.0

    def stretch_threshold(self, break_even: float) -> float | None:
        """How confident a draft must stay to run on past the plan's k: the lowest edge of the bins that,
        from the top down, are all measured and reach `break_even`; None where the top one does not (an
        unmeasured confidence stretches nothing)."""
        threshold = None
        for b in reversed(range(CONFIDENCE_BINS)):
            rate = self.rate(b)
            if rate is None or rate < break_even:
                break
            threshold = b / CONFIDENCE_BINS
        return threshold


class VerifyCurve:
    """Seconds for a target forward over n tokens, measured per n (the median of its recent forwards),
    interpolated between sizes seen. A forward never gets faster with more tokens: the per-size averages are made non-decreasing by
    a weighted isotonic fit (pool adjacent violators), each size weighing its measurements, decayed
    by age. Noise at a size seen once is pooled with its well-measured neighbours instead of
    spreading to every larger size, and a size the plan stopped choosing fades towards them."""

    def __init__(self, slope: float = PRIOR_VERIFY_SLOPE, decay: float = 0.99):
        self.slope = slope
        self.decay = decay
        self._by_size: dict[int, Recent] = {}
        self._weight: dict[int, tuple[float, int]] = {}  # size -> (decayed count, record index when last seen)
        self._sizes: list[int] = []
        self._records = 0
        self._fit: dict[int, float] | None = None  # size -> isotonic value (cached)

    def record(self, num_tokens: int, seconds: float) -> None:
        if num_tokens not in self._by_size:
            self._by_size[num_tokens] = Recent()
            bisect.insort(self._sizes, num_tokens)
        self._by_size[num_tokens].add(seconds)
        self._records += 1
        self._weight[num_tokens] = (self._count(num_tokens) + 1.0, self._records)
        self._fit = None

    def _count(self, n: int) -> float:
        count, seen = self._weight.get(n, (0.0, self._records))
        return max(count * self.decay ** (self._records - seen), 1e-9)  # never 0: pooling divides by it

    def _at(self, n: int) -> float:
        if self._fit is None:
            blocks: list[list[float]] = []  # [value, weight, sizes in the block]
            for size in self._sizes:
                blocks.append([self._by_size[size].value, self._count(size), 1])
                while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
                    v, w, k = blocks.pop()
                    prev = blocks[-1]
                    prev[0] = (prev[0] * prev[1] + v * w) / (prev[1] + w)
                    prev[1] += w
                    prev[2] += k
            values = [v for v, _, k in blocks for _ in range(k)]
            self._fit = dict(zip(self._sizes, values))
        return self._fit[n]

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
    from a token: a weighted ridge reads them the way the drafter runs until other shapes tell: per
    sequence and token; batched, `BATCHED_ROW_SHARE` of a one-row call per row and position, the rest per
    run at each position (read all per call, a probe of one row priced 16 rows at a fifth of what they
    take). Before any call, `prior` seconds per draft token (per position and row as the fit reads a
    one-row call, batched) and `PRIOR_CATCH_UP_SHARE` of that per catch-up token (when
    catch-ups were free before any call, a fresh engine at 16 streams started every sequence at once and
    paid 1.3 s of catch-ups for a step it expected to take 77 ms). The fit minimises relative error (each call weighted by
    1 / seconds^2): a sequence's first draft, catching up its whole prompt, takes seconds where a
    step's drafts take milliseconds, and in absolute terms would decide the fit alone. A call that
    stalled (a busy host) weighs as little, so it barely moves the fit.

    A drafter that times its catch-up runs apart (`Drafter.last_catch_up`) leaves nothing to
    disentangle: the call less its catch-up fits the drafting terms, and c is the catch-ups' seconds
    per token (decayed). Fitted together, one probe (a sequence catching up 40 tokens to draft one)
    put all of its time on c and made drafting look free: the next wave of 16 sequences all drafted."""

    def __init__(self, batched: bool = False, decay: float = 0.97, ridge: float = 1e-6):
        self.batched = batched
        self.decay = decay
        # ridge weights on (o, a, s, b, c): the terms the drafter's shape does not expect pay 1000x
        # (weights w give terms shares 1 / w). A batched drafter costs per position, a run (a) and each
        # row in it (b): its one-row calls split by their ratio, and calls of one position and several
        # rows (a step drafting one token a row) tell b, where a per-sequence s would take the rows'
        # time once per call, not per position (16 rows at 5 positions: 91 ms foreseen, 264 taken);
        # o and s only where the calls demand them
        row = (1 - BATCHED_ROW_SHARE) / BATCHED_ROW_SHARE
        self._penalty = ridge * np.array([1e3, 1, 1e3, row, 1] if batched else [1e3, 1e3, 1, 1, 1], np.float64)
        self._xx = np.zeros((5, 5))
        self._xy = np.zeros(5)
        self._coef: np.ndarray | None = None
        self.calls = 0
        self._timed: list[float] | None = None  # [seconds, tokens] of timed catch-ups (decayed)
        self.max_rows = 0  # the most sequences one call has drafted for

    def record(self, num_seqs: int, num_tokens: int, catch_up: int, seconds: float,
               positions: int | None = None, timed: CatchUp | None = None) -> None:
        self.calls += 1
        self.max_rows = max(self.max_rows, num_seqs)
        if timed is not None:  # the drafter timed its catch-ups: they leave the fit
            t = self._timed or [0.0, 0.0]
            self._timed = [self.decay * t[0] + timed.seconds, self.decay * t[1] + timed.tokens] \
                if timed.tokens else t
            seconds, catch_up = max(seconds - timed.seconds, 1e-5), 0
        x = np.array([1, _positions(num_seqs, num_tokens, positions), num_seqs, num_tokens, catch_up], np.float64)
        # relative error against what the fit foresaw for the call, not what it took: weighted by the
        # time taken, a slow call counts less than a fast one of the same shape, and the fit reads low
        # (16-row calls taking 45 or 120 ms by turns were read at 55-65 ms, their mean 80); a call
        # taking over STALL times the foreseen is weighed by its own time (a stall barely moves the fit)
        foreseen = float(self._coef @ x) if self._coef is not None else 0.0
        w = 1.0 / max(foreseen if foreseen > 0 else seconds, seconds / STALL, 1e-5) ** 2
        self._xx = self.decay * self._xx + w * np.outer(x, x)
        self._xy = self.decay * self._xy + w * x * seconds
        scale = np.trace(self._xx) / 5
        a, y = self._xx + scale * np.diag(self._penalty), self._xy
        free = np.ones(5, bool)  # no cost is negative: a term fitted below 0 is held at 0 and the rest refitted
        coef = np.zeros(5)
        while free.any():
            coef[:] = 0.0
            coef[free] = np.linalg.solve(a[np.ix_(free, free)], y[free])
            if (coef >= 0).all():
                break
            free &= coef > 0
        self._coef = coef

    @property
    def measured(self) -> bool:
        return self._coef is not None

    def __call__(self, num_seqs: int, num_tokens: int, catch_up: int, prior: float,
                 positions: int | None = None) -> float:
        positions = _positions(num_seqs, num_tokens, positions)
        if self._coef is None:
            drafts = (1 - BATCHED_ROW_SHARE) * positions + BATCHED_ROW_SHARE * num_tokens if self.batched \
                else num_tokens
            return prior * (drafts + PRIOR_CATCH_UP_SHARE * catch_up)
        o, a, s, b, c = self._coef
        if self.batched and num_seqs > self.max_rows:
            # rows beyond the widest call seen: calls of one or two rows cannot tell a run from a row (two
            # rows put it all on the run, b = 0: 16 rows at 5 positions foreseen at 79 ms, taken in ~340),
            # so each row costs at least the prior's share of a one-row position
            b = max(b, BATCHED_ROW_SHARE * (a + b))
        if self._timed is not None:
            seconds, tokens = self._timed
            c = seconds / tokens if tokens else PRIOR_CATCH_UP_SHARE * (a + b)
        return float(o + a * positions + s * num_seqs + b * num_tokens + c * catch_up)


def _positions(num_seqs: int, num_tokens: int, positions: int | None) -> int:
    """The longest draft of a call; unknown: as if the tokens were spread evenly."""
    return positions if positions is not None else -(-num_tokens // max(1, num_seqs))
