"""The pre-drafter's bookkeeping on a real n-gram drafter: what counts as a hit, what the drafter
is left with, and a drafter that cannot draft ahead being refused."""

import pytest

from orchestrator.config import CombinedDrafterConfig, EngineConfig, NgramDrafterConfig, OnnxDrafterConfig
from orchestrator.drafters.combined import CombinedDrafter
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.engine.drafter import DraftRequest
from orchestrator.engine.overlap import PreDrafter
from orchestrator.errors import InvalidRequestError
from orchestrator.tracing import Tracer, Track

# a lookup continues "1 2 3 4 5 6 7" after "... 1 2"
PROMPT = [1, 2, 3, 4, 5, 6, 7, 9, 1, 2]


def launched(assumed: list[int], k: int = 3):
    drafter = NgramDrafter()
    drafter.start(0, PROMPT)
    ahead = PreDrafter(drafter, Tracer(), Track("cpu", "drafter (ngram)"))
    ahead.launch([DraftRequest(0, k)], {0: len(PROMPT)}, {0: assumed}, step=0)
    ahead.wait()
    return drafter, ahead


@pytest.mark.parametrize("committed, expected", [
    ([3, 4, 5], [6, 7]),  # drafts 3, 4 accepted, the target's next token 5 is the guess: hit
    ([3, 4, 5, 6], [7]),  # (a lossy policy may commit further into what the worker drafted)
    ([3, 8], None),  # a draft rejected: miss
    ([3, 4, 8], None),  # all accepted, the target's next token is not the guess: miss
])
def test_a_predraft_is_used_only_when_the_commits_are_a_prefix_of_what_it_assumed(committed, expected):
    drafter, ahead = launched([3, 4])
    # the worker drafted from PROMPT + [3, 4] and left the drafter's committed tokens as they were
    assert drafter._tokens[0] == PROMPT
    line = PROMPT + committed
    proposal = ahead.take(0, lambda start: line[start:])
    assert (proposal.draft_ids if proposal is not None else None) == expected
    assert (ahead.stats.hits, ahead.stats.misses) == ((1, 0) if expected else (0, 1))
    assert ahead.take(0, lambda start: line[start:]) is None  # taken once
    ahead.tracer.flush()
    spans = [s for s in ahead.tracer.spans if s.name == "draft"]
    assert len(spans) == 1 and spans[0].args["ahead"] is True
    ahead.close()


def test_a_new_launch_drops_predrafts_of_sequences_that_sat_a_step_out():
    drafter, ahead = launched([3, 4])
    ahead.launch([], {}, {}, step=1)
    line = PROMPT + [3, 4, 5]
    assert ahead.take(0, lambda start: line[start:]) is None
    ahead.close()


def test_drafters_that_cannot_draft_ahead_are_refused():
    assert CombinedDrafter([NgramDrafter(), NgramDrafter()]).overlaps is False
    config = EngineConfig(overlap=True, drafter=CombinedDrafterConfig((NgramDrafterConfig(), OnnxDrafterConfig())))
    with pytest.raises(InvalidRequestError, match="overlap needs a single drafter"):
        config.validate()
