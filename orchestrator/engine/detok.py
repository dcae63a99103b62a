"""Incremental detokenization with stop strings, safe across UTF-8 token boundaries."""


class TextStream:
    """Turns a growing list of token ids into text deltas.

    A delta is held back while the decoded text ends in U+FFFD (a multi-byte character
    split across tokens). Stop strings end the text just before the first match.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.emitted = ""

    def update(self, token_ids: list[int], final: bool = False) -> tuple[str, bool]:
        """-> (new text to emit, whether a stop string was hit)."""
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        hit = self._first_stop(text)
        if hit is not None:
            text, final = text[:hit], True
        elif not final and text.endswith("\ufffd"):
            return "", False
        if not text.startswith(self.emitted):  # a retokenisation changed earlier text: emit nothing new
            return "", hit is not None
        delta = text[len(self.emitted):]
        self.emitted = text
        return delta, hit is not None

    def _first_stop(self, text: str) -> int | None:
        start = max(0, len(self.emitted) - max((len(s) for s in self.stop), default=0))
        hits = [i for s in self.stop if (i := text.find(s, start)) >= 0]
        return min(hits) if hits else None
