"""Overlapped drafting: while the target verifies step t, the drafter drafts step t+1.

The worker assumes the step's drafts are all accepted and that the target's next token is the
drafter's own next choice, and drafts on from there (PEARL's post-verify; DuoDecoding and SGLang's
overlap scheduler hide drafting the same way). When the verify result arrives, a sequence whose
committed tokens are a prefix of what the worker assumed plus what it drafted takes the rest as its
next drafts at no cost on the critical path (a hit); any other sequence drafts afresh (a miss).

Whether to draft ahead is decided every step (`OverlapGate`) from what it measures: how much slower
the target's forward runs while the worker drafts (a drafter thread in the target's process takes
turns with it on the GIL; on shared cores they take turns on the cores) and how long the engine then
waits for the worker, against the fresh-draft time that hits save. Where drafting ahead does not pay,
the engine drafts as without overlap, and every `PROBE_EVERY` steps tries the other choice to keep
both measured.

One worker thread: ONNX Runtime and torch release the GIL while they compute, so the drafter's
model runs beside the target's forward. Its torch work (a drafter's logits: argmax, softmax over the
vocabulary) runs on one thread: torch's OpenMP runtime gives each thread that runs parallel work a
team of its own, and once the teams hold more threads than the machine has cores it stops spinning
between parallel regions, which slowed every kernel of the target's forward on the engine's thread
(a worker drafting 4 rows every 5 ms: 196 -> 347 us per [16 x 576] x [576 x 1536] linear on a 2-core Xeon;
200 us with the worker on one thread). The engine touches the drafter only after `wait()`, so the
drafter is never used from two threads at once. Greedy requests only: a sampled request's drafts
and the verify's sampling share its random generator, and rejection sampling needs the draft's
distribution from exactly the committed prefix; sampled requests draft as before.
"""

import statistics
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

import torch

from orchestrator.engine.drafter import Drafter, DraftProposal, DraftRequest
from orchestrator.engine.measured import Recent
from orchestrator.engine.speculation import CostModel
from orchestrator.tracing import HOST_TRACK, Tracer, Track


@dataclass
class _Ahead:
    base: int  # committed tokens when it was launched
    assumed: list[int]  # what the worker took as committed next: this step's drafts
    proposal: DraftProposal | None = None  # what it drafted after them


@dataclass
class OverlapStats:
    """Engine-wide counters of overlapped drafting (for stats and profiling reports)."""

    launched: int = 0  # sequence-steps pre-drafted
    hits: int = 0  # ... whose pre-draft became the next step's draft
    misses: int = 0  # ... whose pre-draft was discarded (a draft was rejected or the next token differed)
    ahead_s: float = 0.0  # worker seconds spent pre-drafting
    exposed_s: float = 0.0  # of which the engine waited for after the verify (not hidden)

    @property
    def hit_rate(self) -> float:
        judged = self.hits + self.misses
        return self.hits / judged if judged else 0.0

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.ahead_s - self.exposed_s)

    def to_dict(self) -> dict:
        return {"launched": self.launched, "hits": self.hits, "misses": self.misses, "hit_rate": self.hit_rate,
                "ahead_s": self.ahead_s, "hidden_s": self.hidden_s, "exposed_s": self.exposed_s}


PROBE_EVERY = 16  # steps between tries of the choice the gate is not making...
FIRM = 2.0  # ...and 4x as many once one side of the comparison is this many times the other,
FIRM_PROBE_FACTOR = 4
FIRM_DOUBLINGS = 3  # ...twice as many again after each try that left the choice as it was (up to 8x)
HIT_DECAY = 0.95  # the hit rate counts recent takes, each older one weighing this much less...
PRIOR_HIT_RATE = 0.3  # ...shrunk towards this prior, worth PRIOR_HIT_WEIGHT takes
PRIOR_HIT_WEIGHT = 2.0
AHEAD_MIN_CALLS = 8  # drafter calls fitted before a pre-draft's time is compared with the fit


class OverlapGate:
    """Decides each step whether drafting ahead pays:

        saved = hit rate * fresh-draft seconds per sequence * sequences drafted ahead
        cost  = (forward time with the worker running / without - 1) * predicted forward seconds
                + seconds the engine waits for the worker after the forward

    forward times are compared at equal sizes (tokens in the forward): per size the mean of the recent
    forwards each way (trimmed: `Recent.mean`), the slowdown the median over sizes seen both ways.
    Means, not medians: the worker slows the forward now a little, now a lot (it holds the GIL between
    its model calls), and the expected cost is the mean (measured on an H200 host: the median said 10%,
    the forwards beside the worker took about 50% longer on average). (Not relative to the engine's
    verify curve: that curve follows whichever way most recent steps ran, so the other way's older
    ratios would drift against it.) Until some size has 3 forwards each way it alternates; after 32
    steps without one it assumes no slowdown. The wait counts whether the pre-draft hits or not: a
    drafter slower than the forward leaves the engine waiting. A probe of the other choice costs what
    the choice saves: every `probe_every` steps while the two sides are close, every
    `FIRM_PROBE_FACTOR` times as many once one is `FIRM` times the other, and twice as many again
    after each probe the firm choice outlived (up to `FIRM_DOUBLINGS` times: on two shared cores a
    forward beside the worker took 2.5x as long, so each probe cost over a step's worth of time)."""

    def __init__(self, probe_every: int = PROBE_EVERY):
        self.probe_every = probe_every
        # forward seconds per size (tokens in the forward), with / without the worker running
        self.times: dict[bool, dict[int, Recent]] = {True: {}, False: {}}
        self.fresh_s = Recent(9)  # seconds of a fresh draft, per sequence drafted
        self.exposed_s = Recent(9)  # seconds waited for the worker after a forward it ran beside
        self.hit_rate = PRIOR_HIT_RATE
        self._hits = self._takes = 0.0  # decayed counts
        self.steps = {True: 0, False: 0}  # steps drafted ahead / not (for stats)
        self.favoured = False  # the last choice before any probe (False while measuring both ways)
        self.ahead_ratio = Recent(9)  # pre-draft seconds over the drafter's fitted cost of the same call
        self._last_probe = 0  # the step count at the last probe
        self._firm: bool | None = None  # the firm choice the probes have left standing (None: none)
        self._doublings = 0  # probes it has outlived, up to FIRM_DOUBLINGS

    @property
    def ahead_factor(self) -> float:
        """How much longer a pre-draft runs than the same call made on its own (beside the target's
        forward the drafter shares the GIL, the memory bus or the cores); 1 until measured."""
        return self.ahead_ratio.mean if self.ahead_ratio.samples else 1.0

    def record_forward(self, num_tokens: int, seconds: float, overlapped: bool) -> None:
        self.times[overlapped].setdefault(num_tokens, Recent(9)).add(seconds)

    def record_exposed(self, seconds: float) -> None:
        self.exposed_s.add(seconds)

    def record_take(self, hit: bool) -> None:
        """A pre-draft taken or discarded. The rate is the decayed share of hits with a weak prior (a
        good drafter's first hits count at once; a moving average from the prior took ~20 takes)."""
        self._hits = HIT_DECAY * self._hits + hit
        self._takes = HIT_DECAY * self._takes + 1
        self.hit_rate = (self._hits + PRIOR_HIT_WEIGHT * PRIOR_HIT_RATE) / (self._takes + PRIOR_HIT_WEIGHT)

    def slowdown(self) -> float | None:
        """Measured relative slowdown of the target's forward while the worker runs (None: not yet)."""
        on, off = self.times[True], self.times[False]
        ratios = [on[n].mean / off[n].mean for n in on.keys() & off.keys()
                  if len(on[n].samples) >= 3 and len(off[n].samples) >= 3]
        return statistics.median(ratios) - 1 if ratios else None

    def wanted(self, num_seqs: int, forward_s: float) -> bool:
        slowdown = self.slowdown()
        if slowdown is None and sum(self.steps.values()) >= 2 * self.probe_every:
            slowdown = 0.0  # forwards of too many sizes to compare: take the saving alone
        if slowdown is None or not self.fresh_s.samples:
            choice = self.steps[True] <= self.steps[False]  # measure both
            self.favoured = False
        else:
            waited = self.exposed_s.mean if self.exposed_s.samples else 0.0
            saved = self.hit_rate * self.fresh_s.value * num_seqs
            cost = max(0.0, slowdown) * forward_s + waited
            choice = self.favoured = saved > cost
            firm = saved >= FIRM * cost or cost >= FIRM * saved
            if not firm or self._firm is not choice:  # close again, or the other way now: probe sooner
                self._firm, self._doublings = (choice if firm else None), 0
            every = self.probe_every * (FIRM_PROBE_FACTOR << self._doublings if firm else 1)
            step = sum(self.steps.values()) + 1
            if step - self._last_probe >= every:
                choice, self._last_probe = not choice, step
                if firm:
                    self._doublings = min(FIRM_DOUBLINGS, self._doublings + 1)
        self.steps[choice] += 1
        return choice

    def to_dict(self) -> dict:
        slowdown = self.slowdown()
        return {"steps_ahead": self.steps[True], "steps_not_ahead": self.steps[False],
                "forward_slowdown": slowdown, "hit_rate_recent": self.hit_rate,
                "fresh_draft_ms": self.fresh_s.value * 1e3 if self.fresh_s.samples else None,
                "waited_ms": self.exposed_s.mean * 1e3 if self.exposed_s.samples else None,
                "ahead_factor": self.ahead_factor}


class PreDrafter:
    """Runs `Drafter.propose_ahead` on a worker thread; hands matching pre-drafts to the next step."""

    def __init__(self, drafter: Drafter, tracer: Tracer, track: Track, cost: CostModel | None = None):
        """`cost`: the engine's cost model, which then plans k knowing the drafts are made ahead."""
        self.drafter, self.tracer, self.track, self.cost = drafter, tracer, track, cost
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetspec-predraft",
                                        initializer=torch.set_num_threads, initargs=(1,))
        self._future: Future | None = None
        self._step: int | None = None  # the step that launched it
        self._pending: dict[int, _Ahead] = {}  # launched this step
        self._ready: dict[int, _Ahead] = {}  # finished, waiting for their sequence's next step
        self.stats = OverlapStats()
        self.gate = OverlapGate()
        if cost is not None:
            cost.ahead = self.gate

    def predrafted(self, seq, cap: int) -> DraftProposal | None:
        """A sequence's pre-draft (at most `cap` tokens), if the worker's assumption held; greedy only."""
        if not seq.params.greedy or cap == 0:
            return None
        ahead = self.take(seq.seq_id, seq.ids_from)
        if ahead is None or not ahead.draft_ids:
            return None
        return replace(ahead, draft_ids=ahead.draft_ids[:cap],
                       confidence=ahead.confidence[:cap] if ahead.confidence else None)

    def draft_ahead(self, seqs, drafts: dict[int, DraftProposal], caps: dict[int, int], planned: dict[int, int],
                    min_confidence: float, forward_s: float, step: int) -> None:
        """Start drafting the next step for every greedy sequence (`engine.Sequence`) that drafts this
        one, if the gate says it pays: k + 1 tokens on from its drafts (the first is the guess at the
        target's next token), k being this step's planned k within the sequence's `caps`."""
        requests, assumed, bases = [], {}, {}
        for seq in seqs:
            draft = drafts[seq.seq_id]
            if not seq.params.greedy or not draft.draft_ids or draft.unavailable:
                continue
            left = seq.remaining - len(draft.draft_ids) - 1  # tokens still to generate after a full accept
            num = min(caps[seq.seq_id], max(planned.get(seq.seq_id, 0), 1)) + 1
            if min(num, left) < 2:  # the guess alone drafts nothing for the next step
                continue
            requests.append(DraftRequest(seq.seq_id, min(num, left), min_confidence=min_confidence))
            assumed[seq.seq_id], bases[seq.seq_id] = list(draft.draft_ids), seq.num_tokens
        if requests and not self.gate.wanted(len(requests), forward_s):
            requests = []  # measured not to pay: the next step drafts afresh
        self.launch(requests, bases, assumed, step)

    def take(self, seq_id: int, committed_from: Callable[[int], list[int]]) -> DraftProposal | None:
        """The sequence's pre-draft; None (a miss) unless the tokens committed since it was launched
        (`committed_from(start)`: the sequence's committed tokens from index `start`) are a prefix of
        what the worker assumed and drafted."""
        ahead = self._ready.pop(seq_id, None)
        if ahead is None or ahead.proposal is None or ahead.proposal.unavailable:
            return None
        line = ahead.assumed + ahead.proposal.draft_ids
        committed = committed_from(ahead.base)
        n = len(committed)
        if n >= len(line) or line[:n] != committed:
            self.stats.misses += 1
            self.gate.record_take(False)
            return None
        self.stats.hits += 1
        self.gate.record_take(True)
        skip = n - len(ahead.assumed)  # pre-drafted tokens that are committed now
        confidence = ahead.proposal.confidence
        return DraftProposal(draft_ids=line[n:], confidence=confidence[skip:] if confidence else None)

    def launch(self, requests: list[DraftRequest], bases: dict[int, int], assumed: dict[int, list[int]],
               step: int) -> None:
        """Start drafting `requests`, each after its committed tokens plus `assumed[seq_id]`."""
        self._ready.clear()  # a sequence not in this step's batch drafts afresh when it returns
        if not requests:
            return
        self._pending = {r.seq_id: _Ahead(bases[r.seq_id], list(assumed[r.seq_id])) for r in requests}
        self.stats.launched += len(requests)
        self._future, self._step = self._pool.submit(self._run, requests, assumed, step), step

    def _run(self, requests, assumed, step) -> tuple[dict[int, DraftProposal], float]:
        t0 = time.perf_counter()
        with self.tracer.span("draft", self.track, step, ahead=True, num_sequences=len(requests)):
            proposals = self.drafter.propose_ahead(requests, assumed)
        return proposals, time.perf_counter() - t0

    @property
    def running(self) -> bool:
        return self._future is not None

    def wait(self) -> None:
        """Block until the worker is done (the drafter is then free for the engine); errors surface here."""
        if self._future is None:
            return
        t0 = time.perf_counter()
        future, self._future = self._future, None
        with self.tracer.span("wait", HOST_TRACK, self._step):  # the part of the pre-draft not hidden
            proposals, elapsed = future.result()
        waited = time.perf_counter() - t0
        self.stats.exposed_s += waited
        self.gate.record_exposed(waited)
        self.stats.ahead_s += elapsed
        lengths = [len(p.draft_ids) for p in proposals.values() if not p.unavailable]
        # against the drafter's fitted cost once a few calls have told its terms apart (its first, prompt-long
        # catch-ups leave the per-token cost near 0 at first: the ratio would read 50x)
        if self.cost is not None and self.cost.draft.calls >= AHEAD_MIN_CALLS and any(lengths):
            alone = self.cost.draft(len(lengths), sum(lengths), 0, 0.0, max(lengths))
            if alone > 0:
                self.gate.ahead_ratio.add(elapsed / alone)
        for seq_id, ahead in self._pending.items():
            ahead.proposal = proposals.get(seq_id)
        self._ready, self._pending = self._pending, {}

    def forget(self, seq_id: int) -> None:
        self._ready.pop(seq_id, None)

    def close(self) -> None:
        self.wait()
        self._pool.shutdown(wait=True)
