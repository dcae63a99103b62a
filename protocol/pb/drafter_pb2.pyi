from protocol.pb import blocks_pb2 as _blocks_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSequence(_message.Message):
    __slots__ = ("sequence_id", "prompt_ids", "kv_blocks", "seed")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    kv_blocks: _containers.RepeatedCompositeFieldContainer[_blocks_pb2.Block]
    seed: int
    def __init__(self, sequence_id: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., kv_blocks: _Optional[_Iterable[_Union[_blocks_pb2.Block, _Mapping]]] = ..., seed: _Optional[int] = ...) -> None: ...

class DraftRequest(_message.Message):
    __slots__ = ("sequence_id", "num_draft", "want_probs", "temperature", "top_k", "top_p")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_FIELD_NUMBER: _ClassVar[int]
    WANT_PROBS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    num_draft: int
    want_probs: bool
    temperature: float
    top_k: int
    top_p: float
    def __init__(self, sequence_id: _Optional[int] = ..., num_draft: _Optional[int] = ..., want_probs: _Optional[bool] = ..., temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ...) -> None: ...

class DraftProposal(_message.Message):
    __slots__ = ("sequence_id", "draft_ids", "draft_probs")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    DRAFT_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAFT_PROBS_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    draft_ids: _containers.RepeatedScalarFieldContainer[int]
    draft_probs: _blocks_pb2.Block
    def __init__(self, sequence_id: _Optional[int] = ..., draft_ids: _Optional[_Iterable[int]] = ..., draft_probs: _Optional[_Union[_blocks_pb2.Block, _Mapping]] = ...) -> None: ...

class VerifyResult(_message.Message):
    __slots__ = ("sequence_id", "num_accepted", "bonus_token_id", "rollback_to", "hidden_states", "append_ids")
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    BONUS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    ROLLBACK_TO_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_STATES_FIELD_NUMBER: _ClassVar[int]
    APPEND_IDS_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    num_accepted: int
    bonus_token_id: int
    rollback_to: int
    hidden_states: _blocks_pb2.Block
    append_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, sequence_id: _Optional[int] = ..., num_accepted: _Optional[int] = ..., bonus_token_id: _Optional[int] = ..., rollback_to: _Optional[int] = ..., hidden_states: _Optional[_Union[_blocks_pb2.Block, _Mapping]] = ..., append_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class CloseSequence(_message.Message):
    __slots__ = ("sequence_id",)
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    sequence_id: int
    def __init__(self, sequence_id: _Optional[int] = ...) -> None: ...

class DrafterRequest(_message.Message):
    __slots__ = ("protocol_version", "request_id", "open", "propose", "verify", "close")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OPEN_FIELD_NUMBER: _ClassVar[int]
    PROPOSE_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: _blocks_pb2.ProtocolVersion
    request_id: int
    open: OpenSequence
    propose: ProposeBatch
    verify: VerifyBatch
    close: CloseSequence
    def __init__(self, protocol_version: _Optional[_Union[_blocks_pb2.ProtocolVersion, str]] = ..., request_id: _Optional[int] = ..., open: _Optional[_Union[OpenSequence, _Mapping]] = ..., propose: _Optional[_Union[ProposeBatch, _Mapping]] = ..., verify: _Optional[_Union[VerifyBatch, _Mapping]] = ..., close: _Optional[_Union[CloseSequence, _Mapping]] = ...) -> None: ...

class ProposeBatch(_message.Message):
    __slots__ = ("requests", "results")
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[DraftRequest]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    def __init__(self, requests: _Optional[_Iterable[_Union[DraftRequest, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ...) -> None: ...

class VerifyBatch(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[VerifyResult]
    def __init__(self, results: _Optional[_Iterable[_Union[VerifyResult, _Mapping]]] = ...) -> None: ...

class ProposalBatch(_message.Message):
    __slots__ = ("proposals", "compute_ns", "catch_up_ns", "catch_up_tokens")
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_NS_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_NS_FIELD_NUMBER: _ClassVar[int]
    CATCH_UP_TOKENS_FIELD_NUMBER: _ClassVar[int]
    proposals: _containers.RepeatedCompositeFieldContainer[DraftProposal]
    compute_ns: int
    catch_up_ns: int
    catch_up_tokens: int
    def __init__(self, proposals: _Optional[_Iterable[_Union[DraftProposal, _Mapping]]] = ..., compute_ns: _Optional[int] = ..., catch_up_ns: _Optional[int] = ..., catch_up_tokens: _Optional[int] = ...) -> None: ...

class DrafterResponse(_message.Message):
    __slots__ = ("protocol_version", "request_id", "proposals", "ack")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    protocol_version: _blocks_pb2.ProtocolVersion
    request_id: int
    proposals: ProposalBatch
    ack: Ack
    def __init__(self, protocol_version: _Optional[_Union[_blocks_pb2.ProtocolVersion, str]] = ..., request_id: _Optional[int] = ..., proposals: _Optional[_Union[ProposalBatch, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("num_tokens",)
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_tokens: int
    def __init__(self, num_tokens: _Optional[int] = ...) -> None: ...
