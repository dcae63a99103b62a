"""The torch.onnx export route (export_torch) on tiny random models: the ONNX graph, fed its own
past K/V chunk by chunk, gives Hugging Face's logits, sliding window included."""

import numpy as np
import onnxruntime as ort
import pytest
import torch

from orchestrator.models.export_torch import MODEL_FILE, export_with_torch

from conftest import tiny_checkpoint


def _run_in_chunks(session, ids: list[int], chunks: list[int], num_layers: int, kv_heads: int, head_dim: int):
    past = {f"past_key_values.{i}.{kv}": np.zeros((1, kv_heads, 0, head_dim), np.float32)
            for i in range(num_layers) for kv in ("key", "value")}
    out, done = [], 0
    for n in chunks:
        feed = {"input_ids": np.array([ids[done:done + n]], np.int64),
                "attention_mask": np.ones((1, done + n), np.int64),
                "position_ids": np.arange(done, done + n, dtype=np.int64)[None], **past}
        names = [o.name for o in session.get_outputs()]
        results = dict(zip(names, session.run(names, feed)))
        out.append(results["logits"][0])
        past = {f"past_key_values.{i}.{kv}": results[f"present.{i}.{kv}"]
                for i in range(num_layers) for kv in ("key", "value")}
        done += n
    return np.concatenate(out)


@pytest.mark.parametrize("family", ["gemma3", "qwen2", "qwen3", "llama"])
def test_exported_graph_matches_transformers_chunk_by_chunk(tmp_path, family):
    ckpt, hf = tiny_checkpoint(tmp_path / "hf", family)
    ids = torch.randint(0, 97, (1, 19), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(ids).logits[0].numpy()
    out = tmp_path / "onnx"
    out.mkdir()
    export_with_torch(ckpt, out, "fp32", 32, False)
    session = ort.InferenceSession(str(out / MODEL_FILE), providers=["CPUExecutionProvider"])
    # a prompt, a 3-token verify-sized chunk, then single tokens past the sliding window (4)
    mine = _run_in_chunks(session, ids[0].tolist(), [9, 3] + [1] * 7, num_layers=2, kv_heads=2, head_dim=8)
    np.testing.assert_allclose(mine, ref, atol=1e-4, rtol=1e-4)


def test_int4_export_quantizes_every_matmul_and_keeps_the_lm_head_at_8_bits(tmp_path):
    import onnx

    ckpt, _ = tiny_checkpoint(tmp_path / "hf", "qwen2", hidden_size=64, intermediate_size=128, head_dim=16)
    out = tmp_path / "onnx"
    out.mkdir()
    export_with_torch(ckpt, out, "int4", 32, True)
    graph = onnx.load(str(out / MODEL_FILE), load_external_data=False).graph
    nbits = {n.name: next(a.i for a in n.attribute if a.name == "bits") for n in graph.node if n.op_type == "MatMulNBits"}
    assert not [n.name for n in graph.node if n.op_type == "MatMul" and any("l0_" in i or "lm_head" in i for i in n.input)]
    assert sorted(set(nbits.values())) == [4, 8] and list(nbits.values()).count(8) == 1, nbits
