"""Typed configuration, validated once at the edge; plain attributes everywhere else.

Pure data: nothing here touches a device, a file, the network or the environment. Profiles
(YAML) and CLI flags become these objects; the assembly turns them into running parts.
"""

import math
from dataclasses import dataclass, field
from typing import ClassVar, Union

from orchestrator.acceptance_policy import AcceptancePolicy
from orchestrator.errors import InvalidRequestError

DTYPES = ("float32", "float16", "bfloat16")
PREEMPTION_MODES = ("auto", "swap", "recompute")
TRANSPORT_KINDS = ("inline", "shared_memory")
K_POLICIES = ("auto", "fixed", "adaptive")
MAX_SPECULATIVE_TOKENS = 32
AUTO_K_MAX = 8  # the most the auto policy drafts unless told otherwise
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def check_sampling(temperature: float, top_k: int, top_p: float, where: str = "") -> None:
    """The one check of a sampling transform; the message names the field (`where` prefixes it)."""
    if not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidRequestError(f"{where}temperature: must be a finite number >= 0, got {temperature}",
                                  f"{where}temperature")
    if top_k < 0:
        raise InvalidRequestError(f"{where}top_k: must be >= 0 (0 = off), got {top_k}", f"{where}top_k")
    if not (math.isfinite(top_p) and 0.0 < top_p <= 1.0):
        raise InvalidRequestError(f"{where}top_p: must be in (0, 1] (1 = off), got {top_p}", f"{where}top_p")


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
    acceptance: str | None = None  # acceptance policy; None = the engine's (see acceptance_policy)
    acceptance_options: tuple[tuple[str, float], ...] = ()

    def validate(self, max_new_tokens_limit: int = 1 << 16) -> None:
        """Every field checked, each error naming the field as the gRPC request spells it."""
        if not 1 <= self.max_new_tokens <= max_new_tokens_limit:
            raise InvalidRequestError(f"max_new_tokens: must be in [1, {max_new_tokens_limit}], "
                                      f"got {self.max_new_tokens}", "max_new_tokens")
        check_sampling(self.temperature, self.top_k, self.top_p)
        for i, s in enumerate(self.stop):
            if not s:
                raise InvalidRequestError(f"stop[{i}]: must be non-empty", f"stop[{i}]")
        if len(self.stop) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in self.stop):
            raise InvalidRequestError(f"stop: at most {MAX_STOP_STRINGS} strings of at most "
                                      f"{MAX_STOP_CHARS} characters", "stop")
        k = self.num_speculative_tokens
        if k is not None and not 0 <= k <= MAX_SPECULATIVE_TOKENS:
            raise InvalidRequestError(f"num_speculative_tokens: must be in [0, {MAX_SPECULATIVE_TOKENS}], "
                                      f"got {k}", "num_speculative_tokens")
        if self.acceptance is not None:  # options alone apply to the engine's default: checked there
            self.policy(AcceptancePolicy())

    def policy(self, default: "AcceptancePolicy") -> "AcceptancePolicy":
        """The request's acceptance policy: the engine's `default` unless it names one. Lossy policies
        judge greedy requests only: a sampled request naming one is refused; under a lossy default it
        takes rejection sampling."""
        if self.acceptance is None and not self.acceptance_options:
            return default if self.greedy or not default.lossy else AcceptancePolicy()
        name = default.name if self.acceptance is None else self.acceptance
        policy = AcceptancePolicy.parse(name, dict(self.acceptance_options), "acceptance", "acceptance_options")
        if policy.lossy and not self.greedy:
            raise InvalidRequestError(f"acceptance: {policy.name} is lossy and judges greedy requests only "
                                      f"(temperature 0); sampled requests take rejection or strict", "acceptance")
        return policy

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# ---- drafters: one typed record per kind (the registry maps each type to its builder) -------------


@dataclass(frozen=True)
class OnnxDrafterConfig:
    """An exported decoder (INT4/INT8 MatMulNBits or fp32) on ONNX Runtime."""

    kind: ClassVar[str] = "onnx"
    model: str | None = None  # checkpoint to export; None = the target's (a self-drafter)
    device: str = "cpu"  # picks the execution provider and where the KV buffers live
    precision: str = "int4"  # int4 | int8 | fp32
    block_size: int = 32  # weights per quantization scale
    int8_lm_head: bool = True  # INT4 body, 8-bit lm_head: the best measured INT4 config
    providers: tuple[str, ...] = ()  # explicit provider list (`--drafter-ep`); () = the device's own
    provider_options: dict = field(default_factory=dict)  # extra options for the device's provider
    # start from the target's prefill K/V instead of a drafter prefill; "auto": where the drafter is the
    # target's own export (no drafter model) and the target runs in this process
    kv_handoff: bool | str = "auto"
    threads: int | None = None  # ONNX Runtime's intra-op threads; None = its default (one per core)


@dataclass(frozen=True)
class TorchDrafterConfig:
    """A small torch model run by the target's own runner (e.g. on npu:0)."""

    kind: ClassVar[str] = "torch"
    model: str | None = None  # None = the target's checkpoint (self-drafting; a test setup)
    device: str = "cpu"
    dtype: str = "float32"
    max_kv_tokens: int | None = None  # None = the target's KV capacity


@dataclass(frozen=True)
class NgramDrafterConfig:
    """Prompt lookup over the sequence's own tokens; no model."""

    kind: ClassVar[str] = "ngram"
    max_ngram: int = 3


@dataclass(frozen=True)
class MtpDrafterConfig:
    """A multi-token-prediction drafter trained for the target (`hetspec train-drafter`), reading its hidden
    states."""

    kind: ClassVar[str] = "mtp"
    model: str = ""  # the directory `hetspec train-drafter --out` wrote
    device: str = "cpu"
    dtype: str = "float32"  # the torch runtime's
    runtime: str = "auto"  # torch | onnx (its ONNX export on the device's ONNX Runtime provider) | auto (the faster)
    precision: str = "int4"  # the onnx runtime's: int4 | int8 | fp32


@dataclass(frozen=True)
class RemoteDrafterConfig:
    """A drafter behind `hetspec drafter serve`, reached over a `hetspec.v1.Drafter` session."""

    kind: ClassVar[str] = "remote"
    address: str = "127.0.0.1:50061"  # host:port
    timeout_s: float = 5.0  # a drafter silent this long is dropped (target-only until it is back)
    tls: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    token_env: str | None = None  # environment variable holding the bearer token (read when connecting)
    kv_handoff: bool = False  # open sequences with the target's prefill K/V (a remote self-drafter)
    hidden_states: bool = False  # send the target's hidden states (the remote drafter is an mtp drafter)


@dataclass(frozen=True)
class CombinedDrafterConfig:
    """Several drafters at once, asked in order, each sequence keeping the draft expected to commit the
    most (`combine: confidence`; `orchestrator.drafters.combined`)."""

    kind: ClassVar[str] = "combined"
    drafters: tuple = ()  # the drafters' configs, cheapest first
    combine: str = "confidence"


DrafterConfig = Union[OnnxDrafterConfig, TorchDrafterConfig, NgramDrafterConfig, MtpDrafterConfig,
                      RemoteDrafterConfig, CombinedDrafterConfig]


@dataclass(frozen=True)
class TransportConfig:
    """How blocks leave a device and travel to a peer."""

    kind: str = "inline"  # blocks this process sends: bytes in the message, or a shared-memory segment
    pinned_staging: bool = True  # page-locked staging buffers where the device supports them
    staging_pool_bytes: int = 64 << 20  # staging buffers kept for reuse (more are freed after use)
    max_message_bytes: int = 64 << 20  # gRPC message limit, both directions


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # HF dir, GGUF file or embedded name; None = SmolLM2-135M
    device: str = "cpu"
    dtype: str = "float32"
    kv_block_size: int = 16
    max_kv_tokens: int = 8192
    max_num_seqs: int = 16
    num_speculative_tokens: int = AUTO_K_MAX  # k: the fixed k, or the most the auto policy drafts
    # how k is chosen each step: auto (cost model, per sequence, 0 allowed) | fixed | adaptive (HF's +2/-1)
    k_policy: str = "auto"
    # fixed-rule baselines: no drafts from this batch size on (vLLM), and (min batch size, k) pairs (TensorRT-LLM)
    disable_by_batch_size: int | None = None
    draft_len_schedule: tuple[tuple[int, int], ...] = ()
    # a preempted sequence's K/V: swapped to host, recomputed, or whichever is estimated cheaper
    preemption: str = "auto"  # "auto" | "swap" | "recompute"
    drafter: DrafterConfig | None = field(default_factory=OnnxDrafterConfig)  # None = target only
    acceptance: AcceptancePolicy = AcceptancePolicy()  # requests naming no policy are verified by this one
    overlap: bool = False  # draft the next step on a worker thread while the target verifies this one
    transport: TransportConfig = field(default_factory=TransportConfig)

    @property
    def speculates(self) -> bool:
        return self.drafter is not None and self.num_speculative_tokens > 0

    @property
    def drafter_kind(self) -> str:
        """The drafter kind that runs, or "none"."""
        return self.drafter.kind if self.speculates else "none"

    def validate(self) -> None:
        _choice("dtype", self.dtype, DTYPES)
        _choice("preemption", self.preemption, PREEMPTION_MODES)
        _choice("k_policy", self.k_policy, K_POLICIES)
        _choice("transport.kind", self.transport.kind, TRANSPORT_KINDS)
        if isinstance(self.drafter, TorchDrafterConfig):
            _choice("drafter dtype", self.drafter.dtype, DTYPES)
        if self.overlap and isinstance(self.drafter, CombinedDrafterConfig):
            raise InvalidRequestError("overlap needs a single drafter, not several (speculation.drafters)", "overlap")
        if not 0 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise InvalidRequestError(f"num_speculative_tokens must be in [0, {MAX_SPECULATIVE_TOKENS}]")
        for name in ("kv_block_size", "max_kv_tokens", "max_num_seqs"):
            if getattr(self, name) <= 0:
                raise InvalidRequestError(f"{name} must be positive")


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise InvalidRequestError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
