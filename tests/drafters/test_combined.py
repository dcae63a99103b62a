"""Several drafters at once on the real SmolLM2-135M: the n-gram lookup and the INT4 model combined by
confidence. Greedy output stays the target's; each drafter serves the sequences it is expected to
serve best, judged from its own measured acceptance."""

import pytest

from orchestrator.config import SamplingParams
from orchestrator.drafters.combined import CombinedDrafter
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.engine import DraftRequest, Engine
from orchestrator.models import TargetRunner, eos_token_ids

from prompts import GROUNDED, PROMPTS


@pytest.fixture(scope="module")
def target(smollm2):
    return TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)



def _run(target, tokenizer, ckpt, drafter, prompts, k=4):
    engine = Engine(target, tokenizer, drafter, num_speculative_tokens=k, eos_token_ids=eos_token_ids(ckpt, tokenizer))
    ids = [engine.add_request(tokenizer(p).input_ids, SamplingParams(max_new_tokens=48, ignore_eos=True))
           for p in prompts]
    while engine.has_work():
        engine.step()
    return [engine.release(i) for i in ids]


def test_combined_lookup_and_model_is_lossless_and_both_serve(target, smollm2, smollm2_tokenizer, onnx_drafter):
    """A mixed batch (grounded text the lookup can copy, open-ended prompts it cannot): the output is
    target-only's token for token; the lookup serves some sequence-steps and the model others; the
    lookup's measured acceptance on what it served is above the model's prior."""
    prompts = [GROUNDED, PROMPTS[0], GROUNDED, PROMPTS[4]]
    reference = [s.output_ids for s in _run(target, smollm2_tokenizer, smollm2, None, prompts, k=0)]
    combined = CombinedDrafter([NgramDrafter(), onnx_drafter])
    seqs = _run(target, smollm2_tokenizer, smollm2, combined, prompts)
    assert [s.output_ids for s in seqs] == reference
    assert combined.chosen[0] > 0 and combined.chosen[1] > 0, combined.chosen
    assert combined.acceptance[0].drafted and combined.acceptance[1].drafted
    assert combined.name == f"ngram+{onnx_drafter.name}"
    # the model drafter runs its own prefill at its first draft: the cost model charges the prompt
    assert not combined.opens_caught_up and CombinedDrafter([NgramDrafter(), NgramDrafter(2)]).opens_caught_up
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_a_drafter_that_never_matches_leaves_every_sequence_to_the_next(target, smollm2, smollm2_tokenizer,
                                                                       onnx_drafter):
    """An n-gram lookup that needs 64-token matches proposes nothing on short prompts: every draft
    comes from the model, and the output is still the target's."""
    prompts = [PROMPTS[1], PROMPTS[2]]
    reference = [s.output_ids for s in _run(target, smollm2_tokenizer, smollm2, None, prompts, k=0)]
    combined = CombinedDrafter([NgramDrafter(max_ngram=64, min_ngram=64), onnx_drafter])
    seqs = _run(target, smollm2_tokenizer, smollm2, combined, prompts)
    assert [s.output_ids for s in seqs] == reference
    assert combined.chosen[0] == 0 and combined.chosen[1] > 0


def test_a_combined_drafter_needs_two():
    with pytest.raises(ValueError, match="at least two"):
        CombinedDrafter([NgramDrafter()])


def _measured(combined: CombinedDrafter, i: int, seconds_per_position: float) -> None:
    for _ in range(3):
        combined.cost[i].add(seconds_per_position)


def test_each_drafter_drafts_the_k_with_the_most_tokens_per_second():
    """Hand-computed: unmeasured acceptance is the prior 0.5 per position, so a draft of n expects
    1 + (1 - 0.5^n) committed tokens; at a 0.1 s forward and 0.01 s per drafted position the rates are
    n=1 1.5/0.11 = 13.64, n=2 1.75/0.12 = 14.58, n=3 1.875/0.13 = 14.42, n=4 1.9375/0.14 = 13.84 tok/s:
    k = 2. A drafter that costs nothing drafts the engine's full k. Until every drafter is measured
    (3 calls each) and the step time is known, each drafts the full k and they compare expected
    accepted lengths."""
    combined = CombinedDrafter([NgramDrafter(), NgramDrafter()])
    _measured(combined, 1, 0.01)
    assert combined.best(1, 4, 0, 0.1) == (4, pytest.approx(0.9375))  # the lookup is not measured yet
    _measured(combined, 0, 0.0)
    k, rate = combined.best(1, 4, 0, 0.1)
    assert k == 2 and rate == pytest.approx(1.75 / 0.12)
    assert combined.best(1, 4, 0, 0.0) == (4, pytest.approx(0.9375))  # no step time yet
    assert combined.best(0, 4, 0, 0.1) == (4, pytest.approx(1.9375 / 0.1))
    # the lookup's draft of 4 (1.9375 / 0.1 s = 19.4 tok/s) beats the second drafter's best (14.6): kept
    combined.start(0, [7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9])
    proposal = combined.propose_batch([DraftRequest(0, 4, step_s=0.1)])[0]
    assert proposal.draft_ids == [1, 2, 3, 4] and combined.chosen == [1, 0]
