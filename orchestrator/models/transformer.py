"""A small decoder-only transformer (Llama, Qwen2/2.5, Qwen3 and Gemma 3 families) over a paged KV pool.

Tokens of several sequences are flattened into one batch for every linear layer; attention
runs per sequence over the K/V gathered from its blocks. Weights come from a safetensors
checkpoint directory with Hugging Face names.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from orchestrator.errors import CheckpointError
from orchestrator.models.kv_pool import BlockPool

# config.json model_type -> family. Qwen2/2.5 are Llama with q/k/v biases; Qwen3 is Llama with
# RMSNorm on each head's q and k; Gemma 3 has (1 + w) norms around both blocks, GELU and
# interleaved sliding-window layers. Weight names are Hugging Face's throughout.
FAMILIES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3_text": "gemma3", "gemma3": "gemma3"}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture facts read once from config.json."""

    family: str  # "llama" | "qwen2" | "qwen3" | "gemma3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: tuple[float, ...]  # per layer
    sliding_window: tuple[int | None, ...]  # per layer; None = full attention
    attn_scale: float
    tie_word_embeddings: bool
    max_position_embeddings: int

    @staticmethod
    def from_config(cfg: dict) -> "ModelSpec":
        family = FAMILIES.get(cfg.get("model_type"))
        if family is None:
            raise CheckpointError(f"unsupported architecture {cfg.get('model_type')!r}: supported are "
                                  f"{', '.join(sorted(FAMILIES))}")
        if family == "gemma3" and "text_config" in cfg:
            cfg = {**cfg["text_config"], "model_type": "gemma3_text"}
        n_layers = cfg["num_hidden_layers"]
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        layer_types = cfg.get("layer_types") or ["full_attention"] * n_layers
        return ModelSpec(
            family=family,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=n_layers,
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=head_dim,
            rms_norm_eps=cfg["rms_norm_eps"],
            rope_theta=tuple(_rope_theta(cfg, t) for t in layer_types),
            sliding_window=tuple(
                cfg.get("sliding_window") if t == "sliding_attention" else None for t in layer_types
            ),
            attn_scale=(cfg.get("query_pre_attn_scalar") or head_dim) ** -0.5,
            tie_word_embeddings=cfg.get("tie_word_embeddings", True),
            max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        )


def _rope_theta(cfg: dict, layer_type: str) -> float:
    params = cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000.0)}
    params = params.get(layer_type, params)
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise CheckpointError(f"unsupported rope_type {kind!r} (only 'default' is implemented)")
    return float(params["rope_theta"])


@dataclass
class Segment:
    """One sequence's slice of a flattened batch."""

    start: int  # first row of this sequence in the flattened tokens
    num_new: int  # rows it owns
    ctx_len: int  # tokens in its KV after this forward (old + new)
    new_slots: torch.Tensor  # [num_new] pool slots the new K/V go to
    ctx_slots: torch.Tensor  # [ctx_len] pool slots of the whole context


_MATMULS = ("qkv", "o", "gate_up", "down")  # weights packed for oneDNN (their biases stay dense)
# CPU bmm rounds a row alike for any number of rows from 4 up (measured, AMD EPYC), and on a Xeon
# (Sapphire Rapids) with attention's strided K from head_dim / 16 rows up (4 at 64, 8 at 128, 16 at
# 256; fewer took another kernel there and Gemma 3's logits moved by 1e-4): attention pads to it
_MIN_BMM_ROWS = 4
_HEAD_DIM_PER_BMM_ROW = 16


def _dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x: [T, in] dense; weight packed for oneDNN (`_pack`), bias dense -> [T, out] dense.

    oneDNN computes every row the same way whatever the number of rows, except for a single
    row (a GEMV kernel, rounding differently): one row is sent as two. So a token's logits are
    bit-identical whether it is decoded alone, verified among k + 1 or batched with other
    sequences, and greedy speculative output equals target-only output exactly.
    """
    rows = x.shape[0]
    if rows == 1:
        x = x.expand(2, -1)
    y = torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    return y[:1] if rows == 1 else y


def _pack(weight: torch.Tensor) -> torch.Tensor:
    """[out, in] -> oneDNN's blocked layout for its inner product, reordered once here. A plain
    `to_mkldnn()` weight was reordered again inside every call: SmolLM2's [1536 x 576] qkv took 112 us
    for 5 rows that way against 40 us packed (2-core AMD EPYC), with bit-identical results."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())


def onednn_wanted(device: torch.device, dtype: torch.dtype) -> bool:
    """float32 on the CPU: oneDNN's inner product instead of MKL's GEMM. Measured on a 2-core AMD EPYC,
    [17920 x 1536] weights, packed (`_pack`): 2.6 ms for one token (sent as two rows), 3.2 ms for five,
    against MKL's 17.7 and 18.8 ms for those two and five rows."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class Transformer:
    """Weights plus a forward over flattened tokens; no nn.Module machinery needed."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], onednn: bool = False):
        self.spec = spec
        w = weights
        self.embed = w["model.embed_tokens.weight"]  # [vocab, hidden]
        self.lm_head = self.embed if spec.tie_word_embeddings else w["lm_head.weight"]
        self.final_norm = self._norm_weight(w["model.norm.weight"])
        self.layers = [self._layer(w, i) for i in range(spec.num_layers)]
        self.embed_scale = spec.hidden_size**0.5 if spec.family == "gemma3" else 1.0
        self._rope_cache: dict[float, tuple[torch.Tensor, torch.Tensor]] = {}
        self._linear = _dense_linear
        if onednn:  # matmul weights move to oneDNN's layout once; the embedding stays dense
            self._linear = _onednn_linear
            self.lm_head = _pack(self.lm_head)
            for layer in self.layers:
                layer.update({k: _pack(layer[k]) for k in _MATMULS if k in layer})

    @staticmethod
    def load(hf_dir: Path, device: torch.device, dtype: torch.dtype, onednn: bool | None = None) -> "Transformer":
        """`onednn`: matmul weights in oneDNN's layout (default: where that is faster, fp32 on the CPU)."""
        spec = ModelSpec.from_config(json.loads((hf_dir / "config.json").read_text()))
        weights: dict[str, torch.Tensor] = {}
        for f in sorted(hf_dir.glob("*.safetensors")):
            weights.update(load_file(f))
        weights = {k: v.to(device=device, dtype=dtype) for k, v in weights.items()}
        try:
            return Transformer(spec, weights, onednn=onednn_wanted(device, dtype) if onednn is None else onednn)
        except KeyError as e:
            raise CheckpointError(f"{hf_dir}: weight {e} missing from the safetensors files") from e

    def _norm_weight(self, weight: torch.Tensor) -> torch.Tensor:
        # Gemma's RMSNorm scales by (1 + w); fold the 1 in once, in float32 as Gemma does.
        return (1.0 + weight.float()) if self.spec.family == "gemma3" else weight

    def _layer(self, w: dict, i: int) -> dict:
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layer = {
            # q, k and v (and gate and up) are fused into one matmul each: fewer, larger ops.
            "qkv": torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]]),
            "o": w[a + "o_proj.weight"],
            "gate_up": torch.cat([w[m + "gate_proj.weight"], w[m + "up_proj.weight"]]),
            "down": w[m + "down_proj.weight"],
            "attn_norm": self._norm_weight(w[p + "input_layernorm.weight"]),
            "post_attn_norm": self._norm_weight(w[p + "post_attention_layernorm.weight"]),
        }
        if a + "q_proj.bias" in w:  # Qwen2/2.5
            layer["qkv_bias"] = torch.cat([w[a + "q_proj.bias"], w[a + "k_proj.bias"], w[a + "v_proj.bias"]])
        if a + "q_norm.weight" in w:  # Gemma 3, Qwen3: RMSNorm over each head's q and k
            layer["q_norm"] = self._norm_weight(w[a + "q_norm.weight"])
            layer["k_norm"] = self._norm_weight(w[a + "k_norm.weight"])
        if self.spec.family == "gemma3":
            layer["pre_ffn_norm"] = self._norm_weight(w[p + "pre_feedforward_layernorm.weight"])
            layer["post_ffn_norm"] = self._norm_weight(w[p + "post_feedforward_layernorm.weight"])
        return layer

    # ---- building blocks -------------------------------------------------------------

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.spec.rms_norm_eps)
        if self.spec.family == "gemma3":
            return (xf * weight).to(x.dtype)  # weight is already 1 + w, float32
        return weight * xf.to(x.dtype)

    def _rope(self, theta: float, positions: torch.Tensor, dtype: torch.dtype):
        inv_freq = self._rope_cache.get(theta)
        if inv_freq is None:
            d = self.spec.head_dim
            inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=positions.device) / d)
            self._rope_cache[theta] = inv_freq
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [T, head_dim / 2]
        emb = torch.cat([freqs, freqs], dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]  # [T, 1, head_dim]

    @staticmethod
    def _apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _mlp(self, x: torch.Tensor, layer: dict) -> torch.Tensor:
        gate, up = self._linear(x, layer["gate_up"]).chunk(2, dim=-1)
        return self._linear(self._gated(gate, up), layer["down"])

    def _gated(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        act = F.gelu(gate, approximate="tanh") if self.spec.family == "gemma3" else F.silu(gate)
        return act * up

    def _residual(self, x: torch.Tensor, h: torch.Tensor, layer: dict, mlp) -> torch.Tensor:
        """The residual stream after a layer's attention output `h`, its MLP given as `mlp`: Gemma 3
        norms both sides of each sublayer, the others norm before."""
        if self.spec.family == "gemma3":
            x = x + self._rms_norm(h, layer["post_attn_norm"])
            return x + self._rms_norm(mlp(self._rms_norm(x, layer["pre_ffn_norm"])), layer["post_ffn_norm"])
        x = x + h
        return x + mlp(self._rms_norm(x, layer["post_attn_norm"]))

    # ---- attention -------------------------------------------------------------------

    def _attention(self, x, rope, layer, li, pool: BlockPool, segments, new_slots, masks) -> torch.Tensor:
        s = self.spec
        T = x.shape[0]
        q, k, v = self._linear(x, layer["qkv"], layer.get("qkv_bias")).split(
            [s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.num_kv_heads * s.head_dim], dim=-1
        )
        q = q.view(T, s.num_heads, s.head_dim)  # [T, heads, head_dim]
        k = k.view(T, s.num_kv_heads, s.head_dim)  # [T, kv_heads, head_dim]
        v = v.view(T, s.num_kv_heads, s.head_dim)
        if "q_norm" in layer:
            q, k = self._rms_norm(q, layer["q_norm"]), self._rms_norm(k, layer["k_norm"])
        cos, sin = rope
        q, k = self._apply_rope(q, cos, sin), self._apply_rope(k, cos, sin)
        pool.write(li, new_slots, k, v)
        out = torch.empty_like(q)
        for seg, seg_masks in zip(segments, masks):
            keys, values = pool.gather(li, seg.ctx_slots)  # [ctx, kv_heads, head_dim] each
            rows = slice(seg.start, seg.start + seg.num_new)
            out[rows] = self._attend(q[rows], keys, values, seg_masks[s.sliding_window[li]])
        return self._linear(out.reshape(T, -1), layer["o"])

    def _attend(self, q, keys, values, mask) -> torch.Tensor:
        """q: [n, heads, head_dim]; keys, values: [ctx, kv_heads, head_dim] -> [n, heads, head_dim].

        Query heads sharing a KV head (GQA) are stacked into one matmul instead of repeating K/V.
        """
        s = self.spec
        n, ctx, kvh, d = q.shape[0], keys.shape[0], s.num_kv_heads, s.head_dim
        group = s.num_heads // kvh
        qg = q.view(n, kvh, group, d).permute(1, 2, 0, 3).reshape(kvh, group * n, d)
        rows, min_rows = group * n, max(_MIN_BMM_ROWS, d // _HEAD_DIM_PER_BMM_ROW)
        if rows < min_rows:  # fewer rows take another bmm kernel: pad, so rows round alike
            qg = F.pad(qg, (0, 0, 0, min_rows - rows))
        scores = torch.bmm(qg, keys.permute(1, 2, 0)).float() * s.attn_scale  # [kv_heads, rows, ctx]
        scores = scores[:, :rows]
        if mask is not None:
            scores = scores.view(kvh, group, n, ctx).masked_fill(~mask, float("-inf")).view(kvh, rows, ctx)
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        if rows < min_rows:
            probs = F.pad(probs, (0, 0, 0, min_rows - rows))
        out = torch.bmm(probs, values.transpose(0, 1))[:, :rows]  # [kv_heads, rows, head_dim]
        return out.reshape(kvh, group, n, d).permute(2, 0, 1, 3).reshape(n, kvh * group, d)

    # ---- forward ---------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, pool: BlockPool,
                segments: list[Segment]) -> torch.Tensor:
        """input_ids, positions: [T] flattened over segments -> final hidden states [T, hidden]."""
        x = F.embedding(input_ids, self.embed)
        if self.embed_scale != 1.0:
            x = x * torch.tensor(self.embed_scale, dtype=x.dtype)
        ropes = {theta: self._rope(theta, positions, x.dtype) for theta in set(self.spec.rope_theta)}
        # slot index and masks depend only on the segments: build them once, not per layer
        new_slots = torch.cat([seg.new_slots for seg in segments])  # [T]
        windows = set(self.spec.sliding_window)
        masks = [{w: _causal_mask(seg.num_new, seg.ctx_len, w, x.device) for w in windows} for seg in segments]
        for li, layer in enumerate(self.layers):
            rope = ropes[self.spec.rope_theta[li]]
            h = self._rms_norm(x, layer["attn_norm"])
            h = self._attention(h, rope, layer, li, pool, segments, new_slots, masks)
            x = self._residual(x, h, layer, lambda y, layer=layer: self._mlp(y, layer))
        return self._rms_norm(x, self.final_norm)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> [N, vocab] in float32."""
        return self._linear(hidden, self.lm_head).float()


def _causal_mask(num_new: int, ctx_len: int, window: int | None, device) -> torch.Tensor | None:
    """Boolean [num_new, ctx_len] mask: new row i sits at position ctx_len - num_new + i."""
    if num_new == 1 and (window is None or ctx_len <= window):
        return None  # a single query sees the whole context
    q_pos = torch.arange(ctx_len - num_new, ctx_len, device=device)[:, None]
    k_pos = torch.arange(ctx_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask
