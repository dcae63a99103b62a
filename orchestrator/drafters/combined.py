"""Several drafters at once (seed 003, 6.2), combined by confidence: per sequence and step, the draft
expected to commit the most tokens.

The drafters are asked in the order given, cheapest first (an n-gram lookup before a model). A
sequence keeps the draft of the first drafter whose expected accepted length for that draft is at
least what every later drafter is expected to give for the full k; the rest go on to the next
drafter, so a sequence the lookup serves costs the model nothing that step. Expectations come from
each drafter's measured acceptance per draft position (its drafts against the tokens then committed,
which the engine reports through `extend`), shrunk towards a prior. Every drafter is told every
committed token, so whichever is asked next step starts from the same text.
"""

from orchestrator.engine import Drafter, DrafterStatus, DraftProposal, DraftRequest
from orchestrator.engine.measured import Acceptance

PRIOR_ACCEPTANCE = 0.5  # a drafter's acceptance per position before it is measured
PRIOR_WEIGHT = 8.0  # drafts before its own counts outweigh the prior


class CombinedDrafter(Drafter):
    name = "combined"

    def __init__(self, drafters: list[Drafter]):
        if len(drafters) < 2:
            raise ValueError("a combined drafter needs at least two drafters")
        self.drafters = list(drafters)
        self.name = "+".join(d.name for d in drafters)
        self.device = drafters[-1].device  # the last is the model, usually: its track
        self.batched = any(d.batched for d in drafters)
        self.acceptance = [Acceptance() for _ in drafters]
        self.chosen = [0] * len(drafters)  # sequence-steps each drafter served
        self._last: dict[int, tuple[int, list[int]]] = {}  # seq -> (drafter index, its draft)

    def expected(self, i: int, k: int) -> float:
        """Drafter i's expected accepted drafts out of k: sum over j of P(drafts 1..j accepted)."""
        total, p = 0.0, 1.0
        for j in range(k):
            p *= self.acceptance[i].rate(j, PRIOR_ACCEPTANCE, PRIOR_WEIGHT)
            total += p
        return total

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        for d in self.drafters:
            d.start(seq_id, prompt_ids)

    def propose(self, seq_id, k, temperature=0.0, top_k=0, top_p=1.0, generator=None,
                min_confidence=0.0) -> DraftProposal:
        request = DraftRequest(seq_id, k, temperature, top_k, top_p, generator, min_confidence)
        return self.propose_batch([request])[seq_id]

    def propose_batch(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        out: dict[int, DraftProposal] = {}
        pending = list(requests)
        for i, drafter in enumerate(self.drafters):
            if not pending:
                break
            last = i == len(self.drafters) - 1
            proposals = drafter.propose_batch(pending)
            rest = []
            for r in pending:
                p = proposals[r.seq_id]
                later = 0.0 if last else max(self.expected(j, r.k) for j in range(i + 1, len(self.drafters)))
                if last or (p.draft_ids and not p.unavailable and self.expected(i, len(p.draft_ids)) >= later):
                    out[r.seq_id] = p
                    self._last[r.seq_id] = (i, list(p.draft_ids))
                    self.chosen[i] += 1
                else:
                    rest.append(r)
            pending = rest
        return out

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        chosen = self._last.pop(seq_id, None)
        if chosen is not None and chosen[1]:  # judge the draft against what was committed
            i, draft = chosen
            accepted = next((j for j, (a, b) in enumerate(zip(draft, token_ids)) if a != b), min(len(draft), len(token_ids)))
            self.acceptance[i].record(len(draft), min(accepted, len(draft)), decay=0.995)
        for d in self.drafters:
            d.extend(seq_id, token_ids)

    def rollback(self, seq_id: int, n: int) -> None:
        self._last.pop(seq_id, None)
        for d in self.drafters:
            d.rollback(seq_id, n)

    def finish(self, seq_id: int) -> None:
        self._last.pop(seq_id, None)
        for d in self.drafters:
            d.finish(seq_id)

    def status(self) -> DrafterStatus:
        states = [d.status() for d in self.drafters]
        worst = next((s for s in states if s.state != "in-process"), states[0])
        return DrafterStatus(worst.state, sum(s.num_reconnects for s in states))

    def close(self) -> None:
        for d in self.drafters:
            d.close()
