"""The profile schema: typed sections with defaults, unknown keys refused, devices parsed (not probed).

Pure data: each drafter section turns into its kind's `orchestrator.config` record; nothing here
probes a device, reads a file or the environment.
"""

import re
from typing import Annotated, Literal, Union

from pydantic import (
    AfterValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    field_validator,
    model_validator,
)

from devices import DeviceUnavailable, device_unavailable_reason, ort_placement, ort_unavailable_reason, parse_device
from orchestrator.acceptance_policy import AcceptancePolicy
from orchestrator.config import (
    AUTO_K_MAX,
    DTYPES,
    MAX_SPECULATIVE_TOKENS,
    TRANSPORT_KINDS,
    MtpDrafterConfig,
    NgramDrafterConfig,
    OnnxDrafterConfig,
    RemoteDrafterConfig,
    TorchDrafterConfig,
    TransportConfig,
)
from orchestrator.profiles.cluster_schema import ClusterSpec
from orchestrator.profiles.schema_base import PositiveInt, Section

DRAFTER_KINDS = ("onnx", "torch", "ngram", "mtp", "remote")
Dtype = Literal[DTYPES]
DrafterName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]


def _check_device(name: str) -> str:
    try:
        parse_device(name)
    except DeviceUnavailable as e:
        raise ValueError(str(e)) from None
    return name


def _check_scalar(value):
    if not isinstance(value, (str, int, float, bool)):
        raise ValueError(f"expected a string, number or boolean, got {type(value).__name__}")
    return value


Scalar = Annotated[object, AfterValidator(_check_scalar)]
Device = Annotated[str, AfterValidator(_check_device)]  # cpu, cuda:N, npu:N (parsed, not probed)


class Placement(Section):
    """Where a model runs: a torch device name and a dtype."""

    device: Device
    dtype: Dtype = "float32"


class KvSpec(Section):
    block_size: PositiveInt = 16  # tokens per KV block
    max_tokens: PositiveInt = 8192  # KV pool capacity in tokens (all sequences together)


class TargetSpec(Placement):
    """The verifying model. `fallback`: placements tried in order when `device` is missing."""

    model: str | None = None  # HF dir, GGUF file, or smollm2-135m / gemma3-270m; None = smollm2-135m
    kv: KvSpec = KvSpec()
    max_num_seqs: PositiveInt = 16
    fallback: list[Placement] = []


class _DrafterBase(Section):
    """Every drafter kind: `describe()`, `unavailable_reason()` ('' = runs here), `drafter_config()`."""

    fallback: list[DrafterName] = []  # other drafter names, tried in order when this one cannot run


class OnnxDrafterSpec(_DrafterBase):
    """An exported ONNX decoder on ONNX Runtime; `device` picks the execution provider."""

    kind: Literal["onnx"]
    model: str | None = None  # checkpoint to export; None = the target's
    device: Device = "cpu"
    precision: Literal["int4", "int8", "fp32"] = "int4"
    block_size: Literal[16, 32, 64, 128, 256] = 32
    int8_lm_head: bool = True
    # take the target's prefill K/V instead of a drafter prefill; auto: on for a self-drafter (no model)
    kv_handoff: bool | Literal["auto"] = "auto"
    provider_options: dict[str, Scalar] = {}  # passed to the provider as strings
    threads: Annotated[int, Field(ge=1, le=256)] | None = None  # ONNX Runtime intra-op threads (default: one per core)

    def describe(self) -> str:
        return f"onnx {self.precision} on {self.device} ({ort_placement(self.device).provider.name})"

    def unavailable_reason(self) -> str:
        return ort_unavailable_reason(self.device)

    def drafter_config(self) -> OnnxDrafterConfig:
        return OnnxDrafterConfig(model=self.model, device=self.device, precision=self.precision,
                                 block_size=self.block_size, int8_lm_head=self.int8_lm_head,
                                 kv_handoff=self.kv_handoff, provider_options=dict(self.provider_options),
                                 threads=self.threads)


class TorchDrafterSpec(_DrafterBase):
    """A small torch model run by the same runner as the target (e.g. on npu:0)."""

    kind: Literal["torch"]
    model: str | None = None  # None = the target's checkpoint (self-drafting; a test setup)
    device: Device = "cpu"
    dtype: Dtype = "float32"
    max_kv_tokens: PositiveInt | None = None  # None = the target's KV capacity

    def describe(self) -> str:
        return f"torch {self.dtype} on {self.device}"

    def unavailable_reason(self) -> str:
        return device_unavailable_reason(self.device)

    def drafter_config(self) -> TorchDrafterConfig:
        return TorchDrafterConfig(model=self.model, device=self.device, dtype=self.dtype,
                                  max_kv_tokens=self.max_kv_tokens)


class NgramDrafterSpec(_DrafterBase):
    """Prompt lookup over the sequence's own tokens; runs on the host, needs no model."""

    kind: Literal["ngram"]
    max_ngram: PositiveInt = 3

    def describe(self) -> str:
        return f"n-gram lookup (max n {self.max_ngram}) on the host"

    def unavailable_reason(self) -> str:
        return ""

    def drafter_config(self) -> NgramDrafterConfig:
        return NgramDrafterConfig(max_ngram=self.max_ngram)


class MtpDrafterSpec(_DrafterBase):
    """A multi-token-prediction drafter trained for the target (`hetspec train-drafter`); it reads the
    target's hidden states, handed to it as HIDDEN_STATE blocks after every verify."""

    kind: Literal["mtp"]
    model: str  # the directory `hetspec train-drafter --out` wrote
    device: Device = "cpu"
    dtype: Dtype = "float32"  # the torch runtime's
    # onnx: its ONNX export on the device's ONNX Runtime provider; auto: torch or the fp32 export,
    # whichever a call takes less time on, timed at start-up
    runtime: Literal["torch", "onnx", "auto"] = "auto"
    precision: Literal["int4", "int8", "fp32"] = "int4"  # the onnx runtime's

    def describe(self) -> str:
        if self.runtime == "onnx":
            return f"mtp {self.model} (onnx {self.precision}) on {self.device} ({ort_placement(self.device).provider.name})"
        if self.runtime == "auto":
            return f"mtp {self.model} (torch {self.dtype} or onnx fp32, timed at start-up) on {self.device}"
        return f"mtp {self.model} (torch {self.dtype}) on {self.device}"

    def unavailable_reason(self) -> str:
        if self.runtime == "onnx":
            return ort_unavailable_reason(self.device)
        if self.runtime == "auto":  # runs where either runtime does
            torch_reason = device_unavailable_reason(self.device)
            return torch_reason if torch_reason and ort_unavailable_reason(self.device) else ""
        return device_unavailable_reason(self.device)

    def drafter_config(self) -> MtpDrafterConfig:
        return MtpDrafterConfig(model=self.model, device=self.device, dtype=self.dtype, runtime=self.runtime,
                                precision=self.precision)


class RemoteDrafterSpec(_DrafterBase):
    """A drafter in another process or host, served by `hetspec drafter serve`, over gRPC.

    Whether it answers is only known at run time: until it does (and whenever it dies or
    stalls past `timeout_s`) the engine runs target-only and keeps reconnecting.
    """

    kind: Literal["remote"]
    address: str  # host:port
    tls: bool = False  # TLS with the system's roots, or `ca_file`
    ca_file: str | None = None  # trust this CA for the drafter's certificate (implies TLS)
    cert_file: str | None = None  # client certificate, for drafters that require one
    key_file: str | None = None
    token_env: str | None = None  # environment variable holding the drafter's bearer token
    timeout_s: Annotated[float, Field(gt=0)] = 5.0
    kv_handoff: bool = False  # open sequences with the target's prefill K/V (the drafter must be a self-drafter of the target)
    hidden_states: bool = False  # send the target's last hidden states after every verify (the drafter is an mtp drafter)

    @field_validator("address")
    @classmethod
    def _host_port(cls, v: str) -> str:
        m = re.fullmatch(r"(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d+)", v)
        if not m or not 0 < int(m[2]) < 65536:
            raise ValueError(f"expected host:port with a port in 1..65535, got {v!r}")
        return v

    @model_validator(mode="after")
    def _client_cert_pair(self):
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together")
        return self

    def describe(self) -> str:
        secure = " (TLS)" if self.tls or self.ca_file else ""
        return f"remote at {self.address}{secure}, target-only while it does not answer within {self.timeout_s:g} s"

    def unavailable_reason(self) -> str:
        return ""  # reachability is a run-time matter: the engine fails over and reconnects

    def drafter_config(self) -> RemoteDrafterConfig:
        return RemoteDrafterConfig(address=self.address, timeout_s=self.timeout_s, tls=self.tls,
                                   ca_file=self.ca_file, cert_file=self.cert_file, key_file=self.key_file,
                                   token_env=self.token_env, kv_handoff=self.kv_handoff,
                                   hidden_states=self.hidden_states)


DrafterSpec = Annotated[Union[OnnxDrafterSpec, TorchDrafterSpec, NgramDrafterSpec, MtpDrafterSpec, RemoteDrafterSpec],
                        Field(discriminator="kind")]


SpecK = Annotated[int, Field(ge=0, le=MAX_SPECULATIVE_TOKENS)]


def _k_or_auto(value):
    if value == "auto":
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SPECULATIVE_TOKENS:
        raise ValueError(f"must be auto or a whole number in 0..{MAX_SPECULATIVE_TOKENS}, got {value!r}")
    return value


KOrAuto = Annotated[Union[int, str], PlainValidator(_k_or_auto)]


def _verification(value) -> AcceptancePolicy:
    """`speculation.verification`: "exact", a policy name, or a mapping with `policy` and its options."""
    if isinstance(value, AcceptancePolicy):
        return value
    if isinstance(value, str):
        name, options = ("rejection" if value == "exact" else value), {}
    elif isinstance(value, dict) and isinstance(value.get("policy"), str):
        options = dict(value)
        name = options.pop("policy")
    else:
        raise ValueError(f"a policy name or {{policy: NAME, option: value}}, got {value!r}")
    try:
        return AcceptancePolicy.parse(name, options, "policy", "")
    except ValueError as e:
        raise ValueError(str(e)) from None


class SpeculationSpec(Section):
    """Which drafter, how many tokens, how to verify. `drafter: null` = target only.

    `num_speculative_tokens: auto` lets the cost model choose each sequence's k every step (0 where
    speculation does not pay), up to `max_speculative_tokens`; a number fixes k, optionally under
    `adaptive_k` (HF's +2/-1) or the batch-size rules of vLLM (`disable_by_batch_size`) and
    TensorRT-LLM (`draft_len_schedule`: batch size -> k), kept as baselines.
    """

    drafter: DrafterName | None = None
    # several drafters at once instead of `drafter`, cheapest first; per sequence and step the draft
    # expected to commit most is kept (`combine: confidence`)
    drafters: list[DrafterName] = []
    combine: Literal["confidence"] = "confidence"
    num_speculative_tokens: KOrAuto = "auto"  # k
    max_speculative_tokens: Annotated[int, Field(ge=1, le=MAX_SPECULATIVE_TOKENS)] = AUTO_K_MAX  # auto's cap
    adaptive_k: bool = False
    disable_by_batch_size: PositiveInt | None = None
    draft_len_schedule: dict[PositiveInt, SpecK] = {}
    # the acceptance policy of requests that name none: a name, or {policy: NAME, option: value, ...};
    # "exact" = rejection (lossless). Lossy ones judge greedy requests only.
    verification: Annotated[AcceptancePolicy, PlainValidator(_verification),
                            PlainSerializer(lambda p: {"policy": p.name, **dict(p.options)})] = AcceptancePolicy()
    # draft step t+1 while the target verifies step t (greedy requests; one drafter, not several)
    overlap: bool = False

    @model_validator(mode="after")
    def _one_drafter_or_several(self):
        if self.drafters:
            if self.drafter is not None:
                raise ValueError("give drafter or drafters, not both")
            if len(self.drafters) < 2 or len(set(self.drafters)) != len(self.drafters):
                raise ValueError(f"drafters: at least two different drafters, got {self.drafters}")
            if self.overlap:
                raise ValueError("overlap needs a single drafter, not several (drafters)")
        return self

    @model_validator(mode="after")
    def _rules_need_a_fixed_k(self):
        if self.num_speculative_tokens == "auto":
            for key in ("adaptive_k", "disable_by_batch_size", "draft_len_schedule"):
                if getattr(self, key):
                    raise ValueError(f"{key} applies to a fixed num_speculative_tokens, not auto")
        return self

    def k_and_policy(self) -> tuple[int, str]:
        """(k or auto's cap, policy)."""
        if self.num_speculative_tokens == "auto":
            return self.max_speculative_tokens, "auto"
        return self.num_speculative_tokens, "adaptive" if self.adaptive_k else "fixed"


class ProfilingSpec(Section):
    """Defaults for `hetspec profile run` (profiling workloads)."""

    workload: Annotated[str, Field(min_length=1)] = "chat"  # a workload name or a prompts file
    k_sweep: Annotated[list[Annotated[int, Field(ge=0, le=MAX_SPECULATIVE_TOKENS)]], Field(min_length=1)] = [1, 2, 4, 8]
    max_new_tokens: PositiveInt = 128
    num_prompts: PositiveInt = 5
    warmup: Annotated[int, Field(ge=0)] = 1  # short requests per side before measuring
    # (a target-only baseline always runs: the speedup and the bound need it)
    output_dir: Annotated[str, Field(min_length=1)] = "hetspec-profile"
    trace: bool = True  # write a Perfetto-viewable trace

    def draft_lengths(self) -> list[int]:
        """The speculative sides to measure; k = 0 means the baseline, which always runs."""
        return sorted({k for k in self.k_sweep if k > 0}) or [1, 2, 4, 8]


class TransportSpec(Section):
    """How blocks leave a device and travel to a peer (`transport_config()` for the engine)."""

    # blocks this process sends (KV handoff, a drafter server's probabilities): bytes inside the
    # message, or a shared-memory segment the peer reads (peers on the same host only)
    kind: Literal[TRANSPORT_KINDS] = "inline"
    pinned_staging: bool = True  # page-locked staging buffers where the device supports them
    staging_pool_bytes: PositiveInt = 64 << 20  # staging buffers kept for reuse
    max_message_bytes: PositiveInt = 64 << 20  # gRPC messages, both directions

    def transport_config(self) -> TransportConfig:
        return TransportConfig(kind=self.kind, pinned_staging=self.pinned_staging,
                               staging_pool_bytes=self.staging_pool_bytes, max_message_bytes=self.max_message_bytes)


class TlsSpec(Section):
    cert_file: str
    key_file: str
    ca_file: str | None = None  # set to require client certificates


class ServerSpec(Section):
    """gRPC services. Localhost by default; auth token read from the named environment variable."""

    host: Annotated[str, Field(min_length=1)] = "127.0.0.1"
    port: Annotated[int, Field(ge=1, le=65535)] = 50051
    drafter_port: Annotated[int, Field(ge=1, le=65535)] = 50061
    max_concurrent_requests: PositiveInt = 16  # generations running at once (and at most target.max_num_seqs)
    max_queued_requests: Annotated[int, Field(ge=0)] = 256  # more wait, holding no KV; past: RESOURCE_EXHAUSTED / 429
    http_port: Annotated[int, Field(ge=0, le=65535)] | None = None  # OpenAI-compatible HTTP; None = off
    max_new_tokens: PositiveInt = 4096  # per-request limit on max_new_tokens
    metrics_port: Annotated[int, Field(ge=0, le=65535)] | None = None  # Prometheus /metrics on host:port; None = off
    tls: TlsSpec | None = None
    auth_token_env: str | None = None
    # hold a Linux CPU latency QoS request of this many microseconds while serving (0: idle CPUs poll
    # instead of halting, so a message wakes its reader sooner); None = the kernel's default
    cpu_latency_us: Annotated[int, Field(ge=0, le=2_000_000_000)] | None = None


class ProfileSpec(Section):
    """A whole profile file, as validated (cross-references are checked by the loader)."""

    version: Literal[1]
    name: str | None = None
    description: str = ""
    target: TargetSpec
    drafters: dict[DrafterName, DrafterSpec] = {}
    speculation: SpeculationSpec = SpeculationSpec()
    profiling: ProfilingSpec = ProfilingSpec()
    transport: TransportSpec = TransportSpec()
    server: ServerSpec = ServerSpec()
    cluster: ClusterSpec | None = None  # drafter pools and target replicas on Ray (`hetspec cluster`)
