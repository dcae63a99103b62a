"""Bookkeeping shared by model drafters: committed tokens vs the tokens whose K/V are cached.

Per sequence we keep the committed tokens and, separately, the tokens whose K/V the model's
cache holds (`cached_ids`); the cache may run ahead of the committed tokens over the
drafter's own drafts. Before drafting, the cache is cut back to its longest common prefix
with the committed tokens, always leaving at least one committed token to run, since its
logits give the first draft.
"""

import time
from abc import abstractmethod
from dataclasses import dataclass, field

import torch

from orchestrator.engine import CatchUp, Drafter, DraftProposal, DraftRequest
from orchestrator.engine.sampling import logits_to_probs, sample
from orchestrator.errors import InvalidRequestError


@dataclass
class CachedSequence:
    committed_ids: list[int]
    cache: object = None  # the backend's per-sequence cache state
    cached_ids: list[int] = field(default_factory=list)  # tokens whose K/V are in the cache


class CachedDrafter(Drafter):
    """A drafter over a model with a KV cache; subclasses run the model and trim its cache."""

    max_length: int = 1 << 31
    stops_early = True

    def __init__(self):
        self._seqs: dict[int, CachedSequence] = {}

    @abstractmethod
    def _open(self, seq_id: int, prompt_ids: list[int]) -> object:
        """A new cache for the sequence (returned as CachedSequence.cache)."""

    @abstractmethod
    def _run(self, seq_id: int, seq: CachedSequence, new_ids: list[int]) -> torch.Tensor:
        """Run `new_ids` (>= 1) on top of the cache; float32 logits at the last one, [vocab]."""

    @abstractmethod
    def _truncate(self, seq_id: int, seq: CachedSequence, length: int) -> None:
        """Keep the cache's first `length` positions."""

    def _close(self, seq_id: int, seq: CachedSequence) -> None:
        """Release the sequence's cache."""

    # --- the Drafter interface -------------------------------------------------------------

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        if seq_id in self._seqs:
            raise InvalidRequestError(f"sequence {seq_id} is already open in the drafter")
        if not prompt_ids:
            raise InvalidRequestError("the drafter needs a non-empty prompt")
        # the cache opens at the first draft: a sequence the engine never drafts for costs nothing
        self._seqs[seq_id] = CachedSequence(committed_ids=list(prompt_ids))

    def propose(self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0,
                top_p: float = 1.0, generator: torch.Generator | None = None,
                min_confidence: float = 0.0) -> DraftProposal:
        request = DraftRequest(seq_id, k, temperature, top_k, top_p, generator, min_confidence)
        return self.propose_batch([request])[seq_id]

    def propose_batch(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        """Drafts for every request, position by position: each model call runs all the sequences
        still drafting (`_run_batch`), their catch-up tokens first."""
        if len({r.seq_id for r in requests}) != len(requests):
            raise InvalidRequestError("a sequence appears twice in one batched propose")
        drafting = []
        for r in requests:
            seq = self._seq(r.seq_id)
            if not seq.committed_ids:
                raise InvalidRequestError(f"sequence {r.seq_id} has no committed tokens to draft from")
            k = max(0, min(r.k, self.max_length - len(seq.committed_ids)))
            if k > 0:
                self._sync_cache(r.seq_id, seq)
                drafting.append(_Drafting(r, self._opened(r.seq_id, seq), k))
        feeds = self._catch_up([(d, d.seq.committed_ids[len(d.seq.cached_ids):]) for d in drafting])
        while feeds:
            items = [(d.request.seq_id, d.seq, new_ids) for d, new_ids in feeds]
            logits = self._run_batch(items)  # one [vocab] per item
            for (d, new_ids), row in zip(feeds, logits):
                d.seq.cached_ids.extend(new_ids)
                d.take(row)
            # the last draft's K/V is only needed if it is accepted: it is not run
            feeds = [(d, d.ids[-1:]) for d, _ in feeds if not d.done]
        proposals = {r.seq_id: DraftProposal(draft_ids=[]) for r in requests}
        proposals.update((d.request.seq_id, d.proposal()) for d in drafting)
        return proposals

    def _catch_up(self, feeds: list[tuple["_Drafting", list[int]]]) -> list[tuple["_Drafting", list[int]]]:
        """Run the committed tokens a sequence has not run (its prompt, the steps it sat out) in a chunk
        of their own, timed (`last_catch_up`): the newest token joins the step's first run. Two tokens
        (a full accept's last draft and bonus token) are ordinary drafting and stay together."""
        chunks = [(d.request.seq_id, d.seq, new_ids[:-1]) for d, new_ids in feeds if len(new_ids) > 2]
        self.last_catch_up = CatchUp(0.0, 0)
        if not chunks:
            return feeds
        t0 = time.perf_counter()
        self._run_batch(chunks)  # logits unused: the newest token's come with the first draft
        self.last_catch_up = CatchUp(time.perf_counter() - t0, sum(len(ids) for _, _, ids in chunks))
        for _, seq, ids in chunks:
            seq.cached_ids.extend(ids)
        return [(d, new_ids[-1:] if len(new_ids) > 2 else new_ids) for d, new_ids in feeds]

    def _run_batch(self, items: list[tuple[int, CachedSequence, list[int]]]) -> list[torch.Tensor]:
        """Run each item's new tokens on its cache; float32 logits at each item's last token.
        Backends that can run several sequences in one call override this."""
        return [self._run(seq_id, seq, new_ids) for seq_id, seq, new_ids in items]

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        seq = self._seq(seq_id)
        seq.committed_ids.extend(int(t) for t in token_ids)
        self._sync_cache(seq_id, seq)

    def rollback(self, seq_id: int, n: int) -> None:
        seq = self._seq(seq_id)
        if not 0 <= n <= len(seq.committed_ids):
            raise InvalidRequestError(
                f"cannot roll back {n} of {len(seq.committed_ids)} committed tokens of sequence {seq_id}")
        # the cache is cut lazily, at the next propose or extend: a rollback followed by the same
        # tokens again (a pre-draft's assumed tokens, then the verify's) keeps it
        del seq.committed_ids[len(seq.committed_ids) - n:]

    def finish(self, seq_id: int) -> None:
        seq = self._seqs.pop(seq_id, None)
        if seq is not None:
            self._close(seq_id, seq)

    # --- introspection used by tests and the engine ----------------------------------------

    def committed_ids(self, seq_id: int) -> list[int]:
        return list(self._seq(seq_id).committed_ids)

    def cached_length(self, seq_id: int) -> int:
        return len(self._seq(seq_id).cached_ids)

    # --- internals -----------------------------------------------------------------------------

    def _seq(self, seq_id: int) -> CachedSequence:
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise InvalidRequestError(f"sequence {seq_id} is not open in the drafter") from None

    def _opened(self, seq_id: int, seq: CachedSequence) -> CachedSequence:
        if seq.cache is None:
            seq.cache = self._open(seq_id, seq.committed_ids)
        return seq

    def _sync_cache(self, seq_id: int, seq: CachedSequence) -> None:
        """Cut the cache to its common prefix with the committed tokens, leaving >= 1 to run."""
        keep = 0
        limit = min(len(seq.cached_ids), len(seq.committed_ids) - 1)
        while keep < limit and seq.cached_ids[keep] == seq.committed_ids[keep]:
            keep += 1
        if keep < len(seq.cached_ids):
            del seq.cached_ids[keep:]
            self._truncate(seq_id, seq, keep)


class _Drafting:
    """One sequence's drafts as they are picked, position by position."""

    def __init__(self, request: DraftRequest, seq: CachedSequence, k: int):
        self.request, self.seq, self.k = request, seq, k
        self.ids: list[int] = []
        self.probs: list[torch.Tensor] = []
        self.confidence: list[float] = []
        self.joint = 1.0  # the drafter's probability of the whole draft so far
        self.done = False

    def take(self, logits: torch.Tensor) -> None:
        """Pick the next draft from the logits after the last token run; stop at k or at a doubt."""
        r = self.request
        if r.temperature > 0:
            probs = logits_to_probs(logits, r.temperature, r.top_k, r.top_p)  # [vocab]
            token = int(sample(probs, r.generator))
            p = float(probs[token])
        else:
            token = int(torch.argmax(logits))
            p = float(1.0 / torch.exp(logits - logits[token]).sum())  # softmax at the argmax
        # early stop: the drafter doubts the draft up to here; past the plan's k only a confident run goes on
        past_plan = r.planned is not None and len(self.ids) >= r.planned
        if self.joint * p < (max(r.min_confidence, r.stretch_confidence) if past_plan else r.min_confidence):
            self.done = True
            return
        self.joint *= p
        self.ids.append(token)
        self.confidence.append(p)
        if r.temperature > 0:
            self.probs.append(probs)
        self.done = len(self.ids) == self.k

    def proposal(self) -> DraftProposal:
        probs = torch.stack(self.probs) if self.probs else None  # [num_draft, vocab]
        return DraftProposal(draft_ids=self.ids, draft_probs=probs, confidence=self.confidence)
