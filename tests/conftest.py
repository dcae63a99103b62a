import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from orchestrator.models import resolve  # noqa: E402


@pytest.fixture(scope="session")
def smollm2():
    return resolve("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3():
    return resolve("gemma3-270m")


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    from orchestrator.models import load_tokenizer

    return load_tokenizer(smollm2)


@pytest.fixture(scope="session")
def smollm2_hf(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.hf_dir, dtype=torch.float32).eval()


def tiny_checkpoint(tmp_path, family: str = "llama", **overrides):
    """A randomly initialised tiny model saved as an HF safetensors dir (mechanics tests only)."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

    from orchestrator.models import Checkpoint

    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    if family == "llama":
        cfg = LlamaConfig(**{**common, **overrides})
    else:
        cfg = Gemma3TextConfig(**{**common, "sliding_window": 4, "query_pre_attn_scalar": 8,
                                  "layer_types": ["sliding_attention", "full_attention"], **overrides})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # Gemma norms start at zero; give every weight some signal
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(tmp_path)
    return Checkpoint(hf_dir=tmp_path, source=tmp_path, key=family), model
