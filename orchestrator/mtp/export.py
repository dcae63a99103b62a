"""An MTP drafter as an ONNX graph, so it drafts on ONNX Runtime on any execution provider (CPU, CUDA,
CANN for Ascend NPUs).

One call of the graph runs T pairs (h_i, x_{i+1}) at positions [P, P + T) over P cached K/V rows:

    inputs:  hidden [T, H] float32, next_ids [T] int64, positions [T] int64,
             past_key, past_value [P, kv_heads, head_dim] float32
    outputs: features [T, H], logits [T, draft_vocab], key, value [T, kv_heads, head_dim] (the new rows)

Exported by `torch.onnx.export` (TorchScript exporter, opset 17), then weight-only quantized by
onnxruntime's `MatMulNBitsQuantizer` (INT4 body with an 8-bit draft head, or INT8); the frozen
embeddings stay float16 (a Gather). Written to DIR/onnx-PRECISION/ beside the checkpoint.
"""

import json
import shutil
import warnings
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import nn

from orchestrator.errors import ExportError
from orchestrator.models.export_torch import quantize_matmuls
from orchestrator.mtp.model import MtpModel

MODEL_FILE = "model.onnx"
INPUTS = ("hidden", "next_ids", "positions", "past_key", "past_value")
OUTPUTS = ("features", "logits", "key", "value")
PRECISIONS = ("int4", "int8", "fp32")


class _StepGraph(nn.Module):
    """MtpModel.step as a graph; matmul weights pre-transposed so each is MatMul(x, constant)."""

    def __init__(self, model: MtpModel):
        super().__init__()
        c = self.config = model.config
        t = lambda linear: nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)  # noqa: E731
        self.embed = nn.Parameter(model.embed.detach().to(torch.float16), requires_grad=False)
        self.fc, self.qkv, self.o = t(model.fc), t(model.qkv), t(model.o)
        self.gate_up, self.down = t(model.gate_up), t(model.down)
        self.lm_head = nn.Parameter(model.head.detach().t().contiguous(), requires_grad=False)
        self.attn_norm, self.mlp_norm, self.norm = model.attn_norm.weight, model.mlp_norm.weight, model.norm.weight
        self.register_buffer("inv_freq", model.inv_freq.clone())
        self.eps = c.rms_norm_eps

    def _norm(self, x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def forward(self, hidden, next_ids, positions, past_key, past_value):
        c = self.config
        T = hidden.shape[0]
        e = F.embedding(next_ids, self.embed).float()
        z = torch.cat([e, hidden], dim=-1) @ self.fc  # [T, H]
        q, k, v = (self._norm(z, self.attn_norm) @ self.qkv).split(
            [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], dim=-1)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos()[:, None, :], emb.sin()[:, None, :]
        q = self._rope(q.reshape(T, c.num_heads, c.head_dim), cos, sin)
        k = self._rope(k.reshape(T, c.num_kv_heads, c.head_dim), cos, sin)
        v = v.reshape(T, c.num_kv_heads, c.head_dim)
        keys, values = torch.cat([past_key, k], dim=0), torch.cat([past_value, v], dim=0)  # [P + T, kvh, D]
        group = c.num_heads // c.num_kv_heads
        keys = keys.repeat_interleave(group, dim=1).permute(1, 2, 0)  # [heads, D, P + T]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, P + T, D]
        scores = (q.transpose(0, 1) @ keys) * (c.head_dim ** -0.5)  # [heads, T, P + T]
        rows = torch.arange(keys.shape[-1], device=hidden.device)  # cache row j holds position j
        scores = scores.masked_fill(rows[None, None, :] > positions[None, :, None], float("-inf"))
        attn = (torch.softmax(scores, dim=-1) @ values).transpose(0, 1).reshape(T, -1)
        z = z + attn @ self.o
        gate, up = (self._norm(z, self.mlp_norm) @ self.gate_up).chunk(2, dim=-1)
        z = z + (F.silu(gate) * up) @ self.down
        features = self._norm(z, self.norm)
        return features, features @ self.lm_head, k, v


def onnx_dir(drafter_dir: Path, precision: str) -> Path:
    return Path(drafter_dir) / f"onnx-{precision}"


def export_mtp(drafter_dir: Path, precision: str = "int4", block_size: int = 32) -> Path:
    """The drafter's ONNX export at `precision` (made once, then found beside the checkpoint)."""
    if precision not in PRECISIONS:
        raise ExportError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    out = onnx_dir(drafter_dir, precision)
    if (out / "export.json").is_file():
        return out
    model = MtpModel.load(drafter_dir)
    graph = _StepGraph(model).eval()
    c = model.config
    P, T = 5, 3
    args = (torch.randn(T, c.hidden_size), torch.ones(T, dtype=torch.int64), torch.arange(P, P + T),
            torch.zeros(P, c.num_kv_heads, c.head_dim), torch.zeros(P, c.num_kv_heads, c.head_dim))
    dynamic = {"hidden": {0: "num_new"}, "next_ids": {0: "num_new"}, "positions": {0: "num_new"},
               "past_key": {0: "past"}, "past_value": {0: "past"}, "features": {0: "num_new"},
               "logits": {0: "num_new"}, "key": {0: "num_new"}, "value": {0: "num_new"}}
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    fp32 = tmp / "fp32" / MODEL_FILE
    fp32.parent.mkdir(parents=True)
    try:
        with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(graph, args, str(fp32), input_names=list(INPUTS), output_names=list(OUTPUTS),
                              dynamic_axes=dynamic, dynamo=False, opset_version=17)
    except Exception as e:  # the exporter raises many kinds
        raise ExportError(f"torch.onnx.export of the MTP drafter failed: {type(e).__name__}: {e}") from e
    proto = onnx.load(str(fp32))
    if precision != "fp32":
        proto = quantize_matmuls(proto, 4 if precision == "int4" else 8, block_size, int8_lm_head=True)
    onnx.save_model(proto, str(tmp / MODEL_FILE), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=MODEL_FILE + ".data")
    shutil.rmtree(fp32.parent)
    (tmp / "export.json").write_text(json.dumps({"precision": precision, "block_size": block_size,
                                                 "target_model_id": c.target_model_id}) + "\n")
    shutil.rmtree(out, ignore_errors=True)  # an interrupted earlier export
    tmp.replace(out)
    return out
