"""The drafter interface the engine talks to; local and remote drafters look the same."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass
class DraftProposal:
    """Draft tokens for one sequence.

    `draft_ids` may be shorter than the k asked for (an n-gram drafter that finds no match
    proposes nothing). `draft_probs` is the drafter's distribution q at each draft position,
    already under the request's sampling transform, or None for a greedy (one-hot) drafter.
    """

    draft_ids: list[int]  # [num_draft]
    draft_probs: torch.Tensor | None = None  # [num_draft, vocab] float32, rows sum to 1
    # the drafter's own probability of each draft token (None: a drafter without a model, n-gram)
    confidence: list[float] | None = None  # [num_draft]
    # True when the drafter could not be asked (a remote drafter that is down): the step
    # runs target-only and the request's stats count it
    unavailable: bool = False


@dataclass
class DraftRequest:
    """One sequence's entry in a batched propose."""

    seq_id: int
    k: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    generator: torch.Generator | None = None
    # stop drafting once the drafter's own probability of the whole draft so far (the product of its
    # probabilities of the draft tokens) is below this (confidence early stop; drafters without a model
    # ignore it)
    min_confidence: float = 0.0
    # the cost model's k when `k` is larger: drafts past it are taken only while that probability stays
    # >= `stretch_confidence` (a confident run drafts on; drafters that `stops_early` honour it)
    planned: int | None = None
    stretch_confidence: float = 1.0
    # the target's expected seconds for this step's forward (0: not measured yet), for drafters that
    # weigh their own cost against it (several drafters combined)
    step_s: float = 0.0


class CatchUp(NamedTuple):
    """What a propose spent running committed tokens it had not run, apart from its drafts: the cost
    model then needs not disentangle catch-up from drafting in the call's time."""
    seconds: float
    tokens: int


@dataclass(frozen=True)
class DrafterStatus:
    """What a server's status call reports about the drafter."""

    state: str = "in-process"  # in-process | connected | connecting | unavailable
    num_reconnects: int = 0


class Drafter(ABC):
    """Proposes tokens for sequences whose committed tokens it is told about.

    The drafter owns its own state (KV cache, n-gram index). The contract:
    `start(seq_id, prompt_ids)` opens a sequence; `propose(seq_id, k, ...)` returns up to k
    draft tokens continuing the committed tokens (it may advance internal caches over its own
    drafts); `extend(seq_id, token_ids)` appends committed tokens (accepted drafts followed by
    the recovered or bonus token), after which the drafter must discard whatever it had cached
    past the longest common prefix; `rollback(seq_id, n)` removes the last n committed tokens;
    `finish(seq_id)` frees everything for the sequence.
    """

    name: str = "drafter"  # labels its trace track and stats
    device: str = "cpu"  # where it computes (its trace track); host-side drafters say "cpu"
    # True when one model run drafts a position for every sequence of a step (its cost grows with the
    # longest draft, not with the number of sequences): the cost model's prior until batches are measured
    batched: bool = False
    # False where `propose_ahead` cannot draft beyond the committed tokens without disturbing the
    # drafter's state (its statistics judge what it is told as committed): no overlapped drafting
    overlaps: bool = True
    # True where the drafter reads the target's last-layer hidden states (an MTP drafter): the engine
    # hands it those of every newly committed position as a HIDDEN_STATE block (`accept_hidden`)
    reads_hidden: bool = False
    # True where `propose_batch` applies `DraftRequest.min_confidence` and `planned` / `stretch_confidence`
    # (a model drafter in this process): the engine may then ask for more than the plan's k
    stops_early: bool = False
    # True where a sequence's first draft finds every committed token but the newest in the drafter (KV
    # handoff of the target's K/V at that draft, an n-gram index): the cost model charges it no catch-up
    opens_caught_up: bool = False
    # True where the drafter's model runs on torch on the CPU: a server then runs it on the thread that
    # loaded it (a second thread with an OpenMP team of its own slowed it 1.5x: server/one_thread.py)
    torch_on_cpu: bool = False
    # the last `propose_batch`'s catch-up runs, timed apart; None where the drafter cannot tell (its cost
    # model then fits catch-up tokens and drafts together from the calls' times)
    last_catch_up: CatchUp | None = None

    @abstractmethod
    def start(self, seq_id: int, prompt_ids: list[int]) -> None: ...

    @abstractmethod
    def propose(
        self, seq_id: int, k: int, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
        generator: torch.Generator | None = None, min_confidence: float = 0.0,
    ) -> DraftProposal: ...

    def propose_batch(self, requests: list[DraftRequest]) -> dict[int, DraftProposal]:
        """Drafts for several sequences in one call (one engine step). Local drafters run
        them one by one; a remote drafter sends them as one frame."""
        return {r.seq_id: self.propose(r.seq_id, r.k, r.temperature, r.top_k, r.top_p, r.generator,
                                       r.min_confidence) for r in requests}

    def prepare(self, seq_ids: list[int]) -> None:
        """Called before a step's drafting with the sequences about to draft: a drafter that opens them
        lazily (KV handoff at the first draft) moves their state here, traced apart from the drafting."""

    def propose_ahead(self, requests: list[DraftRequest], assumed: dict[int, list[int]]) -> dict[int, DraftProposal]:
        """Drafts continuing each sequence's committed tokens followed by `assumed[seq_id]` (tokens not
        committed yet: this step's drafts, while the target verifies them), leaving the committed tokens
        as they were. Drafters whose cache survives a rollback keep the work for the next step."""
        for seq_id, ids in assumed.items():
            if ids:
                self.extend(seq_id, ids)
        try:
            return self.propose_batch(requests)
        finally:
            for seq_id, ids in assumed.items():
                if ids:
                    self.rollback(seq_id, len(ids))

    @abstractmethod
    def extend(self, seq_id: int, token_ids: list[int]) -> None: ...

    @abstractmethod
    def rollback(self, seq_id: int, n: int) -> None: ...

    def accept_hidden(self, seq_id: int, block) -> None:
        """The target's hidden states of committed positions [start, end) as a protocol Block (HIDDEN_STATE,
        LAYOUT_TOKENS_HIDDEN), given after the `extend` that committed them; `end` is the committed length
        less one (the newest token has no state yet). Only drafters with `reads_hidden` are given any."""
        raise NotImplementedError(f"drafter {self.name} does not read hidden states")

    @abstractmethod
    def finish(self, seq_id: int) -> None: ...

    def status(self) -> DrafterStatus:
        return DrafterStatus()

    def close(self) -> None:
        """Release process-wide resources (sessions, sockets)."""
