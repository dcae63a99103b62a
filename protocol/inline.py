"""Inline transport: the payload rides inside protobuf messages, chunked above a size limit."""

import itertools
from collections.abc import Iterable, Iterator

from protocol.codec import Encoded
from protocol.errors import BlockError
from protocol.pb import blocks_pb2 as pb
from protocol.validate import DEFAULT_LIMITS, Limits, validate_descriptor, validate_payload

MAX_CHUNK_BYTES = 2 << 20  # well under gRPC's 4 MiB default message limit
MIN_CHUNK_BYTES = 256 << 10


def chunk_size(nbytes: int) -> int:
    """About 8 chunks per block within [256 KiB, 2 MiB]: enough in flight for sender and
    receiver to overlap on small blocks, few Python objects per byte on large ones."""
    return min(MAX_CHUNK_BYTES, max(MIN_CHUNK_BYTES, nbytes // 8))

_transfer_ids = itertools.count(1)


def to_block(enc: Encoded) -> pb.Block:
    """One message holding descriptor and payload (small blocks)."""
    d = pb.BlockDescriptor()
    d.CopyFrom(enc.descriptor)
    d.locator.inline.num_chunks = 0
    return pb.Block(descriptor=d, data=enc.payload.tobytes())


def parse_block(data: bytes) -> pb.Block:
    """A Block from wire bytes; malformed protobuf becomes a BlockError."""
    try:
        return pb.Block.FromString(data)
    except Exception as e:  # protobuf raises DecodeError, and RuntimeError for some corruptions
        raise BlockError("block", f"not a valid Block message ({type(e).__name__})") from None


def from_block(block: pb.Block, limits: Limits = DEFAULT_LIMITS) -> tuple[pb.BlockDescriptor, bytes]:
    """Validate a single-message block; return (descriptor, payload)."""
    d = block.descriptor
    validate_descriptor(d, limits)
    if d.locator.WhichOneof("where") != "inline" or d.locator.inline.num_chunks != 0:
        raise BlockError("locator", "a single-message block must be inline with num_chunks 0")
    validate_payload(d, block.data)
    return d, block.data


def to_chunks(enc: Encoded, chunk_bytes: int | None = None) -> Iterator[pb.BlockChunk]:
    """Split a block into BlockChunk messages of at most `chunk_bytes` payload each (default: chunk_size)."""
    n = enc.payload.nbytes
    chunk_bytes = chunk_bytes or chunk_size(n)
    num_chunks = max(1, -(-n // chunk_bytes))
    d = pb.BlockDescriptor()
    d.CopyFrom(enc.descriptor)
    d.locator.inline.num_chunks = num_chunks
    transfer_id = next(_transfer_ids)
    for i in range(num_chunks):
        data = enc.payload[i * chunk_bytes:(i + 1) * chunk_bytes].tobytes()
        yield pb.BlockChunk(transfer_id=transfer_id, index=i, descriptor=d if i == 0 else None, data=data)


class Assembler:
    """Reassembles one chunked transfer, validating before it allocates or copies anything."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, allocate=None):
        self.limits = limits
        self.allocate = allocate or bytearray  # nbytes -> writable buffer (a reusable one, say)
        self.descriptor: pb.BlockDescriptor | None = None
        self._buf = None
        self._filled = 0
        self._next = 0
        self._transfer_id = 0

    def add(self, chunk: pb.BlockChunk) -> tuple[pb.BlockDescriptor, memoryview] | None:
        """Take the next chunk; return (descriptor, payload) after the last one."""
        if self._next == 0:
            self._start(chunk)
        elif chunk.transfer_id != self._transfer_id:
            raise BlockError("chunk.transfer_id", f"{chunk.transfer_id} interleaved into transfer {self._transfer_id}")
        elif chunk.HasField("descriptor"):
            raise BlockError("chunk.descriptor", "only the first chunk carries a descriptor")
        if chunk.index != self._next:
            raise BlockError("chunk.index", f"got {chunk.index}, expected {self._next}")
        end = self._filled + len(chunk.data)
        if end > self._buf.nbytes:
            raise BlockError("chunk.data", f"transfer overruns byte_length {self._buf.nbytes}")
        self._buf[self._filled:end] = chunk.data
        self._filled, self._next = end, self._next + 1
        if self._next < self.descriptor.locator.inline.num_chunks:
            return None
        if self._filled != self._buf.nbytes:
            raise BlockError("data", f"transfer carried {self._filled} of {self._buf.nbytes} bytes")
        validate_payload(self.descriptor, self._buf)
        return self.descriptor, self._buf

    def _start(self, chunk: pb.BlockChunk) -> None:
        if not chunk.HasField("descriptor"):
            raise BlockError("chunk.descriptor", "the first chunk must carry the descriptor")
        d = chunk.descriptor
        validate_descriptor(d, self.limits)
        if d.locator.WhichOneof("where") != "inline" or d.locator.inline.num_chunks == 0:
            raise BlockError("locator.inline.num_chunks", "a chunked transfer needs an inline locator with num_chunks >= 1")
        self.descriptor, self._transfer_id = d, chunk.transfer_id
        self._buf = memoryview(self.allocate(d.byte_length))

    @property
    def incomplete(self) -> bool:
        return self._next > 0 and self._next < self.descriptor.locator.inline.num_chunks


def assemble(chunks: Iterable[pb.BlockChunk], limits: Limits = DEFAULT_LIMITS,
             allocate=None) -> tuple[pb.BlockDescriptor, memoryview]:
    """Reassemble exactly one transfer from a chunk stream (chunks after the last are an error)."""
    assembler = Assembler(limits, allocate)
    done = None
    for chunk in chunks:
        if done is not None:
            raise BlockError("chunk.index", "chunks after the last one")
        done = assembler.add(chunk)
    if done is None:
        raise BlockError("chunk.index", "stream ended before the last chunk" if assembler.incomplete else "no chunks")
    return done
