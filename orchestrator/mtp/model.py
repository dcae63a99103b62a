"""The MTP drafter's network: one feature-level decoder layer run autoregressively (EAGLE-like).

At position i it reads the target's last-layer hidden state h_i and the embedding of the token
that follows, x_{i+1} (the target's own frozen embeddings), and predicts the target's next hidden
state h_{i+1}; the target's frozen lm_head, cut down to a draft vocabulary of frequent tokens,
turns that into the distribution of x_{i+2}. To draft further it feeds its own predicted feature
back in with the token it drafted. The same module trains on full sequences (causal attention
over teacher-forced features) and drafts incrementally over a dense per-sequence K/V cache.
"""

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from orchestrator.errors import CheckpointError

CONFIG_NAME = "mtp_config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "hetspec-mtp-eagle/1"


@dataclass(frozen=True)
class MtpConfig:
    target_model_id: str  # the target checkpoint's key: hidden states from any other model are refused
    target_name: str  # what the user named (for messages)
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_positions: int = 8192
    format: str = FORMAT

    @staticmethod
    def for_target(spec, model_id: str, name: str, draft_vocab_size: int) -> "MtpConfig":
        return MtpConfig(target_model_id=model_id, target_name=name, hidden_size=spec.hidden_size,
                         num_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                         intermediate_size=spec.intermediate_size, vocab_size=spec.vocab_size,
                         draft_vocab_size=min(draft_vocab_size, spec.vocab_size),
                         rms_norm_eps=spec.rms_norm_eps, rope_theta=spec.rope_theta[0],
                         max_positions=spec.max_position_embeddings)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class MtpModel(nn.Module):
    """fc(embed(x_{i+1}) ++ h_i) -> one Llama decoder layer -> norm -> feature; draft head on the feature."""

    def __init__(self, config: MtpConfig, embed: torch.Tensor, draft_ids: torch.Tensor):
        super().__init__()
        c = self.config = config
        H = c.hidden_size
        # frozen, from the target: its token embeddings and its lm_head rows of the draft vocabulary
        self.register_buffer("embed", embed)  # [vocab, H]
        self.register_buffer("draft_ids", draft_ids.long())  # [draft_vocab] target ids
        self.register_buffer("head", embed.new_zeros(len(draft_ids), H))  # set by set_head
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.attn_norm = RMSNorm(H, c.rms_norm_eps)
        self.qkv = nn.Linear(H, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, bias=False)
        self.o = nn.Linear(c.num_heads * c.head_dim, H, bias=False)
        self.mlp_norm = RMSNorm(H, c.rms_norm_eps)
        self.gate_up = nn.Linear(H, 2 * c.intermediate_size, bias=False)
        self.down = nn.Linear(c.intermediate_size, H, bias=False)
        self.norm = RMSNorm(H, c.rms_norm_eps)
        inv_freq = 1.0 / c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float32) / c.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def set_head(self, lm_head: torch.Tensor) -> None:
        self.head.copy_(lm_head[self.draft_ids].to(self.head.dtype))

    # ---- the layer -------------------------------------------------------------------

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions.float()[..., None] * self.inv_freq  # [..., T, D/2]
        emb = torch.cat([freqs, freqs], dim=-1)
        cos, sin = emb.cos().unsqueeze(-3), emb.sin().unsqueeze(-3)  # [..., 1, T, D]
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _qkv(self, z: torch.Tensor, positions: torch.Tensor):
        """z: [B, T, H] -> q [B, heads, T, D], k and v [B, kv_heads, T, D]."""
        c = self.config
        B, T, _ = z.shape
        q, k, v = self.qkv(self.attn_norm(z)).split(
            [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim], dim=-1)
        q = q.view(B, T, c.num_heads, c.head_dim).transpose(1, 2)
        k = k.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = v.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        return self._rope(q, positions), self._rope(k, positions), v

    def _repeat(self, kv: torch.Tensor) -> torch.Tensor:
        """[B, kv_heads, T, D] -> [B, heads, T, D] (grouped-query attention)."""
        group = self.config.num_heads // self.config.num_kv_heads
        return kv if group == 1 else kv.repeat_interleave(group, dim=1)

    def _finish(self, z: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = attn.shape
        z = z + self.o(attn.transpose(1, 2).reshape(B, T, -1))
        gate, up = self.gate_up(self.mlp_norm(z)).chunk(2, dim=-1)
        z = z + self.down(F.silu(gate) * up)
        return self.norm(z)

    def _input(self, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.embed[next_ids].to(hidden.dtype), hidden], dim=-1))

    def forward(self, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Training: hidden [B, T, H] (h_0..h_{T-1}), next_ids [B, T] (x_1..x_T) -> features [B, T, H]
        predicting h_1..h_T, with causal attention over the whole row."""
        z = self._input(hidden, next_ids)
        positions = torch.arange(z.shape[1], device=z.device)
        q, k, v = self._qkv(z, positions)
        attn = F.scaled_dot_product_attention(q, self._repeat(k), self._repeat(v), is_causal=True)
        return self._finish(z, attn)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., draft_vocab] float32."""
        return F.linear(features, self.head).float()

    # ---- incremental drafting --------------------------------------------------------

    def new_cache(self, capacity: int) -> torch.Tensor:
        c = self.config
        return self.embed.new_zeros(2, c.num_kv_heads, capacity, c.head_dim)

    def step(self, hidden: torch.Tensor, next_ids: torch.Tensor, cache: torch.Tensor, start: int) -> torch.Tensor:
        """Runs rows at positions [start, start + T) over cache[:, :, :start] and writes their K/V there.
        hidden: [T, H], next_ids: [T] -> features [T, H]. The caller keeps `cache` large enough."""
        T = hidden.shape[0]
        z = self._input(hidden, next_ids)[None]  # [1, T, H]
        positions = torch.arange(start, start + T, device=z.device)
        q, k, v = self._qkv(z, positions)
        cache[0, :, start:start + T] = k[0]
        cache[1, :, start:start + T] = v[0]
        keys, values = cache[0, :, :start + T][None], cache[1, :, :start + T][None]
        mask = None
        if T > 1:  # row t sees positions <= start + t
            mask = torch.arange(start + T, device=z.device)[None, :] <= positions[:, None]
        attn = F.scaled_dot_product_attention(q, self._repeat(keys), self._repeat(values), attn_mask=mask)
        return self._finish(z, attn)[0]

    # ---- checkpoints -----------------------------------------------------------------

    def save(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous() for k, v in self.state_dict().items() if k != "embed"}
        tensors["embed"] = self.embed.to(torch.float16).contiguous()  # frozen: half the bytes
        save_file(tensors, str(out / WEIGHTS_NAME), metadata={"format": FORMAT})
        (out / CONFIG_NAME).write_text(json.dumps(asdict(self.config), indent=2) + "\n")

    @staticmethod
    def read_config(path: str | Path) -> MtpConfig:
        path = Path(path)
        try:
            config = MtpConfig(**json.loads((path / CONFIG_NAME).read_text()))
        except FileNotFoundError as e:
            raise CheckpointError(f"{path}: not an MTP drafter (no {CONFIG_NAME}; build one with "
                                  f"`hetspec train-drafter`)") from e
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{path / CONFIG_NAME}: {e}") from e
        if config.format != FORMAT:
            raise CheckpointError(f"{path}: format {config.format!r}, this hetspec reads {FORMAT!r}")
        return config

    @staticmethod
    def load(path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> "MtpModel":
        path = Path(path)
        config = MtpModel.read_config(path)
        tensors = load_file(str(path / WEIGHTS_NAME))
        model = MtpModel(config, tensors["embed"].to(dtype), tensors["draft_ids"])
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        if set(missing) - {"inv_freq"} or unexpected:
            raise CheckpointError(f"{path / WEIGHTS_NAME}: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        return model.to(device=device, dtype=dtype).eval()
