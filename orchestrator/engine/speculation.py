"""How many tokens each sequence drafts this step: an online cost model, or a fixed rule.

The cost model chooses every running sequence's k in {0..k_max} to maximise the batch's expected
committed tokens per second:

    E[committed_s(k)] = 1 + sum_{j=1..k} p_s(j)         p_s(j) = P(drafts 1..j all accepted)
    T(k_1..k_b)       = V(sum_s pending_s + k_s) + D(max_s k_s, sequences drafting, sum_s k_s, catch-up tokens)
    choose k to maximise sum_s E[committed_s] / T

p_s(j) is measured per draft position, per sequence, shrunk towards the drafter's pooled estimate
(a Beta-style prior worth `prior_weight` drafts), which itself starts at `prior_acceptance`. V(n) is
the target's measured seconds for a forward over n tokens (per size, interpolated; unseen sizes follow
a linear prior); D the drafter's seconds per call (`DraftCost`). A catch-up (committed tokens the
drafter has not run: the prompt, the steps the sequence sat out) is paid once and serves every later
draft, so it is spread over the steps the sequence still has. From k = 0 everywhere, the move raising
the expected rate most (one draft for one sequence, or one more position for all the sequences at the
longest draft) is made while one does. Where speculation does not pay, k = 0 and the sequence decodes
plainly, re-examined every step; after a long run without drafts one cheap probe keeps the acceptance
estimate fresh.

Fixed rules stay as baselines: a constant k, HF's +2/-1 heuristic, vLLM's `disable_by_batch_size`
and TensorRT-LLM's `draft_len_schedule` (batch size -> k).
"""

import bisect
from dataclasses import dataclass, field

import numpy as np

PRIOR_ACCEPTANCE = 0.6  # p(1) before anything is measured; p(j) = prior ** j
PRIOR_WEIGHT = 8.0  # drafts a sequence must see before its own counts outweigh the drafter's
PRIOR_VERIFY_SLOPE = 0.05  # unmeasured V(n) = V(1) * (1 + slope * (n - 1))
PROBE_EVERY = 32  # after this many steps without any draft, one sequence drafts one token...
PROBE_BUDGET = 0.02  # ...once its extra cost is within this share of the time since the last draft
EMA = 0.2  # weight of a new measurement
CONFIDENCE_BINS = 20  # calibration of the drafter's own probability against acceptance
CONFIDENCE_MIN_SAMPLES = 30  # a bin with fewer judged drafts does not stop anything


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
    """Seconds for a target forward over n tokens, measured per n, interpolated between sizes seen."""

    def __init__(self, slope: float = PRIOR_VERIFY_SLOPE):
        self.slope = slope
        self._by_size: dict[int, Ema] = {}
        self._sizes: list[int] = []

    def record(self, num_tokens: int, seconds: float) -> None:
        if num_tokens not in self._by_size:
            self._by_size[num_tokens] = Ema()
            bisect.insort(self._sizes, num_tokens)
        self._by_size[num_tokens].add(seconds)

    @property
    def measured(self) -> bool:
        return bool(self._sizes)

    def __call__(self, n: int) -> float:
        if n in self._by_size:
            return self._by_size[n].value
        sizes = self._sizes
        if not sizes:
            return 1.0 + self.slope * (n - 1)  # relative units until something is measured
        i = bisect.bisect_left(sizes, n)
        if 0 < i < len(sizes):  # between two measured sizes: linear interpolation
            lo, hi = sizes[i - 1], sizes[i]
            f = (n - lo) / (hi - lo)
            return (1 - f) * self(lo) + f * self(hi)
        edge = sizes[0] if i == 0 else sizes[-1]  # outside: the prior's relative slope from the edge
        return self(edge) * (1 + self.slope * (n - 1)) / (1 + self.slope * (edge - 1))


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


@dataclass
class Candidate:
    """One running sequence as the policy sees it."""
    seq_id: int
    k_cap: int  # the most it may draft this step (request limit, room left); 0 = none
    pending: int  # tokens the target must run for it besides drafts (1 while decoding)
    acceptance: Acceptance  # its own measurements
    lag: int = 1  # committed tokens its drafter has not run (1 when it drafted last step)
    remaining: int = 1 << 30  # tokens it may still generate


@dataclass
class Plan:
    """The policy's choice for one step, with what it expects (for stats and reports)."""
    ks: dict[int, int]  # seq_id -> k
    expected_tokens: float = 0.0  # committed tokens the model expects from this step
    expected_s: float = 0.0  # seconds it expects the step to take (0 when costs are not measured yet)
    num_tokens: int = 0  # tokens in the target's forward


class CostModel:
    """Measured costs and acceptance; `plan` picks each sequence's k for one step."""

    def __init__(self, k_max: int, prior_acceptance: float = PRIOR_ACCEPTANCE, prior_weight: float = PRIOR_WEIGHT,
                 batched_drafter: bool = False):
        self.k_max = k_max
        self.prior_acceptance = prior_acceptance
        self.prior_weight = prior_weight
        self.drafter_acceptance = Acceptance()  # pooled over sequences, slowly decayed
        self._pooled: list[float] | None = None  # its conditional rates, per position (cached)
        self.draft = DraftCost(batched_drafter)
        self.verify = VerifyCurve()
        self._steps_since_draft, self._idle_s = 0, 0.0
        # greedy drafts judged on their own (their prefix accepted), binned by the drafter's confidence
        self.confidence_drafted = [0.0] * CONFIDENCE_BINS
        self.confidence_accepted = [0.0] * CONFIDENCE_BINS

    # ---- measurements ------------------------------------------------------------------------

    def record_draft(self, num_seqs: int, num_tokens: int, catch_up: int, seconds: float,
                     positions: int | None = None) -> None:
        """A drafter call: `num_tokens` drafts for `num_seqs` sequences (the longest `positions`), after
        `catch_up` committed tokens it had not run (beyond one per sequence)."""
        self.draft.record(num_seqs, num_tokens, catch_up, seconds, positions)

    def record_forward(self, num_tokens: int, seconds: float) -> None:
        self.verify.record(num_tokens, seconds)

    def record_verify(self, own: Acceptance, num_draft: int, num_accepted: int) -> None:
        if num_draft:
            own.record(num_draft, num_accepted)
            self.drafter_acceptance.record(num_draft, num_accepted, decay=0.995)
            self._pooled = None

    def record_confidence(self, confidence: list[float], num_accepted: int) -> None:
        """The drafter's probability of each greedy draft token, against whether it was accepted
        (tokens after the first rejection were never judged)."""
        for j, p in enumerate(confidence[:num_accepted + 1]):
            b = min(int(p * CONFIDENCE_BINS), CONFIDENCE_BINS - 1)
            self.confidence_drafted[b] = self.confidence_drafted[b] * 0.999 + 1.0
            self.confidence_accepted[b] = self.confidence_accepted[b] * 0.999 + (j < num_accepted)

    def confidence_threshold(self, break_even: float) -> float:
        """Early stop (seed 003, 6.1): the drafter stops below the lowest confidence from which every
        calibrated bin's acceptance reaches `break_even`, the acceptance a draft token must have to pay
        for itself; 0 (no stop) until the bins are measured."""
        for b in reversed(range(CONFIDENCE_BINS)):
            drafted = self.confidence_drafted[b]
            if drafted >= CONFIDENCE_MIN_SAMPLES and self.confidence_accepted[b] / drafted < break_even:
                return (b + 1) / CONFIDENCE_BINS
        return 0.0

    def break_even(self, plan: Plan) -> float:
        """The acceptance probability at which one more draft token pays: its marginal time (a draft
        plus one more token in the verify) times the tokens per second the plan expects."""
        if not plan.expected_s or not self.draft.measured:
            return 0.0
        n = plan.num_tokens
        marginal = self.draft.per_token(0.0) + self.verify(n + 1) - self.verify(n)
        return marginal * plan.expected_tokens / plan.expected_s

    # ---- the choice ----------------------------------------------------------------------------

    def pooled_rates(self) -> list[float]:
        """The drafter's conditional acceptance per position, over all sequences. A position with few
        measurements leans on the rate before it (the i.i.d. model's constant rate), the first on the prior."""
        if self._pooled is None:
            rates, prior = [], self.prior_acceptance
            for j in range(max(1, self.k_max)):
                prior = self.drafter_acceptance.rate(j, prior, self.prior_weight)
                rates.append(prior)
            self._pooled = rates
        return self._pooled

    def p_through(self, own: Acceptance, j: int) -> float:
        """P(drafts 1..j+1 of a sequence with these measurements all accepted) (j counts from 0): the
        product of its conditional rates, each shrunk towards the drafter's."""
        pooled = self.pooled_rates()
        p = 1.0
        for i in range(j + 1):
            p *= own.rate(i, pooled[min(i, len(pooled) - 1)], self.prior_weight)
        return p

    def expected_tokens(self, own: Acceptance, k: int) -> float:
        """Tokens a verify step with k drafts is expected to commit: 1 + sum_j P(drafts 1..j accepted)."""
        return 1.0 + sum(self.p_through(own, j) for j in range(k))

    def step_seconds(self, num_tokens: int, num_drafting: int, num_drafted: int, catch_up: int,
                     positions: int | None = None) -> float:
        """A step's expected seconds: the target's forward over `num_tokens`, and the drafter's call
        (before measurements a draft token, or position, costs 10% of a one-token forward)."""
        if not num_drafted:
            return self.verify(num_tokens)
        return self.verify(num_tokens) + self.draft(num_drafting, num_drafted, catch_up, 0.1 * self.verify(1), positions)

    def plan(self, candidates: list[Candidate]) -> Plan:
        """Greedy: while the step's expected tokens per second go up, make the move raising them most:
        one more draft for one sequence, or one more position for every sequence at the longest draft
        (a batched drafter's run per position may be repaid by several sequences, not by one). A first
        draft also pays the per-sequence cost and the catch-up, so starters are weighed one by one."""
        ks = {c.seq_id: 0 for c in candidates}
        tokens = float(len(candidates))  # every sequence commits at least one token
        n, drafting, drafted, catch_up, level = sum(c.pending for c in candidates), 0, 0, 0.0, 0
        best = tokens / self.step_seconds(n, 0, 0, 0) if candidates else 0.0
        open_ = [c for c in candidates if c.k_cap > 0]
        amortised = {c.seq_id: self._amortised(c) for c in open_}
        next_p = {c.seq_id: self.p_through(c.acceptance, 0) for c in open_}
        while open_:
            moves = []  # (ratio, members, gain)
            continuers = {}  # opens a new position (True) or not -> the likeliest next draft
            for c in open_:
                k = ks[c.seq_id]
                if k == 0:
                    t = self.step_seconds(n + 1, drafting + 1, drafted + 1, catch_up + amortised[c.seq_id],
                                          max(level, 1))
                    moves.append(((tokens + next_p[c.seq_id]) / t, [c], next_p[c.seq_id]))
                elif (k == level) not in continuers or next_p[c.seq_id] > next_p[continuers[k == level].seq_id]:
                    continuers[k == level] = c
            for opens, c in continuers.items():
                t = self.step_seconds(n + 1, drafting, drafted + 1, catch_up, level + opens)
                moves.append(((tokens + next_p[c.seq_id]) / t, [c], next_p[c.seq_id]))
            members = [c for c in open_ if ks[c.seq_id] == level]
            if len(members) > 1:
                starters = [c for c in members if ks[c.seq_id] == 0]
                gain = sum(next_p[c.seq_id] for c in members)
                t = self.step_seconds(n + len(members), drafting + len(starters), drafted + len(members),
                                      catch_up + sum(amortised[c.seq_id] for c in starters), level + 1)
                moves.append(((tokens + gain) / t, members, gain))
            ratio, members, gain = max(moves, key=lambda m: m[0])
            if ratio <= best:
                break  # no move left raises the expected rate
            best, tokens, n, drafted = ratio, tokens + gain, n + len(members), drafted + len(members)
            for c in members:
                if ks[c.seq_id] == 0:
                    drafting, catch_up = drafting + 1, catch_up + amortised[c.seq_id]
                ks[c.seq_id] += 1
                level = max(level, ks[c.seq_id])
                next_p[c.seq_id] = self.p_through(c.acceptance, ks[c.seq_id])
            open_ = [c for c in open_ if ks[c.seq_id] < c.k_cap]
        catch_up = sum(c.lag - 1 for c in candidates if ks[c.seq_id])  # the step itself pays it all
        self._steps_since_draft = 0 if drafted else self._steps_since_draft + 1
        self._idle_s = 0.0 if drafted else self._idle_s + self.verify(n)
        probe = [c for c in candidates if c.k_cap > 0]
        if not drafted and probe and self._steps_since_draft >= PROBE_EVERY:
            # nothing drafted for a while: one draft from the sequence cheapest to catch up keeps the
            # drafter's acceptance estimate from going stale, once it costs a small share of the time
            c = min(probe, key=lambda c: c.lag)
            if self.step_seconds(n + 1, 1, 1, c.lag - 1, 1) - self.verify(n) <= PROBE_BUDGET * self._idle_s:
                ks[c.seq_id] = 1
                tokens += self.p_through(c.acceptance, 0)
                n, drafting, drafted, catch_up, level = n + 1, 1, 1, c.lag - 1, 1
                self._steps_since_draft, self._idle_s = 0, 0.0
        expected_s = self.step_seconds(n, drafting, drafted, catch_up, level) if self.verify.measured else 0.0
        return Plan(ks, tokens, expected_s, n)

    def _amortised(self, c: Candidate) -> float:
        """A catch-up is paid once for all the steps the sequence will then draft in: spread over the
        steps it still needs at the pace a one-token draft would give it."""
        steps_left = max(1.0, c.remaining / (1.0 + self.p_through(c.acceptance, 0)))
        return (c.lag - 1) / steps_left

    def evaluate(self, candidates: list[Candidate], ks: dict[int, int]) -> Plan:
        """What the model expects of a step with these k (a fixed rule's choice, say)."""
        tokens = sum(self.expected_tokens(c.acceptance, ks.get(c.seq_id, 0)) for c in candidates)
        drafted = sum(ks.values())
        drafting = [c for c in candidates if ks.get(c.seq_id)]
        catch_up = sum(c.lag - 1 for c in drafting)
        n = sum(c.pending for c in candidates) + drafted
        positions = max(ks.values(), default=0)
        expected_s = self.step_seconds(n, len(drafting), drafted, catch_up, positions) if self.verify.measured else 0.0
        return Plan(ks, tokens, expected_s, n)


class KPolicy:
    """The engine's choice of k per sequence and step: `auto` (the cost model), `fixed` (k, under the
    batch-size rules) or `adaptive` (HF's +2/-1 per sequence). Measurements go in whatever the policy,
    so the cost model's view is there to compare against."""

    def __init__(self, policy: str = "fixed", k_max: int = 4, disable_by_batch_size: int | None = None,
                 draft_len_schedule: tuple[tuple[int, int], ...] = (), batched_drafter: bool = False):
        if policy not in ("auto", "fixed", "adaptive"):
            raise ValueError(f"k policy must be auto, fixed or adaptive, got {policy!r}")
        self.policy = policy
        self.k_max = k_max
        self.disable_by_batch_size = disable_by_batch_size
        self.draft_len_schedule = tuple(draft_len_schedule)
        self.cost = CostModel(k_max, batched_drafter=batched_drafter)

    def plan(self, candidates: list[Candidate], draft_lens: dict[int, int]) -> Plan:
        """k for each candidate; `draft_lens` are the adaptive policy's per-sequence lengths."""
        if self.policy == "auto":
            return self.cost.plan(candidates)
        k = scheduled_k(self.k_max, len(candidates), self.disable_by_batch_size, self.draft_len_schedule)
        adaptive = self.policy == "adaptive"
        ks = {c.seq_id: min(c.k_cap, k, draft_lens.get(c.seq_id, k) if adaptive else k) for c in candidates}
        return self.cost.evaluate(candidates, ks)  # the model's expectation, to compare with what happens


def next_draft_len(current: int, num_draft: int, num_accepted: int, k_max: int) -> int:
    """Dynamic speculation (HF's heuristic): +2 after a fully accepted draft, else -1; in [1, k_max]."""
    return min(k_max, current + 2) if num_accepted == num_draft else max(1, current - 1)


def scheduled_k(k: int, batch_size: int, disable_by_batch_size: int | None,
                draft_len_schedule: tuple[tuple[int, int], ...]) -> int:
    """The fixed rules: vLLM turns speculation off from a batch size on; TensorRT-LLM's schedule maps
    batch sizes to draft lengths (the entry with the largest batch size <= the batch applies)."""
    if disable_by_batch_size is not None and batch_size >= disable_by_batch_size:
        return 0
    for min_batch, scheduled in sorted(draft_len_schedule, reverse=True):
        if batch_size >= min_batch:
            return min(k, scheduled)
    return k
