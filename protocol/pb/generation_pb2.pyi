from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "token_ids", "raw", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "speculate", "num_speculative_tokens", "ignore_eos", "acceptance", "acceptance_options")
    class AcceptanceOptionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SPECULATE_FIELD_NUMBER: _ClassVar[int]
    NUM_SPECULATIVE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    token_ids: TokenIds
    raw: bool
    max_new_tokens: int
    temperature: float
    top_k: int
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    speculate: bool
    num_speculative_tokens: int
    ignore_eos: bool
    acceptance: str
    acceptance_options: _containers.ScalarMap[str, float]
    def __init__(self, prompt: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., raw: _Optional[bool] = ..., max_new_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., speculate: _Optional[bool] = ..., num_speculative_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., acceptance: _Optional[str] = ..., acceptance_options: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("token_ids", "text", "final")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    final: Final
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., final: _Optional[_Union[Final, _Mapping]] = ...) -> None: ...

class Final(_message.Message):
    __slots__ = ("finish_reason", "usage", "stats")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    finish_reason: str
    usage: Usage
    stats: SpeculationStats
    def __init__(self, finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., stats: _Optional[_Union[SpeculationStats, _Mapping]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ...) -> None: ...

class SpeculationStats(_message.Message):
    __slots__ = ("num_steps", "num_drafted", "num_accepted", "acceptance_rate", "mean_accepted_length", "acceptance_per_position", "drafted_per_position", "time_prefill_s", "time_draft_s", "time_verify_s", "tokens_per_s", "ttft_s", "drafter", "k", "num_fallback_steps", "num_preemptions", "steps_per_k", "expected_committed", "acceptance", "lossy", "tokens_differing", "drift_prob_gap", "budget_exhausted_at", "steps_predrafted")
    class StepsPerKEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: int
        def __init__(self, key: _Optional[int] = ..., value: _Optional[int] = ...) -> None: ...
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFTED_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_RATE_FIELD_NUMBER: _ClassVar[int]
    MEAN_ACCEPTED_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    DRAFTED_PER_POSITION_FIELD_NUMBER: _ClassVar[int]
    TIME_PREFILL_S_FIELD_NUMBER: _ClassVar[int]
    TIME_DRAFT_S_FIELD_NUMBER: _ClassVar[int]
    TIME_VERIFY_S_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TTFT_S_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    K_FIELD_NUMBER: _ClassVar[int]
    NUM_FALLBACK_STEPS_FIELD_NUMBER: _ClassVar[int]
    NUM_PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    STEPS_PER_K_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    ACCEPTANCE_FIELD_NUMBER: _ClassVar[int]
    LOSSY_FIELD_NUMBER: _ClassVar[int]
    TOKENS_DIFFERING_FIELD_NUMBER: _ClassVar[int]
    DRIFT_PROB_GAP_FIELD_NUMBER: _ClassVar[int]
    BUDGET_EXHAUSTED_AT_FIELD_NUMBER: _ClassVar[int]
    STEPS_PREDRAFTED_FIELD_NUMBER: _ClassVar[int]
    num_steps: int
    num_drafted: int
    num_accepted: int
    acceptance_rate: float
    mean_accepted_length: float
    acceptance_per_position: _containers.RepeatedScalarFieldContainer[float]
    drafted_per_position: _containers.RepeatedScalarFieldContainer[int]
    time_prefill_s: float
    time_draft_s: float
    time_verify_s: float
    tokens_per_s: float
    ttft_s: float
    drafter: str
    k: int
    num_fallback_steps: int
    num_preemptions: int
    steps_per_k: _containers.ScalarMap[int, int]
    expected_committed: float
    acceptance: str
    lossy: bool
    tokens_differing: int
    drift_prob_gap: float
    budget_exhausted_at: int
    steps_predrafted: int
    def __init__(self, num_steps: _Optional[int] = ..., num_drafted: _Optional[int] = ..., num_accepted: _Optional[int] = ..., acceptance_rate: _Optional[float] = ..., mean_accepted_length: _Optional[float] = ..., acceptance_per_position: _Optional[_Iterable[float]] = ..., drafted_per_position: _Optional[_Iterable[int]] = ..., time_prefill_s: _Optional[float] = ..., time_draft_s: _Optional[float] = ..., time_verify_s: _Optional[float] = ..., tokens_per_s: _Optional[float] = ..., ttft_s: _Optional[float] = ..., drafter: _Optional[str] = ..., k: _Optional[int] = ..., num_fallback_steps: _Optional[int] = ..., num_preemptions: _Optional[int] = ..., steps_per_k: _Optional[_Mapping[int, int]] = ..., expected_committed: _Optional[float] = ..., acceptance: _Optional[str] = ..., lossy: _Optional[bool] = ..., tokens_differing: _Optional[int] = ..., drift_prob_gap: _Optional[float] = ..., budget_exhausted_at: _Optional[int] = ..., steps_predrafted: _Optional[int] = ...) -> None: ...

class ServerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerStatus(_message.Message):
    __slots__ = ("kv_blocks_total", "kv_blocks_free", "num_running", "num_waiting", "num_steps", "drafter", "drafter_state", "drafter_reconnects", "preemptions_swap", "preemptions_recompute", "max_concurrent_requests", "num_active_requests")
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    NUM_STEPS_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_STATE_FIELD_NUMBER: _ClassVar[int]
    DRAFTER_RECONNECTS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_SWAP_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_RECOMPUTE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACTIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    kv_blocks_total: int
    kv_blocks_free: int
    num_running: int
    num_waiting: int
    num_steps: int
    drafter: str
    drafter_state: str
    drafter_reconnects: int
    preemptions_swap: int
    preemptions_recompute: int
    max_concurrent_requests: int
    num_active_requests: int
    def __init__(self, kv_blocks_total: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., num_steps: _Optional[int] = ..., drafter: _Optional[str] = ..., drafter_state: _Optional[str] = ..., drafter_reconnects: _Optional[int] = ..., preemptions_swap: _Optional[int] = ..., preemptions_recompute: _Optional[int] = ..., max_concurrent_requests: _Optional[int] = ..., num_active_requests: _Optional[int] = ...) -> None: ...
