"""BlockTransfer over gRPC: push one block per call, inline (chunked) or as a shm descriptor.

The server validates every chunk and descriptor before it copies a byte, reads shm payloads
through a ShmReader, and answers INVALID_ARGUMENT naming the field for anything malformed.
"""

import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc

from protocol.codec import Encoded
from protocol.errors import BlockError
from protocol.inline import MAX_CHUNK_BYTES, assemble, to_chunks
from protocol.pb import blocks_pb2 as pb
from protocol.pb import blocks_pb2_grpc
from protocol.shm import ShmReader
from protocol.validate import DEFAULT_LIMITS, Limits, validate_descriptor

# A chunk message is its payload plus a descriptor of a few hundred bytes.
MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + (64 << 10)

# Gets the validated descriptor and payload; the payload is only valid during the call.
OnBlock = Callable[[pb.BlockDescriptor, memoryview], None]


class BlockTransferServicer(blocks_pb2_grpc.BlockTransferServicer):
    """Receives one block per Push call; hands (descriptor, payload) to `on_block`."""

    def __init__(self, limits: Limits = DEFAULT_LIMITS, on_block: OnBlock | None = None):
        self.limits = limits
        self.on_block = on_block
        self.shm = ShmReader()
        self._scratch = threading.local()  # per worker thread: reused receive buffers

    def _buffer(self, nbytes: int) -> memoryview:
        buf = getattr(self._scratch, "buf", None)
        if buf is None or len(buf) < nbytes:
            buf = self._scratch.buf = bytearray(nbytes)
        return memoryview(buf)[:nbytes]

    def Push(self, request_iterator: Iterator[pb.BlockChunk], context: grpc.ServicerContext) -> pb.PushReply:
        try:
            d = self._receive(request_iterator)
        except BlockError as e:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        # the payload's checksum was verified against the descriptor's on receipt
        return pb.PushReply(byte_length=d.byte_length, checksum=d.checksum)

    def _receive(self, chunks: Iterator[pb.BlockChunk]) -> pb.BlockDescriptor:
        first = next(chunks, None)
        if first is None:
            raise BlockError("chunk", "empty stream")
        if first.HasField("descriptor") and first.descriptor.locator.WhichOneof("where") == "shm":
            d = first.descriptor
            validate_descriptor(d, self.limits)
            if first.data or next(chunks, None) is not None:
                raise BlockError("chunk.data", "a shm block is one chunk without data")
            with self.shm.view(d) as payload:  # zero-copy: checked in place
                self._deliver(d, payload)
            return d
        d, payload = assemble(itertools.chain([first], chunks), self.limits, self._buffer)
        self._deliver(d, payload)
        return d

    def _deliver(self, d: pb.BlockDescriptor, payload: memoryview) -> None:
        if self.on_block is not None:
            self.on_block(d, payload)


def serve(host: str = "127.0.0.1", port: int = 0, limits: Limits = DEFAULT_LIMITS,
          on_block: OnBlock | None = None, max_workers: int = 4) -> tuple[grpc.Server, int]:
    """Start a BlockTransfer server (localhost by default); returns (server, bound port)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                                  ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)])
    blocks_pb2_grpc.add_BlockTransferServicer_to_server(BlockTransferServicer(limits, on_block), server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.start()
    return server, bound


def channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target, options=[("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                                  ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])


def push(stub: blocks_pb2_grpc.BlockTransferStub, enc: Encoded, chunk_bytes: int | None = None,
         timeout: float | None = 60.0) -> pb.PushReply:
    """Send one block inline, chunked."""
    return stub.Push(to_chunks(enc, chunk_bytes), timeout=timeout)


def push_descriptor(stub: blocks_pb2_grpc.BlockTransferStub, d: pb.BlockDescriptor,
                    timeout: float | None = 60.0) -> pb.PushReply:
    """Send a descriptor whose bytes are elsewhere (a shm locator): one chunk, no data."""
    return stub.Push(iter([pb.BlockChunk(transfer_id=0, index=0, descriptor=d)]), timeout=timeout)
