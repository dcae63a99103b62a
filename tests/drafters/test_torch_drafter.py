"""The torch drafter: SmolLM2 drafting for itself in fp32 is accepted in full and changes nothing."""

import itertools
import operator

import pytest
import torch

from orchestrator.assemble import build_engine
from orchestrator.config import EngineConfig, SamplingParams, TorchDrafterConfig
from orchestrator.drafters.torch_drafter import TorchDrafter
from orchestrator.engine import DraftRequest

from conftest import draft_rounds, tiny_checkpoint
from prompts import PROMPTS

NUM_TOKENS = 32


def test_self_drafting_is_fully_accepted_and_lossless(smollm2_tokenizer):
    base = EngineConfig(max_kv_tokens=2048)
    plain = build_engine(EngineConfig(max_kv_tokens=2048, drafter=None), progress=False)
    # fixed k: the drafter is the target itself, as dear as a verify, so `auto` rightly drafts nothing
    spec = build_engine(EngineConfig(max_kv_tokens=2048, drafter=TorchDrafterConfig(), k_policy="fixed"),
                        progress=False)
    assert spec.drafter.runner.dtype == torch.float32 and spec.k == base.num_speculative_tokens
    params = SamplingParams(max_new_tokens=NUM_TOKENS, ignore_eos=True)
    for prompt in PROMPTS[:3]:
        ids = smollm2_tokenizer(prompt).input_ids
        expected = plain.generate(ids, params).output_ids
        seq = spec.generate(ids, params)
        assert seq.output_ids == expected, prompt
        assert seq.stats.num_drafted > 0 and seq.stats.to_dict()["acceptance_rate"] >= 0.95, seq.stats.to_dict()
    assert spec.target.pool.num_free_blocks == spec.target.pool.num_blocks
    assert spec.drafter.runner.pool.num_free_blocks == spec.drafter.runner.pool.num_blocks


def _drafter(tmp_path, device="cpu"):
    ckpt, _ = tiny_checkpoint(tmp_path)
    return TorchDrafter(ckpt, device=device, max_kv_tokens=256, block_size=4)


def test_rollback_and_extend_equal_a_fresh_drafter(tmp_path):
    drafter, fresh = _drafter(tmp_path), _drafter(tmp_path)
    prompt = [5, 9, 12, 40, 7, 3]
    drafter.start(0, prompt)
    drafts = drafter.propose(0, 4).draft_ids
    assert len(drafts) == 4 and drafter.cached_length(0) == len(prompt) + 3  # ran its own drafts
    drafter.extend(0, drafts[:2] + [(drafts[2] + 1) % 97])  # two accepted, one recovered
    assert drafter.cached_length(0) == len(prompt) + 2  # cut back to the common prefix
    drafter.rollback(0, 2)
    committed = prompt + drafts[:1]
    fresh.start(0, committed)
    assert drafter.propose(0, 5).draft_ids == fresh.propose(0, 5).draft_ids
    drafter.finish(0)
    assert drafter.runner.pool.num_free_blocks == drafter.runner.pool.num_blocks


def test_sampled_drafts_carry_their_distribution(tmp_path):
    drafter = _drafter(tmp_path)
    drafter.start(1, [1, 2, 3])
    proposal = drafter.propose(1, 3, temperature=0.8, top_k=20, generator=torch.Generator().manual_seed(0))
    assert proposal.draft_probs.shape == (3, 97)
    assert torch.allclose(proposal.draft_probs.sum(-1), torch.ones(3))
    for i, t in enumerate(proposal.draft_ids):
        assert proposal.draft_probs[i, t] > 0 and (proposal.draft_probs[i] > 0).sum() <= 20


def test_misuse_is_refused(tmp_path):
    from orchestrator.errors import InvalidRequestError

    drafter = _drafter(tmp_path)
    with pytest.raises(InvalidRequestError, match="not open"):
        drafter.propose(7, 2)
    drafter.start(7, [1, 2])
    with pytest.raises(InvalidRequestError, match="already open"):
        drafter.start(7, [1])
    with pytest.raises(InvalidRequestError, match="cannot roll back 3"):
        drafter.rollback(7, 3)


def _greedy_drafts_agree(tmp_path, device: str) -> float:
    cpu, other = _drafter(tmp_path), _drafter(tmp_path, device)
    agree = total = 0
    for seq_id, prompt in enumerate(([5, 9, 12], [40, 7, 3, 3, 8], [1, 2, 3, 4])):
        cpu.start(seq_id, prompt)
        other.start(seq_id, prompt)
        a, b = cpu.propose(seq_id, 6).draft_ids, other.propose(seq_id, 6).draft_ids
        agree += sum(x == y for x, y in zip(a, b))
        total += len(a)
    return agree / total


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_drafter_matches_cpu(tmp_path):
    assert _greedy_drafts_agree(tmp_path, "cuda:0") >= 0.9


@pytest.mark.npu
@pytest.mark.skipif(not hasattr(torch, "npu"), reason="needs an Ascend NPU with torch-npu and CANN")
def test_npu_drafter_matches_cpu(tmp_path):
    assert _greedy_drafts_agree(tmp_path, "npu:0") >= 0.9


def test_a_drafter_from_another_checkpoint_with_the_same_vocabulary_is_lossless(tmp_path, smollm2, smollm2_tokenizer):
    """Mechanics of a separate drafter checkpoint: a tiny random model carrying SmolLM2's tokenizer
    drafts (badly) for SmolLM2; the vocabularies are checked equal and greedy output is the target's."""
    drafter_dir = tmp_path / "tiny-drafter"
    tiny_checkpoint(drafter_dir, vocab_size=smollm2_tokenizer.vocab_size)
    smollm2_tokenizer.save_pretrained(drafter_dir)
    config = EngineConfig(model="smollm2-135m", max_kv_tokens=2048,
                          drafter=TorchDrafterConfig(model=str(drafter_dir), max_kv_tokens=512))
    spec = build_engine(config, progress=False)
    plain = build_engine(EngineConfig(model="smollm2-135m", max_kv_tokens=2048, drafter=None), progress=False)
    assert spec.drafter.runner.model.spec.hidden_size == 32  # the tiny model drafts, not the target
    ids = smollm2_tokenizer(PROMPTS[0]).input_ids
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    seq = spec.generate(ids, params)
    assert seq.output_ids == plain.generate(ids, params).output_ids and seq.stats.num_drafted > 0


def test_a_drafter_stops_once_the_whole_draft_is_doubtful(tmp_path):
    drafter = _drafter(tmp_path)
    drafter.start(0, [5, 9, 12, 40])
    full = drafter.propose(0, 4)
    assert len(full.draft_ids) == 4 and len(full.confidence) == 4 and all(0 < p <= 1 for p in full.confidence)
    joint = list(itertools.accumulate(full.confidence, operator.mul))  # the whole draft's probability
    threshold = (joint[1] + joint[2]) / 2  # between the second and third token's joint probability
    drafter.rollback(0, 0)
    cut = drafter.propose(0, 4, min_confidence=threshold)
    assert cut.draft_ids == full.draft_ids[:2] and cut.confidence == full.confidence[:2]
    assert drafter.propose(0, 4, min_confidence=1.01).draft_ids == []


def test_past_the_planned_k_a_draft_goes_on_only_while_it_stays_confident(tmp_path):
    drafter = _drafter(tmp_path)
    drafter.start(0, [5, 9, 12, 40])
    full = drafter.propose(0, 6)
    joint = list(itertools.accumulate(full.confidence, operator.mul))  # the whole draft's probability
    ask = lambda stretch: drafter.propose_batch(  # noqa: E731
        [DraftRequest(0, 6, planned=2, stretch_confidence=stretch)])[0].draft_ids
    assert ask(1.01) == full.draft_ids[:2]  # the plan's 2, however doubtful (no early stop asked)
    assert ask(0.0) == full.draft_ids  # up to k
    assert ask((joint[3] + joint[4]) / 2) == full.draft_ids[:4]
    # the stretch never cuts inside the plan, the early stop does
    stop = DraftRequest(0, 6, min_confidence=(joint[0] + joint[1]) / 2, planned=2, stretch_confidence=0.0)
    assert drafter.propose_batch([stop])[0].draft_ids == full.draft_ids[:1]


def test_batched_drafts_equal_one_by_one(tmp_path):
    drafter = _drafter(tmp_path)
    prompts = [[5, 9, 12, 40, 7, 3], [1, 2], [60, 61, 62, 63, 64, 65, 66, 67, 68], [33]]
    forwards = []
    forward = drafter.runner.forward
    drafter.runner.forward = lambda batch, **kw: forwards.append(len(batch)) or forward(batch, **kw)
    batched = draft_rounds(drafter, prompts, batched=True)
    num_batched = len(forwards)
    assert batched == draft_rounds(drafter, prompts, batched=False)
    assert max(forwards[:num_batched]) == 3 and num_batched < len(forwards) - num_batched
    assert drafter.runner.pool.num_free_blocks == drafter.runner.pool.num_blocks


def test_a_cpu_torch_drafter_says_so_and_an_onnx_one_does_not(tmp_path):
    """`hetspec drafter serve` runs a drafter with `torch_on_cpu` on its main thread (server/one_thread.py)."""
    from orchestrator.drafters.onnx_drafter import OnnxDrafter

    assert _drafter(tmp_path).torch_on_cpu
    assert not OnnxDrafter.torch_on_cpu
