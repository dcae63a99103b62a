"""The other route to an ONNX drafter, for architectures onnxruntime-genai's builder cannot take
(Gemma 3 with transformers 5): hetspec's own transformer math over dense past/present K/V, exported
by `torch.onnx.export` (the TorchScript exporter, opset 17), then weight-only quantized by onnxruntime's `MatMulNBitsQuantizer`
(INT4 or INT8 blocks, the lm_head optionally at 8 bits).

The exported graph speaks what `OnnxDrafter` expects of any KV-cache decoder: inputs `input_ids`
[1, n], `attention_mask` [1, past + n], `position_ids` [1, n], `past_key_values.{i}.key|value`
[1, kv_heads, past, head_dim]; outputs `logits` [1, n, vocab] and `present.{i}.key|value`
[1, kv_heads, past + n, head_dim] (past and new concatenated).
"""

import json
import logging
import warnings
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F

from orchestrator.errors import ExportError
from orchestrator.models.checkpoints import Checkpoint
from orchestrator.models.transformer import Transformer

MODEL_FILE = "model.onnx"
LINEARS = ("qkv", "o", "gate_up", "down")


class DenseKvDecoder(torch.nn.Module):
    """`Transformer`'s layers over concatenated K/V tensors, one sequence, as a traceable module."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        s = model.spec
        # matmul weights pre-transposed: the graph gets MatMul(x, constant), which the quantizer takes
        for i, layer in enumerate(model.layers):
            for name in LINEARS:
                self.register_buffer(f"l{i}_{name}", layer[name].t().contiguous())
            if "qkv_bias" in layer:
                self.register_buffer(f"l{i}_qkv_bias", layer["qkv_bias"])
        self.register_buffer("lm_head", model.lm_head.t().contiguous())
        # an initializer, so it is saved beside the graph (as a traced constant it stayed inside model.onnx)
        self.register_buffer("embed", model.embed)
        self.group = s.num_heads // s.num_kv_heads

    def forward(self, input_ids, attention_mask, position_ids, *past):
        m, s = self.model, self.model.spec
        n = input_ids.shape[1]
        x = F.embedding(input_ids[0], self.embed)  # [n, hidden]
        if m.embed_scale != 1.0:
            x = x * m.embed_scale
        positions = position_ids[0]  # [n]
        presents = []
        for i, layer in enumerate(m.layers):
            cos, sin = m._rope(s.rope_theta[i], positions, x.dtype)  # [n, 1, head_dim]
            h = m._rms_norm(x, layer["attn_norm"])
            qkv = h @ getattr(self, f"l{i}_qkv")
            if "qkv_bias" in layer:
                qkv = qkv + getattr(self, f"l{i}_qkv_bias")
            q, k, v = qkv.split([s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim,
                                 s.num_kv_heads * s.head_dim], dim=-1)
            q = q.view(n, s.num_heads, s.head_dim)
            k = k.view(n, s.num_kv_heads, s.head_dim)
            v = v.view(n, s.num_kv_heads, s.head_dim)
            if "q_norm" in layer:
                q, k = m._rms_norm(q, layer["q_norm"]), m._rms_norm(k, layer["k_norm"])
            q, k = m._apply_rope(q, cos, sin), m._apply_rope(k, cos, sin)
            keys = torch.cat([past[2 * i], k.transpose(0, 1)[None]], dim=2)  # [1, kv_heads, total, head_dim]
            values = torch.cat([past[2 * i + 1], v.transpose(0, 1)[None]], dim=2)
            presents += [keys, values]
            h = self._attend(q, keys[0], values[0], attention_mask[0], positions, s.sliding_window[i])
            h = h @ getattr(self, f"l{i}_o")
            x = m._residual(x, h, layer, lambda y, i=i: self._mlp(y, i))
        logits = m._rms_norm(x, m.final_norm) @ self.lm_head  # [n, vocab]
        return (logits[None].float(), *presents)

    def _mlp(self, x, i: int):
        gate, up = (x @ getattr(self, f"l{i}_gate_up")).chunk(2, dim=-1)
        return self.model._gated(gate, up) @ getattr(self, f"l{i}_down")

    def _attend(self, q, keys, values, attention_mask, positions, window):
        """q: [n, heads, d]; keys, values: [kv_heads, total, d]; causal (and sliding) by position."""
        s = self.model.spec
        k = keys.repeat_interleave(self.group, dim=0)  # [heads, total, d]
        v = values.repeat_interleave(self.group, dim=0)
        scores = torch.matmul(q.transpose(0, 1), k.transpose(1, 2)) * s.attn_scale  # [heads, n, total]
        key_pos = torch.arange(keys.shape[1], device=q.device)[None, :]  # [1, total]
        allowed = (key_pos <= positions[:, None]) & (attention_mask[None, :] > 0)  # [n, total]
        if window is not None:
            allowed = allowed & (key_pos > positions[:, None] - window)
        scores = scores.float().masked_fill(~allowed[None], float("-inf"))
        out = torch.matmul(torch.softmax(scores, dim=-1).to(q.dtype), v)  # [heads, n, d]
        return out.transpose(0, 1).reshape(q.shape[0], -1)


def export_with_torch(ckpt: Checkpoint, out: Path, precision: str, block_size: int, int8_lm_head: bool,
                      accuracy_level: int | None = None) -> None:
    """Export `ckpt` into `out` (a model.onnx with its weights beside it, and a genai_config.json)."""
    model = Transformer.load(ckpt.hf_dir, torch.device("cpu"), torch.float32, onednn=False)
    s = model.spec
    decoder = DenseKvDecoder(model).eval()
    past_len, n = 4, 3
    past = [torch.zeros(1, s.num_kv_heads, past_len, s.head_dim) for _ in range(2 * s.num_layers)]
    args = (torch.ones(1, n, dtype=torch.int64), torch.ones(1, past_len + n, dtype=torch.int64),
            torch.arange(past_len, past_len + n)[None], *past)
    names = [f"past_key_values.{i}.{kv}" for i in range(s.num_layers) for kv in ("key", "value")]
    outputs = ["logits"] + [f"present.{i}.{kv}" for i in range(s.num_layers) for kv in ("key", "value")]
    dynamic = {"input_ids": {1: "num_new"}, "attention_mask": {1: "total"}, "position_ids": {1: "num_new"},
               **{name: {2: "past"} for name in names}}
    fp32 = out / "fp32" / MODEL_FILE
    fp32.parent.mkdir(parents=True)
    try:
        # the TorchScript exporter: the dynamo one needs onnxscript, which hetspec does not depend on
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            torch.onnx.export(decoder, args, str(fp32), input_names=["input_ids", "attention_mask", "position_ids",
                                                                     *names],
                              output_names=outputs, dynamic_axes=dynamic, dynamo=False, opset_version=17)
    except Exception as e:  # the exporter raises many kinds
        raise ExportError(f"torch.onnx.export of {s.family} failed: {type(e).__name__}: {e}") from e
    proto = onnx.load(str(fp32))
    if precision != "fp32":
        proto = quantize_matmuls(proto, 4 if precision == "int4" else 8, block_size, int8_lm_head, accuracy_level)
    onnx.save_model(proto, str(out / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=MODEL_FILE + ".data")
    for f in fp32.parent.iterdir():
        f.unlink()
    fp32.parent.rmdir()
    (out / "genai_config.json").write_text(json.dumps({
        "model": {"type": s.family, "vocab_size": s.vocab_size, "context_length": s.max_position_embeddings,
                  "decoder": {"filename": MODEL_FILE, "num_key_value_heads": s.num_kv_heads, "head_size": s.head_dim,
                              "num_hidden_layers": s.num_layers}},
        "search": {"past_present_share_buffer": False}}, indent=2))


def quantize_matmuls(proto, bits: int, block_size: int, int8_lm_head: bool, accuracy_level: int | None = None):
    """MatMul weights to `bits`-bit blocks (symmetric); the lm_head at 8 bits when asked."""
    quantizer = _quantizer_class()
    lm_head = [node.name for node in proto.graph.node if node.op_type == "MatMul" and "lm_head" in node.input]
    body = quantizer(proto, bits=bits, block_size=block_size, is_symmetric=True,
                                accuracy_level=accuracy_level, nodes_to_exclude=lm_head if int8_lm_head else [])
    body.process()
    proto = body.model.model
    if int8_lm_head and bits == 4 and lm_head:
        head = quantizer(proto, bits=8, block_size=block_size, is_symmetric=True,
                                    accuracy_level=accuracy_level, nodes_to_include=lm_head)
        head.process()
        proto = head.model.model
    return proto


def _quantizer_class():
    """onnxruntime's quantizer module calls `logging.basicConfig(level=INFO)` on import, which would
    turn on every library's INFO logs in this process: imported here with the root logger kept as it
    was, and its own per-node INFO lines silenced."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    root.handlers[:], root.level = handlers, level
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    return MatMulNBitsQuantizer
