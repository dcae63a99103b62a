"""Per-request state: committed tokens, streamed text, speculation statistics."""

import enum
import time
from dataclasses import dataclass, field

import torch

from orchestrator.acceptance_policy import AcceptancePolicy
from orchestrator.config import SamplingParams
from orchestrator.engine.measured import Acceptance


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class SpecStats:
    """Speculation statistics of one request."""

    num_steps: int = 0  # target forwards after the prefill
    num_drafted: int = 0
    num_accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    num_committed: int = 0  # tokens committed by verify steps (accepted + recovered/bonus)
    time_prefill_s: float = 0.0
    time_draft_s: float = 0.0
    time_verify_s: float = 0.0
    num_fallback_steps: int = 0  # steps run target-only because the drafter was unavailable
    steps_predrafted: int = 0  # steps whose drafts were drafted while the target verified the step before
    steps_per_k: dict[int, int] = field(default_factory=dict)  # chosen k -> verify steps with it (0 included)
    steps_stretched: int = 0  # steps whose confident drafts ran on past the chosen k
    expected_committed: float = 0.0  # what the k policy's model expected these steps to commit
    acceptance: str = "rejection"  # the acceptance policy that verified
    lossy: bool = False
    tokens_differing: int = 0  # committed tokens the target would not have chosen
    prob_gap: float = 0.0  # sum over them of p(target's argmax) - p(committed token)
    budget_exhausted_at: int = -1  # output index from which the quality budget forced lossless

    def record(self, num_draft: int, num_accepted: int, num_committed: int) -> None:
        grow = num_draft - len(self.drafted_per_position)
        if grow > 0:
            self.drafted_per_position += [0] * grow
            self.accepted_per_position += [0] * grow
        for j in range(num_draft):
            self.drafted_per_position[j] += 1
            self.accepted_per_position[j] += j < num_accepted
        self.num_steps += 1
        self.num_drafted += num_draft
        self.num_accepted += num_accepted
        self.num_committed += num_committed

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verify step (accepted drafts + the recovered/bonus token)."""
        return self.num_committed / self.num_steps if self.num_steps else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def to_dict(self) -> dict:
        return {
            "num_steps": self.num_steps,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "acceptance_rate": self.num_accepted / self.num_drafted if self.num_drafted else 0.0,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_per_position": self.acceptance_per_position,
            "drafted_per_position": self.drafted_per_position,
            "time_prefill_s": self.time_prefill_s,
            "time_draft_s": self.time_draft_s,
            "time_verify_s": self.time_verify_s,
            "num_fallback_steps": self.num_fallback_steps,
            "steps_predrafted": self.steps_predrafted,
            "steps_per_k": {str(k): n for k, n in sorted(self.steps_per_k.items())},
            "expected_committed": self.expected_committed,
            "acceptance": self.acceptance,
            "lossy": self.lossy,
            "tokens_differing": self.tokens_differing,
            "drift_prob_gap": self.prob_gap / self.num_committed if self.num_committed else 0.0,
            "budget_exhausted_at": self.budget_exhausted_at,
        }


@dataclass
class Sequence:
    seq_id: int
    prompt_ids: list[int]
    params: SamplingParams
    k: int  # maximum draft length for this request (0 = target only)
    draft_len: int = 0  # draft length for the next step under the adaptive policy
    acceptance: Acceptance = field(default_factory=Acceptance)  # per draft position, for the cost model
    drafter_lag: int = 0  # committed tokens its drafter has not run yet (0 until it first drafts)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # text emitted so far
    status: Status = Status.WAITING
    num_preemptions: int = 0
    finish_reason: str | None = None
    stats: SpecStats = field(default_factory=SpecStats)
    generator: torch.Generator | None = None
    policy: AcceptancePolicy = field(default_factory=AcceptancePolicy)  # how its drafts are verified
    arrival_s: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    finish_s: float | None = None

    @property
    def prefilled(self) -> bool:
        return bool(self.output_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def ids_from(self, start: int) -> list[int]:
        """Committed tokens (prompt then output) from position `start` on, without copying all."""
        n = len(self.prompt_ids)
        if start >= n:
            return self.output_ids[start - n:]
        return self.prompt_ids[start:] + self.output_ids

    @property
    def remaining(self) -> int:
        return self.params.max_new_tokens - len(self.output_ids)

    def result(self, drafter: str) -> dict:
        """The request's outcome as `hetspec generate --json` prints it (and the gRPC final message carries)."""
        elapsed = (self.finish_s or self.arrival_s) - self.arrival_s
        stats = self.stats.to_dict()
        stats["tokens_per_s"] = len(self.output_ids) / elapsed if elapsed > 0 else 0.0
        stats["ttft_s"] = (self.first_token_s or self.arrival_s) - self.arrival_s
        stats["drafter"] = drafter
        stats["k"] = self.k if drafter != "none" else 0
        stats["num_preemptions"] = self.num_preemptions
        return {
            "text": self.text,
            "token_ids": list(self.output_ids),
            "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": len(self.prompt_ids), "completion_tokens": len(self.output_ids)},
            "stats": stats,
        }
