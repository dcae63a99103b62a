"""Acceptance policies: which drafts a verify step keeps; names, options and their checks (the
judgements themselves, pure tensor functions, are in `orchestrator.engine.acceptance`).

Lossless (the output is the target's own):
    rejection          speculative sampling; at temperature 0 an exact match with the target's argmax
                       (the default)
    strict             token by token: a draft is kept while it equals the target's own token at its
                       position (the argmax at temperature 0, a sample from p above it)
Lossy (the output may differ from what the target alone would write; labelled lossy wherever a policy
is named: help, profile, stats, reports). They judge greedy requests (temperature 0):
    nkl                KL(q || p) / log(vocab) < delta at each position, p and q at `temperature`
                       (seed 000, 3.2; a greedy drafter's q is one-hot: KL = -log p(draft))
    position-adaptive  nkl with delta_pos = min(delta_max, delta * (1 + a * log2(pos + 1))), pos the
                       draft's index in the output (seed 000, 4.3)
    block              the exact prefix, or through the longest run of >= m drafts equal to the
                       target's argmax when that run ends later (seed 000, 3.3)
    typical            p(x) > min(epsilon, alpha * exp(-H(p))), p at `temperature` (Medusa)
    relaxed            x among the target's top_n and p(x) >= p(top1) - delta (TensorRT-LLM)

After a lossy policy's accepted drafts the step commits the target's own argmax, so every step still
makes progress. Each lossy policy takes `budget`: the share of the request's max_new_tokens that may be
tokens the target would not have chosen; once spent the request verifies losslessly for the rest.
"""

import math
from dataclasses import dataclass

from orchestrator.errors import InvalidRequestError

LOSSLESS = ("rejection", "strict")
# each lossy policy's options and their defaults; `budget` is common to all
OPTIONS: dict[str, dict[str, float]] = {
    "rejection": {},
    "strict": {},
    "nkl": {"delta": 0.15, "temperature": 0.6},
    "position-adaptive": {"delta": 0.15, "a": 0.08, "delta_max": 0.3, "temperature": 0.6},
    "block": {"m": 3},
    "typical": {"epsilon": 0.09, "alpha": 0.3, "temperature": 0.7},
    "relaxed": {"top_n": 4, "delta": 0.1},
}
DEFAULT_BUDGET = 0.05
POLICIES = tuple(OPTIONS)


@dataclass(frozen=True)
class AcceptancePolicy:
    """A policy by name with its options (every option present, defaults filled in)."""

    name: str = "rejection"
    options: tuple[tuple[str, float], ...] = ()

    @property
    def lossy(self) -> bool:
        return self.name not in LOSSLESS

    @property
    def label(self) -> str:
        """The name as reports print it: lossy policies say so."""
        return f"{self.name} (lossy)" if self.lossy else self.name

    def describe(self) -> str:
        """One line for `profile check` and reports."""
        if self.name == "rejection":
            return "rejection: greedy match at temperature 0, rejection sampling above (lossless)"
        if self.name == "strict":
            return "strict: the target's own token at each position (lossless)"
        options = ", ".join(f"{k}={v:g}" for k, v in self.options)
        return f"{self.name} ({options}): LOSSY, for greedy requests (sampled ones take rejection)"

    def option(self, key: str) -> float:
        return dict(self.options)[key]

    @property
    def budget(self) -> float:
        return self.option("budget") if self.lossy else 0.0

    @classmethod
    def parse(cls, name: str, options: dict[str, float] | None = None, field: str = "acceptance",
              options_field: str | None = None) -> "AcceptancePolicy":
        """Validate a name and options; errors name the option (`options_field.key`, by default
        `field.key`; just `key` when `options_field` is "") and what is allowed."""
        if name not in OPTIONS:
            raise InvalidRequestError(f"{field}: unknown acceptance policy {name!r}; allowed: {', '.join(POLICIES)} "
                              f"(lossy: {', '.join(p for p in POLICIES if p not in LOSSLESS)})", field)
        allowed = dict(OPTIONS[name])
        if name not in LOSSLESS:
            allowed["budget"] = DEFAULT_BUDGET
        given = dict(options or {})
        prefix = field if options_field is None else options_field
        for key, value in given.items():
            where = f"{prefix}.{key}" if prefix else key
            if key not in allowed:
                known = ", ".join(allowed) or "none"
                raise InvalidRequestError(f"{where}: policy {name!r} has no option {key!r}; its options: {known}", where)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidRequestError(f"{where}: must be a finite number, got {value!r}", where)
            _check_range(name, key, float(value), where)
        return cls(name, tuple(sorted({**allowed, **{k: float(v) for k, v in given.items()}}.items())))


def _check_range(name: str, key: str, value: float, where: str) -> None:
    if key in ("m", "top_n"):
        ok, want = value >= 1 and value == int(value), "a whole number >= 1"
    elif key == "temperature":
        ok, want = value > 0, "> 0"
    elif key in ("budget", "delta", "delta_max", "epsilon", "alpha"):
        ok, want = 0 <= value <= 1, "in [0, 1]"
    else:  # a
        ok, want = value >= 0, ">= 0"
    if not ok:
        raise InvalidRequestError(f"{where}: must be {want}, got {value:g}", where)


def parse_option_pairs(pairs: list[str], field: str = "--acceptance-option") -> dict[str, float]:
    """`key=value` strings (the CLI's) -> a dict of numbers; errors name the pair."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        try:
            if not sep or not key:
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise InvalidRequestError(f"{field}: expected key=number, got {pair!r}", field) from None
    return out
