"""The torch target against Hugging Face transformers, and KV-cache mechanics."""

import pytest
import torch

from orchestrator.models import TargetRunner

from conftest import tiny_checkpoint
from prompts import CODE, PROMPTS

PROMPT = "The quick brown fox jumps over the lazy dog. Then it ran into the forest and"


def _full_logits(runner, seq_id, ids):
    return runner.forward([(seq_id, ids, len(ids))])[0].logits


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3"])
def test_tiny_model_matches_transformers_including_sliding_window(tmp_path, family):
    ckpt, hf = tiny_checkpoint(tmp_path, family)
    ids = torch.randint(0, 97, (1, 23), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    runner = TargetRunner(ckpt, block_size=4, max_kv_tokens=64)
    # prompt in one forward, then 2 tokens, then single tokens: all paths of the mask
    chunks = [ids[0, :15], ids[0, 15:17], *ids[0, 17:].split(1)]
    mine = torch.cat([_full_logits(runner, 0, c.tolist()) for c in chunks])
    torch.testing.assert_close(mine, ref, atol=1e-4, rtol=1e-4)


def test_batched_forward_equals_separate_forwards(tmp_path):
    ckpt, _ = tiny_checkpoint(tmp_path)
    a, b = list(range(5, 18)), list(range(40, 47))
    solo = TargetRunner(ckpt, block_size=4, max_kv_tokens=128)
    ref_a = _full_logits(solo, 0, a)
    ref_b = _full_logits(solo, 1, b)
    both = TargetRunner(ckpt, block_size=4, max_kv_tokens=128)
    out = both.forward([(0, a, len(a)), (1, b, len(b))])
    torch.testing.assert_close(out[0].logits, ref_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[1].logits, ref_b, atol=1e-5, rtol=1e-5)


def test_rollback_then_reextend_equals_fresh_run(tmp_path):
    ckpt, _ = tiny_checkpoint(tmp_path)
    runner = TargetRunner(ckpt, block_size=4, max_kv_tokens=128)
    prefix, wrong, right = list(range(3, 14)), [90, 91, 92, 93, 94, 95], [50, 51]
    _full_logits(runner, 0, prefix)
    _full_logits(runner, 0, wrong)
    free_before = runner.pool.num_free_blocks
    runner.rollback(0, len(prefix))
    assert runner.pool.num_free_blocks > free_before  # blocks past the prefix returned
    again = _full_logits(runner, 0, right)
    fresh = TargetRunner(ckpt, block_size=4, max_kv_tokens=128)
    expected = _full_logits(fresh, 0, prefix + right)[-len(right):]
    torch.testing.assert_close(again, expected, atol=1e-5, rtol=1e-5)
    runner.free(0)
    assert runner.pool.num_free_blocks == runner.pool.num_blocks


def test_hidden_states_come_back_on_request(tmp_path):
    ckpt, _ = tiny_checkpoint(tmp_path)
    runner = TargetRunner(ckpt, block_size=4, max_kv_tokens=64)
    out = runner.forward([(0, [1, 2, 3, 4], 2)], return_hidden=True)[0]
    assert out.hidden.shape == (4, 32) and out.logits.shape == (2, 97)
    torch.testing.assert_close(runner.model.logits(out.hidden[-2:]), out.logits)  # the scored rows' states


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_real_model_matches_transformers_and_cached_decode_equals_recompute(model, request):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt = request.getfixturevalue(model)
    tok = AutoTokenizer.from_pretrained(ckpt.hf_dir)
    ids = tok(PROMPT, return_tensors="pt").input_ids
    hf = AutoModelForCausalLM.from_pretrained(ckpt.hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(ids).logits[0]
    del hf
    runner = TargetRunner(ckpt, block_size=16, max_kv_tokens=256)
    n = ids.shape[1]
    full = _full_logits(runner, 0, ids[0].tolist())
    torch.testing.assert_close(full, ref, atol=2e-3, rtol=1e-3)
    # cached decode, one token at a time, equals the full recompute
    _full_logits(runner, 1, ids[0, : n - 4].tolist())
    steps = torch.cat([_full_logits(runner, 1, [int(t)]) for t in ids[0, n - 4:]])
    torch.testing.assert_close(steps, full[-4:], atol=2e-4, rtol=1e-4)
    assert torch.equal(steps.argmax(-1), ref[-4:].argmax(-1))


def _greedy_then_teacher_forced(ckpt, num_prompts: int, num_tokens: int) -> list[tuple[int, int]]:
    """Our target-only greedy tokens for `num_prompts` prompts (one batch), then HF over prompt +
    output in one forward: per prompt, (positions where ours is HF's argmax or within 1e-3 of its
    top logit, positions)."""
    from transformers import AutoModelForCausalLM

    from orchestrator.config import SamplingParams
    from orchestrator.engine import Engine
    from orchestrator.models import encode_prompt, load_tokenizer

    tokenizer = load_tokenizer(ckpt)
    runner = TargetRunner(ckpt, block_size=16, max_kv_tokens=4096)
    engine = Engine(runner, tokenizer, None, max_num_seqs=num_prompts)
    prompts = [encode_prompt(tokenizer, p, chat=True) for p in (PROMPTS + CODE)[:num_prompts]]
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=num_tokens, ignore_eos=True)) for p in prompts]
    while engine.has_work():
        engine.step()
    outputs = [engine.release(i).output_ids for i in ids]
    del engine, runner
    hf = AutoModelForCausalLM.from_pretrained(ckpt.hf_dir, dtype=torch.float32).eval()
    found = []
    for prompt, out in zip(prompts, outputs):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + out])).logits[0, len(prompt) - 1:-1]  # [num_tokens, vocab]
        mine = logits.gather(1, torch.tensor(out)[:, None]).squeeze(1)
        found.append((int((mine >= logits.max(-1).values - 1e-3).sum()), len(out)))
    return found


@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen05"])
def test_greedy_tokens_are_hf_argmax_teacher_forced(model, request):
    """Against a reference nobody here wrote: 5 prompts x 128 greedy tokens in fp32, every one HF's choice."""
    found = _greedy_then_teacher_forced(request.getfixturevalue(model), num_prompts=5, num_tokens=128)
    assert found == [(128, 128)] * 5


@pytest.mark.slow
def test_qwen_1_5b_greedy_tokens_are_hf_argmax_teacher_forced(qwen15):
    assert _greedy_then_teacher_forced(qwen15, num_prompts=5, num_tokens=128) == [(128, 128)] * 5


@pytest.mark.parametrize("model", ["smollm2", "gemma3", "qwen05"])
def test_float32_logits_are_bit_identical_alone_verified_or_batched(model, request):
    """What makes greedy speculation exactly lossless in fp32: a token's logits do not depend on how
    many tokens share its forward (decoded alone, verified among k + 1, batched with a prefill)."""
    runner = TargetRunner(request.getfixturevalue(model), block_size=16, max_kv_tokens=1024)
    prompt, new = list(range(1000, 1050)), [1200, 1300, 1400, 1500, 1600]
    runner.forward([(0, prompt, 1)])
    alone = torch.cat([runner.forward([(0, [t], 1)])[0].logits for t in new])  # [5, vocab]
    runner.rollback(0, len(prompt))
    verified = runner.forward([(0, new, len(new))])[0].logits
    runner.rollback(0, len(prompt))
    batched = runner.forward([(1, list(range(2000, 2030)), 1), (0, new, len(new))])[1].logits
    assert torch.equal(alone, verified) and torch.equal(alone, batched)
