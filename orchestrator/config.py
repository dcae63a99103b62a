"""Typed configuration, validated once at the edge; plain attributes everywhere else."""

import math
from dataclasses import dataclass, field

from orchestrator.errors import InvalidRequestError

DTYPES = ("float32", "float16", "bfloat16")
DRAFTERS = ("onnx", "ngram", "none", "torch", "remote")
PREEMPTION_MODES = ("auto", "swap", "recompute")


@dataclass(frozen=True)
class SamplingParams:
    """Per-request generation parameters."""

    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # keep going past EOS (benchmarks, fixed-length tests)
    speculate: bool = True
    num_speculative_tokens: int | None = None  # None = the engine's k

    def validate(self, max_new_tokens_limit: int = 1 << 16) -> None:
        if not 1 <= self.max_new_tokens <= max_new_tokens_limit:
            raise InvalidRequestError(f"max_new_tokens must be in [1, {max_new_tokens_limit}], got {self.max_new_tokens}")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise InvalidRequestError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must be non-empty")
        k = self.num_speculative_tokens
        if k is not None and not 0 <= k <= 32:
            raise InvalidRequestError(f"num_speculative_tokens must be in [0, 32], got {k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class DrafterConfig:
    kind: str = "onnx"  # "onnx" | "ngram" | "torch" | "remote" | "none"
    precision: str = "int4"  # onnx export: int4 | int8 | fp32
    block_size: int = 32
    int8_lm_head: bool = True  # INT4 body, 8-bit lm_head: the best measured INT4 config
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    provider_options: tuple[dict, ...] = ()  # one dict per provider, or () for none
    max_ngram: int = 3
    model: str | None = None  # onnx/torch drafter checkpoint; None = the target's
    device: str = "cpu"  # torch drafter device
    dtype: str = "float32"  # torch drafter dtype
    max_kv_tokens: int | None = None  # torch drafter KV capacity; None = the target's
    address: str | None = None  # remote drafter host:port
    remote_timeout_s: float = 5.0  # a remote drafter silent this long is dropped (target-only until it is back)
    remote_channel: object = None  # remote drafter ChannelOptions (TLS, token); None = plaintext, no token
    # onnx self-drafter: start from the target's prefill K/V (sent as protocol blocks)
    # instead of running its own prefill
    kv_handoff: bool = False


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF dir, GGUF file or embedded name; None = SmolLM2-135M
    device: str = "cpu"
    dtype: str = "float32"
    kv_block_size: int = 16
    max_kv_tokens: int = 8192
    max_num_seqs: int = 16
    num_speculative_tokens: int = 4  # k
    adaptive_k: bool = False  # shrink the draft after rejections, grow it after full accepts
    # a preempted sequence's K/V: swapped to host, recomputed, or whichever is estimated cheaper
    preemption: str = "auto"  # "auto" | "swap" | "recompute"
    drafter: DrafterConfig = field(default_factory=DrafterConfig)

    def validate(self) -> None:
        if self.dtype not in DTYPES:
            raise InvalidRequestError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.drafter.dtype not in DTYPES:
            raise InvalidRequestError(f"drafter dtype must be one of {', '.join(DTYPES)}, got {self.drafter.dtype!r}")
        if self.drafter.kind not in DRAFTERS:
            raise InvalidRequestError(f"drafter must be one of {', '.join(DRAFTERS)}, got {self.drafter.kind!r}")
        if self.preemption not in PREEMPTION_MODES:
            raise InvalidRequestError(f"preemption must be one of {', '.join(PREEMPTION_MODES)}, got {self.preemption!r}")
        if not 0 <= self.num_speculative_tokens <= 32:
            raise InvalidRequestError("num_speculative_tokens must be in [0, 32]")
        for name in ("kv_block_size", "max_kv_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(f"{name} must be positive")
