"""Several drafters at once (seed 003, 6.2), combined by confidence: per sequence and step, the draft
expected to commit the most tokens.

The drafters are asked in the order given, cheapest first (an n-gram lookup before a model). A
sequence keeps the draft of the first drafter whose expected accepted length for that draft is at
least what every later drafter is expected to give for the full k; the rest go on to the next
drafter, so a sequence the lookup serves costs the model nothing that step. Expectations come from
each drafter's acceptance per draft position, per sequence, shrunk towards the drafter's pooled rate
(itself shrunk towards a prior). Every draft a drafter made is judged against the tokens then
committed, kept or not (as far as they reach), so a drafter seldom chosen still learns where it would
have been right: a lookup that copies well in one sequence is chosen there and not in another. Every
drafter is told every committed token, so whichever is asked next step starts from the same text.
"""

from orchestrator.engine import Drafter, DrafterStatus, DraftProposal, DraftRequest
from orchestrator.engine.measured import Acceptance

PRIOR_ACCEPTANCE = 0.5  # a drafter's acceptance per position before it is measured
PRIOR_WEIGHT = 8.0  # drafts before its own counts outweigh the prior
SEQUENCE_WEIGHT = 4.0  # a sequence's own drafts before they outweigh the drafter's pooled rate


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
        self.acceptance = [Acceptance() for _ in drafters]  # pooled over sequences
        self.chosen = [0] * len(drafters)  # sequence-steps each drafter served
        self._drafts: dict[int, dict[int, list[int]]] = {}  # seq -> {drafter index: its draft this step}
        self._per_seq: dict[tuple[int, int], Acceptance] = {}  # (seq, drafter index) -> its own counts

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
        for i, drafter in enumerate(self.drafters):
            if not pending:
                break
            last = i == len(self.drafters) - 1
            proposals = drafter.propose_batch(pending)
            rest = []
            for r in pending:
                p = proposals[r.seq_id]
                drafted = bool(p.draft_ids) and not p.unavailable
                if drafted:
                    self._drafts.setdefault(r.seq_id, {})[i] = list(p.draft_ids)
                if last or (drafted and self.expected(i, len(p.draft_ids), r.seq_id)
                            >= max(self.expected(j, r.k, r.seq_id) for j in range(i + 1, len(self.drafters)))):
                    out[r.seq_id] = p
                    self.chosen[i] += 1
                else:
                    rest.append(r)
            pending = rest
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
