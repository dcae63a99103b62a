"""The speculative decoding engine: one step reads schedule -> propose -> verify -> commit -> emit.

    engine = Engine(target, tokenizer, drafter, num_speculative_tokens=4, eos_token_ids=eos)
    seq = engine.generate(prompt_ids, SamplingParams(max_new_tokens=64))
    # or, serving: engine.add_request(...); while engine.has_work(): outputs = engine.step()

Rooms: `engine` (the step), `scheduler` (admission and preemption), `sequence` (per-request
state and stats), `drafter` (the interface every drafter implements), `verify` and `sampling`
(pure tensor functions), `speculation` (k per sequence and step: the cost model, fixed rules)
over `measured` (acceptance, verify and draft costs), `preemption` and `swap` (K/V to host or
recomputed), `detok`
(incremental text with stop strings). The engine knows the target runner (`orchestrator.models`)
and the block protocol (for swapping); it knows no drafter kind, no profile and no service.
"""

from orchestrator.engine.drafter import CatchUp, Drafter, DrafterStatus, DraftProposal, DraftRequest
from orchestrator.engine.engine import Engine, StepOutput
from orchestrator.engine.sequence import Sequence, SpecStats, Status

__all__ = ["CatchUp", "Drafter", "DraftProposal", "DraftRequest", "DrafterStatus", "Engine", "Sequence", "SpecStats", "Status",
           "StepOutput"]
