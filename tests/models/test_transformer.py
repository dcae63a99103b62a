"""The torch target against Hugging Face transformers, and KV-cache mechanics."""

import pytest
import torch

from orchestrator.models import TargetRunner

from conftest import tiny_checkpoint

PROMPT = "The quick brown fox jumps over the lazy dog. Then it ran into the forest and"


def _full_logits(runner, seq_id, ids):
    return runner.forward([(seq_id, ids, len(ids))])[0].logits


@pytest.mark.parametrize("family", ["llama", "gemma3"])
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
    assert out.hidden.shape == (2, 32) and out.logits.shape == (2, 97)


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
