"""Model-free drafter: prompt lookup over the sequence's own tokens (n-gram matching)."""

from orchestrator.engine import CatchUp, Drafter, DraftProposal


class NgramDrafter(Drafter):
    """Finds the latest earlier occurrence of the last n tokens and proposes what followed.

    Tries n from `max_ngram` down to `min_ngram`; proposes nothing when no n-gram matches.
    Greedy by construction (q is one-hot), so `draft_probs` is None.
    """

    name = "ngram"
    last_catch_up = CatchUp(0.0, 0)  # no model: nothing to catch up when drafting
    opens_caught_up = True  # it indexes every committed token as it is told

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._tokens: dict[int, list[int]] = {}

    def start(self, seq_id: int, prompt_ids: list[int]) -> None:
        self._tokens[seq_id] = list(prompt_ids)

    def propose(self, seq_id, k, temperature=0.0, top_k=0, top_p=1.0, generator=None,
                min_confidence=0.0) -> DraftProposal:
        tokens = self._tokens[seq_id]
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            start = _find_last(tokens, tokens[-n:], before=len(tokens) - n)
            if start is not None:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return DraftProposal(draft_ids=follow)
        return DraftProposal(draft_ids=[])

    def extend(self, seq_id: int, token_ids: list[int]) -> None:
        self._tokens[seq_id].extend(token_ids)

    def rollback(self, seq_id: int, n: int) -> None:
        if n:
            del self._tokens[seq_id][-n:]

    def finish(self, seq_id: int) -> None:
        self._tokens.pop(seq_id, None)


def _find_last(tokens: list[int], pattern: list[int], before: int) -> int | None:
    """Start of the last occurrence of `pattern` beginning before index `before`."""
    n = len(pattern)
    first = pattern[0]
    for i in range(before - 1, -1, -1):
        if tokens[i] == first and tokens[i:i + n] == pattern:
            return i
    return None
