"""Several drafters at once on the real SmolLM2-135M: the n-gram lookup and the INT4 model combined by
confidence. Greedy output stays the target's; each drafter serves the sequences it is expected to
serve best, judged from its own measured acceptance."""

import pytest

from orchestrator.config import SamplingParams
from orchestrator.drafters.combined import CombinedDrafter
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.engine import Engine
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
