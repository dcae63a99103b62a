import pytest
import torch

from devices import DeviceUnavailable, resolve_torch_device


def test_cpu_resolves():
    assert resolve_torch_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name, match", [
    ("tpu:0", "unknown device"),
    ("cuda:x", "bad device index"),
    ("cpu:3", "not available"),
])
def test_bad_names_are_explained(name, match):
    with pytest.raises(DeviceUnavailable, match=match):
        resolve_torch_device(name)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_missing_cuda_is_explained():
    with pytest.raises(DeviceUnavailable, match="no cuda device"):
        resolve_torch_device("cuda:0")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_target_matches_cpu_greedy(smollm2, smollm2_tokenizer):
    from orchestrator.models import TargetRunner

    ids = smollm2_tokenizer("The capital of France is").input_ids
    cpu = TargetRunner(smollm2, device="cpu").forward([(0, ids, 1)])[0].logits
    gpu = TargetRunner(smollm2, device="cuda:0").forward([(0, ids, 1)])[0].logits.cpu()
    torch.testing.assert_close(gpu, cpu, atol=1e-2, rtol=1e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_speculation_on_a_cuda_target_is_lossless_and_samples(smollm2, smollm2_tokenizer):
    """Drafts from the host meet the GPU target's logits: greedy output is the GPU target-only's, and a
    sampled request (judged on the host, where its generator lives) commits its tokens."""
    from orchestrator.config import SamplingParams
    from orchestrator.drafters import NgramDrafter
    from orchestrator.engine import Engine
    from orchestrator.models import TargetRunner, encode_prompt

    from prompts import GROUNDED

    target = TargetRunner(smollm2, device="cuda:0", dtype=torch.float16, max_kv_tokens=2048)
    ids = encode_prompt(smollm2_tokenizer, GROUNDED, chat=True)
    greedy = SamplingParams(max_new_tokens=48, ignore_eos=True)
    plain = Engine(target, smollm2_tokenizer).generate(ids, greedy).output_ids
    seq = Engine(target, smollm2_tokenizer, NgramDrafter(), num_speculative_tokens=4).generate(ids, greedy)
    assert seq.output_ids == plain and seq.stats.num_accepted > 0
    sampled = SamplingParams(max_new_tokens=24, ignore_eos=True, temperature=0.8, top_k=20, seed=7)
    seq = Engine(target, smollm2_tokenizer, NgramDrafter(), num_speculative_tokens=4).generate(ids, sampled)
    assert len(seq.output_ids) == 24 and seq.stats.num_drafted > 0
