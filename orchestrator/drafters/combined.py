"""Several drafters at once (seed 003, 6.2), combined by confidence: per sequence and step, the draft
expected to commit the most tokens (per second, once costs are measured).

The drafters are asked in the order given, cheapest first (an n-gram lookup before a model). A
sequence keeps the draft of the first drafter whose expected accepted length for that draft is at
least what every later drafter is expected to give for the full k; the rest go on to the next
drafter, so a sequence the lookup serves costs the model nothing that step. Expectations come from
each drafter's acceptance per draft position, per sequence, shrunk towards the drafter's pooled rate
(itself shrunk towards a prior). Every draft a drafter made is judged against the tokens then
committed, kept or not (as far as they reach), so a drafter seldom chosen still learns where it would
have been right: a lookup that copies well in one sequence is chosen there and not in another. Every
drafter is told every committed token, so whichever is asked next step starts from the same text.

Once the engine tells the target's expected forward time (`DraftRequest.step_s`) and a drafter's own
cost per drafted position is measured (median of its recent calls), "expected" means expected
committed tokens per second, (1 + accepted(k)) / (step_s + cost * k), and each drafter is asked for
the k that maximises it (at most the engine's k): the engine plans one k for the mixture, while a
model drafter pays for every position it drafts and a lookup almost nothing.
"""

import time
from dataclasses import replace

from orchestrator.engine import CatchUp, Drafter, DrafterStatus, DraftProposal, DraftRequest
from orchestrator.engine.measured import Acceptance, Recent

PRIOR_ACCEPTANCE = 0.5  # a drafter's acceptance per position before it is measured
PRIOR_WEIGHT = 8.0  # drafts before its own counts outweigh the prior
SEQUENCE_WEIGHT = 4.0  # a sequence's own drafts before they outweigh the drafter's pooled rate
COST_SAMPLES = 3  # calls measured before a drafter's cost counts (its first call catches up a prompt)


class CombinedDrafter(Drafter):
    name = "combined"
    overlaps = False  # it judges what it is told as committed: assumed tokens would count as judged

    def __init__(self, drafters: list[Drafter]):
        if len(drafters) < 2:
            raise ValueError("a combined drafter needs at least two drafters")
        self.drafters = list(drafters)
        self.name = "+".join(d.name for d in drafters)
        self.device = drafters[-1].device  # the last is the model, usually: its track
        self.batched = any(d.batched for d in drafters)
        self.reads_hidden = any(d.reads_hidden for d in drafters)  # an MTP drafter among them
        self.opens_caught_up = all(d.opens_caught_up for d in drafters)  # e.g. n-gram + a handed-off ONNX drafter
        self.acceptance = [Acceptance() for _ in drafters]  # pooled over sequences
        self.chosen = [0] * len(drafters)  # sequence-steps each drafter served
        self._drafts: dict[int, dict[int, list[int]]] = {}  # seq -> {drafter index: its draft this step}
        self._per_seq: dict[tuple[int, int], Acceptance] = {}  # (seq, drafter index) -> its own counts
        # each drafter's seconds per drafted position and sequence, over its recent calls
        self.cost = [Recent() for _ in drafters]

    def prepare(self, seq_ids: list[int]) -> None:
        for d in self.drafters:
            d.prepare(seq_ids)

    def expected(self, i: int, k: int, seq_id: int | None = None) -> float:
        """Drafter i's expected accepted drafts out of k (for one sequence, or pooled): the sum over j
        of P(drafts 1..j accepted)."""
        own = self._per_seq.get((seq_id, i))
        total, p = 0.0, 1.0
        for j in range(k):
            rate = self.acceptance[i].rate(j, PRIOR_ACCEPTANCE, PRIOR_WEIGHT)
            if own is not None:
                rate = own.rate(j, rate, SEQUENCE_WEIGHT)
            p *= rate
            total += p
        return total

    def position_cost(self, i: int) -> float | None:
        """Drafter i's measured seconds per drafted position and sequence; None until measured."""
        recent = self.cost[i]
        return recent.value if len(recent.samples) >= COST_SAMPLES else None

    def costed(self, step_s: float) -> bool:
        """Whether choices weigh costs: the step time is known and every drafter's cost is measured."""
        return step_s > 0 and all(self.position_cost(i) is not None for i in range(len(self.drafters)))

    def best(self, i: int, k: int, seq_id: int | None, step_s: float) -> tuple[int, float]:
        """Drafter i's draft length in 1..k with the most expected committed tokens per second, and that
        rate; without costs (`costed`) k itself and its expected accepted drafts."""
        if not self.costed(step_s):
            return k, self.expected(i, k, seq_id)
        return max(((n, self.rate(i, n, seq_id, step_s)) for n in range(1, k + 1)), key=lambda x: x[1])

    def rate(self, i: int, n: int, seq_id: int | None, step_s: float) -> float:
        """Expected committed tokens per second of a draft of n from drafter i (costs measured)."""
        return (1 + self.expected(i, n, seq_id)) / (step_s + self.position_cost(i) * n)

    def _score(self, i: int, n: int, seq_id: int, step_s: float) -> float:
        return self.rate(i, n, seq_id, step_s) if self.costed(step_s) else self.expected(i, n, seq_id)

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        self._forget(seq_id)
        for d in self.drafters:
            d.start(seq_id, prompt_ids)

    def propose(self, seq_id, k, temperature=0.0, top_k=0, top_p=1.0, generator=None,
                min_confidence=0.0) -> DraftProposal:
        request = DraftRequest(seq_id, k, temperature, top_k, top_p, generator, min_confidence)
        return self.propose_batch([request])[seq_id]

    def propose_batch(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        out: dict[int, DraftProposal] = {}
        pending = list(requests)
        catch_ups = []
        for i, drafter in enumerate(self.drafters):
            if not pending:
                break
            last = i == len(self.drafters) - 1
            asked = [replace(r, k=self.best(i, r.k, r.seq_id, r.step_s)[0]) for r in pending]
            t0 = time.perf_counter()
            proposals = drafter.propose_batch(asked)
            catch_ups.append(drafter.last_catch_up)
            positions = max((len(p.draft_ids) for p in proposals.values()), default=0)
            if positions:
                self.cost[i].add((time.perf_counter() - t0) / positions / len(asked))
            rest = []
            for r in pending:
                p = proposals[r.seq_id]
                drafted = bool(p.draft_ids) and not p.unavailable
                if drafted:
                    self._drafts.setdefault(r.seq_id, {})[i] = list(p.draft_ids)
                later = (self.best(j, r.k, r.seq_id, r.step_s)[1] for j in range(i + 1, len(self.drafters)))
                if last or (drafted and self._score(i, len(p.draft_ids), r.seq_id, r.step_s) >= max(later)):
                    out[r.seq_id] = p
                    self.chosen[i] += 1
                else:
                    rest.append(r)
            pending = rest
        # each drafter catches up the same committed tokens: their seconds add up, their tokens do not
        self.last_catch_up = None if None in catch_ups else \
            CatchUp(sum(c.seconds for c in catch_ups), max((c.tokens for c in catch_ups), default=0))
        return out

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        # judge every draft made this step against what was committed, as far as the committed tokens
        # reach (past them, a draft that was not kept was never judged)
        for i, draft in self._drafts.pop(seq_id, {}).items():
            n = min(len(draft), len(token_ids))
            accepted = next((j for j in range(n) if draft[j] != token_ids[j]), n)
            self.acceptance[i].record(n, accepted, decay=0.995)
            self._per_seq.setdefault((seq_id, i), Acceptance()).record(n, accepted, decay=0.98)
        for d in self.drafters:
            d.extend(seq_id, token_ids)

    def accept_hidden(self, seq_id: int, block) -> None:
        for d in self.drafters:
            if d.reads_hidden:
                d.accept_hidden(seq_id, block)

    def rollback(self, seq_id: int, n: int) -> None:
        self._drafts.pop(seq_id, None)
        for d in self.drafters:
            d.rollback(seq_id, n)

    def finish(self, seq_id: int) -> None:
        self._forget(seq_id)
        for d in self.drafters:
            d.finish(seq_id)

    def _forget(self, seq_id: int) -> None:
        self._drafts.pop(seq_id, None)
        for i in range(len(self.drafters)):
            self._per_seq.pop((seq_id, i), None)

    def status(self) -> DrafterStatus:
        states = [d.status() for d in self.drafters]
        worst = next((s for s in states if s.state != "in-process"), states[0])
        return DrafterStatus(worst.state, sum(s.num_reconnects for s in states))

    def close(self) -> None:
        for d in self.drafters:
            d.close()
