"""The descriptor's enums as Python IntEnums, so callers above the protocol never import protobuf."""

from enum import IntEnum

from protocol.pb import blocks_pb2 as pb


class TensorKind(IntEnum):
    KV_KEY = pb.TENSOR_KIND_KV_KEY
    KV_VALUE = pb.TENSOR_KIND_KV_VALUE
    KV = pb.TENSOR_KIND_KV
    HIDDEN_STATE = pb.TENSOR_KIND_HIDDEN_STATE
    DRAFT_PROBS = pb.TENSOR_KIND_DRAFT_PROBS


class Layout(IntEnum):
    CONTIGUOUS = pb.LAYOUT_CONTIGUOUS
    STRIDED = pb.LAYOUT_STRIDED
    KV_POOL = pb.LAYOUT_KV_POOL  # [layers, 2, blocks, block_size, kv_heads, head_dim]
    KV_SEQ = pb.LAYOUT_KV_SEQ  # [layers, 2, kv_heads, tokens, head_dim]
    TOKENS_HIDDEN = pb.LAYOUT_TOKENS_HIDDEN  # [tokens, hidden]
    TOKENS_VOCAB = pb.LAYOUT_TOKENS_VOCAB  # [tokens, vocab]


class QuantScheme(IntEnum):
    NONE = pb.QUANT_SCHEME_NONE
    INT8_SYMMETRIC = pb.QUANT_SCHEME_INT8_SYMMETRIC
    UINT4_ASYMMETRIC = pb.QUANT_SCHEME_UINT4_ASYMMETRIC


class ChecksumAlgorithm(IntEnum):
    XXH3_64 = pb.CHECKSUM_ALGORITHM_XXH3_64
    CRC32 = pb.CHECKSUM_ALGORITHM_CRC32


PROTOCOL_VERSION = pb.PROTOCOL_VERSION_1
