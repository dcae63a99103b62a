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
