"""How many tokens each sequence drafts this step: an online cost model, or a fixed rule.

The cost model chooses every running sequence's k in {0..k_max} to maximise the batch's expected
committed tokens per second:

    E[committed_s(k)] = 1 + sum_{j=1..k} p_s(j)         p_s(j) = P(drafts 1..j all accepted)
    T(k_1..k_b)       = V(sum_s pending_s + k_s) + D(max_s k_s, sequences drafting, sum_s k_s, catch-up tokens)
    choose k to maximise sum_s E[committed_s] / (T - (V(sum_s pending_s) - V(number of sequences)))

the last term being the forward's time for a prompt prefilled in the step (beyond one token per
sequence): run whatever the drafts, it is left out, so drafts are weighed against plain decoding's rate.

p_s(j) is measured per draft position, per sequence, shrunk towards the drafter's pooled estimate
(a Beta-style prior worth `prior_weight` drafts), which itself starts at `prior_acceptance`. V(n) is
the target's measured seconds for a forward over n tokens (per size, interpolated; unseen sizes follow
a linear prior); D the drafter's seconds per call (`DraftCost`). A catch-up (committed tokens the
drafter has not run: the prompt, the steps the sequence sat out) is paid once and serves every later
draft, so it is spread over the steps the sequence still has; so is a hand-off (a self-drafter opened
from the target's K/V at its first draft: measured per token, outside the drafter's call; unpriced,
16 sequences on the edge of drafting all started at once and paid 30-60 ms each). From k = 0 everywhere, the move raising
the expected rate most (drafts for one sequence, or positions for all the sequences at the longest
draft, each looked ahead up to the cap) is made while one does. Where speculation does not pay, k = 0 and the sequence decodes
plainly, re-examined every step; after a long run without drafts one cheap probe keeps the acceptance
estimate fresh (each probe after which no plan drafts halves the share of the time the next may cost,
down to 1/8 of it: where speculation does not pay, as at 16 streams on a 2-core Xeon, probing at 2% of
the time lost up to 2% for good).

When the engine drafts ahead (`overlap`: the gate favours it and every drafting sequence is greedy),
a step's drafts are free but for the misses, and its forward hides the next step's pre-draft unless
that outlasts it: T = V(n) + (1 - hit rate) D(k) + max(0, ahead factor x D(k + 1) - V(n)), with the
hit rate and the pre-draft's slowdown measured by the gate. k then settles where the pre-draft fits
under the verify (`CostModel.step_seconds`).

Greedy drafts stop early once the drafter's probability of the whole draft so far falls where the
observed acceptance does not pay for a draft token; with `KPolicy.stretch` (off by default: it did not
pay on a 2-core Xeon) they may run on past the plan's k, up to the cap, while it stays where acceptance
pays for a token drafted past the plan (`KPolicy.early_stop`, `measured.ConfidenceBins`).

Fixed rules stay as baselines: a constant k, HF's +2/-1 heuristic, vLLM's `disable_by_batch_size`
and TensorRT-LLM's `draft_len_schedule` (batch size -> k).
"""

import itertools
from dataclasses import dataclass
from typing import Protocol

from orchestrator.engine.drafter import CatchUp
from orchestrator.engine.measured import Acceptance, ConfidenceBins, DraftCost, VerifyCurve

PRIOR_ACCEPTANCE = 0.6  # p(1) before anything is measured; p(j) = prior ** j
PRIOR_WEIGHT = 8.0  # drafts a sequence must see before its own counts outweigh the drafter's
PROBE_EVERY = 32  # after this many steps without any draft, one sequence drafts one token...
PROBE_BUDGET = 0.02  # ...once its extra cost is within this share of the time since the last draft,
PROBE_HALVINGS = 3  # ...half that after each probe that left every plan at k = 0 (down to 1/8 of it)
# before a hand-off is timed, a token of K/V handed to the drafter costs this share of a draft token's
# prior (the INT4 ONNX drafter from SmolLM2's pool on a 2-core EPYC: 28-60 ms for ~100 tokens, 0.3-0.6
# ms a token, a draft token's prior 6-10 ms)
PRIOR_OPENING_SHARE = 0.05


def _next(cum: dict, c: "Candidate", k: int) -> float:
    """P(draft k + 1 of c is accepted), from its cumulative expectations."""
    return cum[c.seq_id][k + 1] - cum[c.seq_id][k]


@dataclass
class Candidate:
    """One running sequence as the policy sees it."""
    seq_id: int
    k_cap: int  # the most it may draft this step (request limit, room left); 0 = none
    pending: int  # tokens the target must run for it besides drafts (1 while decoding)
    acceptance: Acceptance  # its own measurements
    lag: int = 1  # committed tokens its drafter has not run (1 when it drafted last step)
    remaining: int = 1 << 30  # tokens it may still generate
    ahead: bool = False  # its next draft is drafted while the target verifies this step (greedy, overlap on)
    opening: int = 0  # committed tokens its first draft takes over from the target's K/V (KV handoff), not run


class Ahead(Protocol):
    """What the cost model reads of overlapped drafting (`overlap.OverlapGate`)."""
    favoured: bool  # drafting ahead is the gate's choice (its tries of the other choice aside)
    hit_rate: float  # share of pre-drafts that became the next step's drafts
    ahead_factor: float  # a pre-draft's seconds over the fitted cost of the same call made on its own


@dataclass
class Plan:
    """The policy's choice for one step, with what it expects (for stats and reports)."""
    ks: dict[int, int]  # seq_id -> k
    expected_tokens: float = 0.0  # committed tokens the model expects from this step
    expected_s: float = 0.0  # seconds it expects the step to take (0 when costs are not measured yet)
    num_tokens: int = 0  # tokens in the target's forward
    overlapped: bool = False  # costed as drafting ahead (`CostModel.step_seconds`)


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
        self.ahead: Ahead | None = None  # set by `overlap.PreDrafter` when the engine drafts ahead
        self._opening: list[float] | None = None  # [seconds, tokens] of timed hand-offs (decayed)
        self._steps_since_draft, self._idle_s = 0, 0.0
        self._probe_budget = PROBE_BUDGET  # share of the time since the last draft the next probe may cost
        self.confidence = ConfidenceBins()  # the drafter's probability of its greedy drafts vs acceptance

    # ---- measurements ------------------------------------------------------------------------

    def record_draft(self, num_seqs: int, num_tokens: int, catch_up: int, seconds: float,
                     positions: int | None = None, timed: CatchUp | None = None) -> None:
        """A drafter call: `num_tokens` drafts for `num_seqs` sequences (the longest `positions`), after
        `catch_up` committed tokens it had not run (beyond one per sequence), of which the drafter timed
        `timed` apart (None: it cannot tell)."""
        self.draft.record(num_seqs, num_tokens, catch_up, seconds, positions, timed)

    def record_forward(self, num_tokens: int, seconds: float) -> None:
        self.verify.record(num_tokens, seconds)

    def record_opening(self, num_tokens: int, seconds: float) -> None:
        """Sequences opened from the target's K/V of `num_tokens` committed tokens in `seconds` (the
        drafter's `prepare`, outside its timed call)."""
        if num_tokens:
            t = self._opening or [0.0, 0.0]
            self._opening = [0.97 * t[0] + seconds, 0.97 * t[1] + num_tokens]

    def opening_seconds(self, num_tokens: int) -> float:
        """A hand-off's expected seconds: what hand-offs took per token, or before any the prior's share
        of a draft token."""
        if not num_tokens:
            return 0.0
        if self._opening is None:
            return PRIOR_OPENING_SHARE * self.draft(1, 1, 0, 0.1 * self.verify(1)) * num_tokens
        seconds, tokens = self._opening
        return seconds / tokens * num_tokens

    def record_verify(self, own: Acceptance, num_draft: int, num_accepted: int) -> None:
        if num_draft:
            own.record(num_draft, num_accepted)
            self.drafter_acceptance.record(num_draft, num_accepted, decay=0.995)
            self._pooled = None

    def break_even(self, plan: Plan) -> float:
        """The acceptance probability at which a draft token pays: the plan's time per draft token
        (drafting and the verify's extra tokens, averaged over its drafts: one size's noise in the
        verify curve must not decide; catch-ups are paid once, not per draft) times the tokens per
        second the plan expects. Drafting ahead, only what the engine is expected to pay of it counts."""
        drafted, ks = sum(plan.ks.values()), [k for k in plan.ks.values() if k]
        if not plan.expected_s or drafted <= 1 or not self.draft.measured:
            return 0.0  # a single draft (a probe, say) is there to be judged: nothing to trim
        n = plan.num_tokens
        step = self.step_seconds(n, len(ks), drafted, 0, max(ks), plan.overlapped)
        per_draft = (step - self.verify(n - drafted)) / drafted
        return per_draft * plan.expected_tokens / plan.expected_s

    def stretch_break_even(self, plan: Plan) -> float:
        """The acceptance at which a draft token past the plan pays: one sequence drafting 4 more
        positions past the plan's longest (a run of its own each, a batched drafter's row alone), with
        the verify's extra tokens, per token, times the tokens per second the plan expects."""
        ks = [k for k in plan.ks.values() if k]
        if not plan.expected_s or not ks or not self.draft.measured:
            return float("inf")
        n, drafted, level, more = plan.num_tokens, sum(ks), max(ks), 4
        base = self.step_seconds(n, len(ks), drafted, 0, level, plan.overlapped)
        longer = self.step_seconds(n + more, len(ks), drafted + more, 0, level + more, plan.overlapped)
        return (longer - base) / more * plan.expected_tokens / plan.expected_s

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
        """P(drafts 1..j+1 of a sequence with these measurements all accepted) (j counts from 0)."""
        return self.p_all(own, j + 1)[-1]

    def p_all(self, own: Acceptance, k: int) -> list[float]:
        """[P(draft 1 accepted), P(drafts 1..2 accepted), ...] for k drafts: running products of its
        conditional rates, each shrunk towards the drafter's."""
        pooled, p, out = self.pooled_rates(), 1.0, []
        for i in range(k):
            p *= own.rate(i, pooled[min(i, len(pooled) - 1)], self.prior_weight)
            out.append(p)
        return out

    def expected_tokens(self, own: Acceptance, k: int) -> float:
        """Tokens a verify step with k drafts is expected to commit: 1 + sum_j P(drafts 1..j accepted)."""
        return 1.0 + sum(self.p_all(own, k))

    def step_seconds(self, num_tokens: int, num_drafting: int, num_drafted: int, catch_up: int,
                     positions: int | None = None, overlapped: bool = False) -> float:
        """A step's expected seconds: the target's forward over `num_tokens`, and the drafter's call
        (before measurements a draft token, or position, costs 10% of a one-token forward).

        `overlapped`: this step's drafts were drafted while the target verified the last one (a hit)
        but for the misses, and its forward hides the next step's pre-draft (one more token per
        sequence, the first a guess at the target's next token) unless that outlasts it:

            V(n) + (1 - hit rate) * D(k) + max(0, ahead factor * D(k + 1) - V(n))

        so k grows while its pre-draft fits under the verify and shrinks once the engine would wait."""
        verify = self.verify(num_tokens)
        if not num_drafted:
            return verify
        prior = 0.1 * self.verify(1)
        draft = self.draft(num_drafting, num_drafted, catch_up, prior, positions)
        if not overlapped or self.ahead is None:
            return verify + draft
        ahead = self.ahead.ahead_factor * self.draft(num_drafting, num_drafted + num_drafting, 0, prior,
                                                      None if positions is None else positions + 1)
        return verify + (1.0 - self.ahead.hit_rate) * draft + max(0.0, ahead - verify)

    def overlapped(self, candidates: list[Candidate]) -> bool:
        """Whether this step is costed as drafting ahead: the gate drafts ahead and every sequence
        that may draft would (a sampled one drafts on the critical path)."""
        return self.ahead is not None and self.ahead.favoured and all(c.ahead for c in candidates if c.k_cap)

    def plan(self, candidates: list[Candidate]) -> Plan:
        """Greedy: while the step's expected tokens per second go up, make the move raising them most:
        more drafts for one sequence, or more positions for every sequence at the longest draft (a
        batched drafter's run per position may be repaid by several sequences, not by one). A move
        looks ahead over every length up to the cap (a verify curve with steps can make two drafts pay
        where one does not); starters pay the per-sequence cost and the catch-up, so they are weighed
        one by one, only the likeliest with lookahead."""
        ks = {c.seq_id: 0 for c in candidates}
        overlapped = self.overlapped(candidates)
        tokens = float(len(candidates))  # every sequence commits at least one token
        n, drafting, drafted, catch_up, level = sum(c.pending for c in candidates), 0, 0, 0.0, 0
        # a prefill's tokens (beyond the one every sequence runs) are run whatever the drafts: their
        # forward time is left out of the rates compared, so drafts must beat plain decoding's rate, not
        # a step's dragged down by a prompt (piggybacked on new prompts at 16 streams, drafts of 100-300 ms
        # raised such steps' rates and lowered the engine's)
        sunk = self.verify(n) - self.verify(len(candidates)) if n > len(candidates) else 0.0
        best = tokens / self.verify(len(candidates)) if candidates else 0.0  # plain decoding's rate
        open_ = [c for c in candidates if c.k_cap > 0]
        amortised = {c.seq_id: self._amortised(c) for c in open_}
        # a hand-off is paid once, like a catch-up: spread over the steps the sequence still has
        opening = {c.seq_id: self.opening_seconds(c.opening) / self._steps_left(c) for c in open_}
        opened = 0.0
        cum = {c.seq_id: self._cumulative(c) for c in open_}  # expected accepted drafts after j drafts
        while open_:
            moves = []  # (ratio, members, drafts added to each, gain)

            def consider(members: list[Candidate], k: int, m: int) -> None:
                new = [c for c in members if ks[c.seq_id] == 0]
                gain = sum(cum[c.seq_id][k + m] - cum[c.seq_id][k] for c in members)
                t = self.step_seconds(n + m * len(members), drafting + len(new), drafted + m * len(members),
                                      catch_up + sum(amortised[c.seq_id] for c in new), max(level, k + m), overlapped) \
                    + opened + sum(opening[c.seq_id] for c in new) - sunk
                moves.append(((tokens + gain) / t, members, m, gain))

            starters = sorted((c for c in open_ if ks[c.seq_id] == 0), key=lambda c: -cum[c.seq_id][1])
            for i, c in enumerate(starters):
                for m in range(1, c.k_cap + 1 if i == 0 else 2):
                    consider([c], 0, m)
            continuers = {}  # at the longest draft (True) or not -> the likeliest next draft
            for c in open_:
                k = ks[c.seq_id]
                rival = continuers.get(k == level)
                if k and (rival is None or _next(cum, c, k) > _next(cum, rival, ks[rival.seq_id])):
                    continuers[k == level] = c
            for c in continuers.values():
                for m in range(1, c.k_cap - ks[c.seq_id] + 1):
                    consider([c], ks[c.seq_id], m)
            members = [c for c in open_ if ks[c.seq_id] == level]
            if len(members) > 1:
                for m in range(1, max(c.k_cap for c in members) - level + 1):
                    consider([c for c in members if c.k_cap >= level + m], level, m)
            ratio, members, m, gain = max(moves, key=lambda mv: mv[0])
            if ratio <= best:
                break  # no move left raises the expected rate
            best, tokens, n, drafted = ratio, tokens + gain, n + m * len(members), drafted + m * len(members)
            for c in members:
                if ks[c.seq_id] == 0:
                    drafting, catch_up = drafting + 1, catch_up + amortised[c.seq_id]
                    opened += opening[c.seq_id]
                ks[c.seq_id] += m
                level = max(level, ks[c.seq_id])
            open_ = [c for c in open_ if ks[c.seq_id] < c.k_cap]
        catch_up = sum(c.lag - 1 for c in candidates if ks[c.seq_id])  # the step itself pays it all
        self._steps_since_draft = 0 if drafted else self._steps_since_draft + 1
        if drafted:  # speculation pays again: probes, should it stop, start from the full budget
            self._probe_budget = PROBE_BUDGET
        self._idle_s = 0.0 if drafted else self._idle_s + self.verify(n)
        probe = [c for c in candidates if c.k_cap > 0]
        if not drafted and probe and self._steps_since_draft >= PROBE_EVERY:
            # nothing drafted for a while: one draft from the sequence cheapest to catch up keeps the
            # drafter's acceptance estimate from going stale, once it costs a small share of the time
            c = min(probe, key=lambda c: (c.lag, c.opening))
            extra = self.step_seconds(n + 1, 1, 1, c.lag - 1, 1) + self.opening_seconds(c.opening) - self.verify(n)
            if extra <= self._probe_budget * self._idle_s:
                self._probe_budget = max(PROBE_BUDGET / (1 << PROBE_HALVINGS), self._probe_budget / 2)
                ks[c.seq_id] = 1
                tokens += self.p_through(c.acceptance, 0)
                n, drafting, drafted, catch_up, level = n + 1, 1, 1, c.lag - 1, 1
                self._steps_since_draft, self._idle_s, overlapped = 0, 0.0, False  # drafted afresh
        expected_s = self.step_seconds(n, drafting, drafted, catch_up, level, overlapped) \
            + sum(self.opening_seconds(c.opening) for c in candidates if ks[c.seq_id]) if self.verify.measured else 0.0
        return Plan(ks, tokens, expected_s, n, overlapped)

    def _cumulative(self, c: Candidate) -> list[float]:
        """[0, p(1), p(1) + p(2), ...] up to the sequence's cap: expected accepted drafts after j drafts."""
        return [0.0, *itertools.accumulate(self.p_all(c.acceptance, c.k_cap))]

    def _amortised(self, c: Candidate) -> float:
        """A catch-up is paid once for all the steps the sequence will then draft in: spread over the
        steps it still needs at the pace a one-token draft would give it."""
        return (c.lag - 1) / self._steps_left(c)

    def _steps_left(self, c: Candidate) -> float:
        return max(1.0, c.remaining / (1.0 + self.p_through(c.acceptance, 0)))

    def evaluate(self, candidates: list[Candidate], ks: dict[int, int]) -> Plan:
        """What the model expects of a step with these k (a fixed rule's choice, say)."""
        tokens = sum(self.expected_tokens(c.acceptance, ks.get(c.seq_id, 0)) for c in candidates)
        drafted = sum(ks.values())
        drafting = [c for c in candidates if ks.get(c.seq_id)]
        catch_up = sum(c.lag - 1 for c in drafting)
        n = sum(c.pending for c in candidates) + drafted
        positions, overlapped = max(ks.values(), default=0), self.overlapped(candidates)
        expected_s = self.step_seconds(n, len(drafting), drafted, catch_up, positions, overlapped) \
            + sum(self.opening_seconds(c.opening) for c in drafting) if self.verify.measured else 0.0
        return Plan(ks, tokens, expected_s, n, overlapped)


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
        # confident greedy drafts may run past the plan's k: off, since it did not pay on a 2-core Xeon
        # (auto with it over auto without, 0.95-1.02 in the 9 cells of bench_control at 0daf0d2)
        self.stretch = False

    def confidence_threshold(self, plan: Plan) -> float:
        """Early stop for greedy drafts under `auto`, calibrated against acceptance (sampled drafts never
        stop early: the proposal distribution must stay q for rejection sampling to be exact)."""
        return self.cost.confidence.threshold(self.cost.break_even(plan)) if self.policy == "auto" else 0.0

    def early_stop(self, plan: Plan, stretches: bool) -> tuple[float, float | None]:
        """(`confidence_threshold`, and for a drafter that `stops_early` under `auto`, how confident a
        greedy draft must stay to run on past the plan's k, up to the cap (a confident run: a grounded
        copy, boilerplate); None: not past k)."""
        stretch = None
        if stretches and self.stretch and self.policy == "auto":
            stretch = self.cost.confidence.stretch_threshold(self.cost.stretch_break_even(plan))
        return self.confidence_threshold(plan), stretch

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
