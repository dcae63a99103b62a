from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROTOCOL_VERSION_UNSPECIFIED: _ClassVar[ProtocolVersion]
    PROTOCOL_VERSION_1: _ClassVar[ProtocolVersion]

class TensorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TENSOR_KIND_UNSPECIFIED: _ClassVar[TensorKind]
    TENSOR_KIND_KV_KEY: _ClassVar[TensorKind]
    TENSOR_KIND_KV_VALUE: _ClassVar[TensorKind]
    TENSOR_KIND_KV: _ClassVar[TensorKind]
    TENSOR_KIND_HIDDEN_STATE: _ClassVar[TensorKind]
    TENSOR_KIND_DRAFT_PROBS: _ClassVar[TensorKind]

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_UINT4: _ClassVar[DType]

class Layout(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LAYOUT_UNSPECIFIED: _ClassVar[Layout]
    LAYOUT_CONTIGUOUS: _ClassVar[Layout]
    LAYOUT_STRIDED: _ClassVar[Layout]
    LAYOUT_KV_POOL: _ClassVar[Layout]
    LAYOUT_KV_SEQ: _ClassVar[Layout]
    LAYOUT_TOKENS_HIDDEN: _ClassVar[Layout]
    LAYOUT_TOKENS_VOCAB: _ClassVar[Layout]

class QuantScheme(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUANT_SCHEME_NONE: _ClassVar[QuantScheme]
    QUANT_SCHEME_INT8_SYMMETRIC: _ClassVar[QuantScheme]
    QUANT_SCHEME_UINT4_ASYMMETRIC: _ClassVar[QuantScheme]

class ChecksumAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CHECKSUM_ALGORITHM_UNSPECIFIED: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_XXH3_64: _ClassVar[ChecksumAlgorithm]
    CHECKSUM_ALGORITHM_CRC32: _ClassVar[ChecksumAlgorithm]
PROTOCOL_VERSION_UNSPECIFIED: ProtocolVersion
PROTOCOL_VERSION_1: ProtocolVersion
TENSOR_KIND_UNSPECIFIED: TensorKind
TENSOR_KIND_KV_KEY: TensorKind
TENSOR_KIND_KV_VALUE: TensorKind
TENSOR_KIND_KV: TensorKind
TENSOR_KIND_HIDDEN_STATE: TensorKind
TENSOR_KIND_DRAFT_PROBS: TensorKind
DTYPE_UNSPECIFIED: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_INT8: DType
DTYPE_UINT4: DType
LAYOUT_UNSPECIFIED: Layout
LAYOUT_CONTIGUOUS: Layout
LAYOUT_STRIDED: Layout
LAYOUT_KV_POOL: Layout
LAYOUT_KV_SEQ: Layout
LAYOUT_TOKENS_HIDDEN: Layout
LAYOUT_TOKENS_VOCAB: Layout
QUANT_SCHEME_NONE: QuantScheme
QUANT_SCHEME_INT8_SYMMETRIC: QuantScheme
QUANT_SCHEME_UINT4_ASYMMETRIC: QuantScheme
CHECKSUM_ALGORITHM_UNSPECIFIED: ChecksumAlgorithm
CHECKSUM_ALGORITHM_XXH3_64: ChecksumAlgorithm
CHECKSUM_ALGORITHM_CRC32: ChecksumAlgorithm

class Range(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: int
    end: int
    def __init__(self, start: _Optional[int] = ..., end: _Optional[int] = ...) -> None: ...

class DeviceRef(_message.Message):
    __slots__ = ("type", "index")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    type: str
    index: int
    def __init__(self, type: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class Quantization(_message.Message):
    __slots__ = ("scheme", "group_size", "scales_offset", "zero_points_offset")
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    GROUP_SIZE_FIELD_NUMBER: _ClassVar[int]
    SCALES_OFFSET_FIELD_NUMBER: _ClassVar[int]
    ZERO_POINTS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    scheme: QuantScheme
    group_size: int
    scales_offset: int
    zero_points_offset: int
    def __init__(self, scheme: _Optional[_Union[QuantScheme, str]] = ..., group_size: _Optional[int] = ..., scales_offset: _Optional[int] = ..., zero_points_offset: _Optional[int] = ...) -> None: ...

class InlineLocator(_message.Message):
    __slots__ = ("num_chunks",)
    NUM_CHUNKS_FIELD_NUMBER: _ClassVar[int]
    num_chunks: int
    def __init__(self, num_chunks: _Optional[int] = ...) -> None: ...

class ShmLocator(_message.Message):
    __slots__ = ("segment", "offset", "generation")
    SEGMENT_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    segment: str
    offset: int
    generation: int
    def __init__(self, segment: _Optional[str] = ..., offset: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class Locator(_message.Message):
    __slots__ = ("inline", "shm")
    INLINE_FIELD_NUMBER: _ClassVar[int]
    SHM_FIELD_NUMBER: _ClassVar[int]
    inline: InlineLocator
    shm: ShmLocator
    def __init__(self, inline: _Optional[_Union[InlineLocator, _Mapping]] = ..., shm: _Optional[_Union[ShmLocator, _Mapping]] = ...) -> None: ...

class BlockDescriptor(_message.Message):
    __slots__ = ("protocol_version", "kind", "model_id", "layers", "heads", "sequence_id", "tokens", "dtype", "shape", "layout", "strides", "quantization", "source_device", "byte_length", "checksum_algorithm", "checksum", "locator", "block_size")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    STRIDES_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_DEVICE_FIELD_NUMBER: _ClassVar[int]
    BYTE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    LOCATOR_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    protocol_version: ProtocolVersion
    kind: TensorKind
    model_id: str
    layers: Range
    heads: Range
    sequence_id: int
    tokens: Range
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    layout: Layout
    strides: _containers.RepeatedScalarFieldContainer[int]
    quantization: Quantization
    source_device: DeviceRef
    byte_length: int
    checksum_algorithm: ChecksumAlgorithm
    checksum: int
    locator: Locator
    block_size: int
    def __init__(self, protocol_version: _Optional[_Union[ProtocolVersion, str]] = ..., kind: _Optional[_Union[TensorKind, str]] = ..., model_id: _Optional[str] = ..., layers: _Optional[_Union[Range, _Mapping]] = ..., heads: _Optional[_Union[Range, _Mapping]] = ..., sequence_id: _Optional[int] = ..., tokens: _Optional[_Union[Range, _Mapping]] = ..., dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., layout: _Optional[_Union[Layout, str]] = ..., strides: _Optional[_Iterable[int]] = ..., quantization: _Optional[_Union[Quantization, _Mapping]] = ..., source_device: _Optional[_Union[DeviceRef, _Mapping]] = ..., byte_length: _Optional[int] = ..., checksum_algorithm: _Optional[_Union[ChecksumAlgorithm, str]] = ..., checksum: _Optional[int] = ..., locator: _Optional[_Union[Locator, _Mapping]] = ..., block_size: _Optional[int] = ...) -> None: ...

class Block(_message.Message):
    __slots__ = ("descriptor", "data")
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    descriptor: BlockDescriptor
    data: bytes
    def __init__(self, descriptor: _Optional[_Union[BlockDescriptor, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class BlockChunk(_message.Message):
    __slots__ = ("transfer_id", "index", "descriptor", "data")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTOR_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    transfer_id: int
    index: int
    descriptor: BlockDescriptor
    data: bytes
    def __init__(self, transfer_id: _Optional[int] = ..., index: _Optional[int] = ..., descriptor: _Optional[_Union[BlockDescriptor, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("byte_length", "checksum")
    BYTE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    CHECKSUM_FIELD_NUMBER: _ClassVar[int]
    byte_length: int
    checksum: int
    def __init__(self, byte_length: _Optional[int] = ..., checksum: _Optional[int] = ...) -> None: ...
