"""The block-descriptor protocol: how tensors travel between devices, processes and hosts.

Every tensor that leaves a device or a host is a block: payload bytes plus a descriptor
(`proto/hetspec/v1/blocks.proto`) that says exactly what the bytes are. This package is the
only code that touches descriptors field by field; callers use this door:

    enc = encode(tensor, kind=TensorKind.DRAFT_PROBS, layout=Layout.TOKENS_VOCAB)  # zero-copy
    block = BlockPacker("inline").pack(enc)           # a Block message (or a shm locator)
    d, payload = BlockUnpacker().unpack(block)        # every field validated, checksum verified
    tensor = decode(d, payload, dtype=torch.float32)

    staged = StagingPool("cuda:0").to_host(t)         # device -> pinned host buffer, async

Rooms: `codec` (tensor <-> payload, layouts, wire quantization), `validate` (every field
before any byte), `inline` / `shm` / `message` (transports), `kv` (a sequence's K/V as one
block), `staging` (pinned host buffers), `transfer` (the BlockTransfer gRPC service), `pb`
(generated code; only the service layer imports it directly). Errors are `BlockError`,
naming the offending field.

The names below load on first use (PEP 562), so `import protocol` stays cheap: grpc, xxhash
and the generated code load only when something that needs them is used.
"""

import importlib

_EXPORTS = {
    "codec": ("Encoded", "convert_layout", "decode", "encode", "pool_to_seq", "seq_to_pool"),
    "errors": ("BlockError",),
    "inline": ("Assembler", "assemble", "from_block", "to_block", "to_chunks"),
    "kinds": ("PROTOCOL_VERSION", "ChecksumAlgorithm", "Layout", "QuantScheme", "TensorKind"),
    "kv": ("check_kv_geometry", "encode_kv_pool", "read_kv"),
    "message": ("TRANSPORT_KINDS", "BlockPacker", "BlockUnpacker"),
    "shm": ("ShmReader", "ShmWriter"),
    "staging": ("Staged", "StagingPool"),
    "validate": ("DEFAULT_LIMITS", "Limits", "validate_descriptor", "validate_payload"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_HOME)


def __getattr__(name: str):
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'protocol' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"protocol.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
