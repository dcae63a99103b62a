"""Blocks inside protobuf messages: the payload inline, or in a shared-memory segment.

`BlockPacker` is the sending side of a transport kind (`inline` or `shared_memory`);
`BlockUnpacker` receives either kind and returns a validated, checksum-verified payload.
Shared memory is for peers on the same host. The packer rewrites its segments batch by
batch, so a batch's blocks stay valid until the next `pack_batch`: pack once per round
trip, after the peer has read the previous batch (answers read in order guarantee it).
"""

from protocol.codec import Encoded
from protocol.errors import BlockError
from protocol.inline import from_block, to_block
from protocol.pb import blocks_pb2 as pb
from protocol.shm import ShmReader, ShmWriter
from protocol.validate import DEFAULT_LIMITS, Limits, validate_descriptor

TRANSPORT_KINDS = ("inline", "shared_memory")


class BlockPacker:
    """Encoded blocks -> Block messages, by the configured transport kind."""

    def __init__(self, kind: str = "inline"):
        if kind not in TRANSPORT_KINDS:
            raise ValueError(f"transport kind must be one of {', '.join(TRANSPORT_KINDS)}, got {kind!r}")
        self.kind = kind
        self._writer = ShmWriter(num_slots=1) if kind == "shared_memory" else None

    def pack_batch(self, encoded: list[Encoded]) -> list[pb.Block]:
        """One Block per encoded tensor; shared-memory blocks replace the previous batch's."""
        if self._writer is None:
            return [to_block(enc) for enc in encoded]
        return [pb.Block(descriptor=d) for d in self._writer.write_batch(encoded)]

    def pack(self, enc: Encoded) -> pb.Block:
        return self.pack_batch([enc])[0]

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class BlockUnpacker:
    """Block messages of either transport kind -> (descriptor, payload), validated first."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS):
        self.limits = limits
        self._reader: ShmReader | None = None  # attached on the first shared-memory block
        self.num_blocks = 0
        self.num_shm_blocks = 0  # of which came through shared memory

    def unpack(self, block: pb.Block) -> tuple[pb.BlockDescriptor, bytes | bytearray]:
        d = block.descriptor
        self.num_blocks += 1
        if d.locator.WhichOneof("where") != "shm":
            return from_block(block, self.limits)
        self.num_shm_blocks += 1
        validate_descriptor(d, self.limits)
        if block.data:
            raise BlockError("data", "a shared-memory block carries no bytes in the message")
        if self._reader is None:
            self._reader = ShmReader()
        return d, self._reader.read(d)  # copied out, generation and checksum checked

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
