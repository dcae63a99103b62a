"""Shared-memory transport for co-located peers.

The writer owns its segments: it creates them ("hetspec_<pid>_<hex>"), rewrites them in
rotation, and unlinks them on close. Readers only attach. Each segment starts with a
64-byte header; its generation counter is odd while the writer copies and even when the
payload is complete (a seqlock), so a reader detects a payload overwritten under it.

Cleanup when a side dies: a reader never unlinks and never registers the segment with
its own resource tracker, so a killed reader leaves nothing behind its writer's close. A
killed writer's segments are unlinked by Python's resource tracker (a separate process),
and `sweep_stale()` removes any whose owner pid is gone (run by every new writer/reader).
"""

import os
import secrets
import struct
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

from protocol.codec import Encoded
from protocol.errors import BlockError
from protocol.pb import blocks_pb2 as pb
from protocol.validate import SEGMENT_NAME, checksum

SHM_DIR = Path("/dev/shm")
PREFIX = "hetspec_"
MAGIC = b"HSPCSHM1"
HEADER = struct.Struct("<8sQQQ")  # magic, generation, capacity (data bytes), owner pid
HEADER_BYTES = 64


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> list[str]:
    """Unlink hetspec segments whose owner process no longer exists; return their names."""
    removed = []
    for path in SHM_DIR.glob(f"{PREFIX}*"):
        if SEGMENT_NAME.fullmatch(path.name) and not _pid_alive(int(path.name.split("_")[1])):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def live_segments(pid: int | None = None) -> list[str]:
    """Names of hetspec segments in /dev/shm (of one owner pid if given)."""
    names = [p.name for p in SHM_DIR.glob(f"{PREFIX}*") if SEGMENT_NAME.fullmatch(p.name)]
    return sorted(n for n in names if pid is None or n.split("_")[1] == str(pid))


class _Segment:
    """One writer-owned segment: header + data area."""

    def __init__(self, capacity: int):
        name = f"{PREFIX}{os.getpid()}_{secrets.token_hex(8)}"
        self.shm = shared_memory.SharedMemory(name=name, create=True, size=HEADER_BYTES + capacity)
        self.name, self.capacity, self.generation = name, capacity, 0
        self._header()

    def _header(self) -> None:
        HEADER.pack_into(self.shm.buf, 0, MAGIC, self.generation, self.capacity, os.getpid())

    def write(self, payload: memoryview) -> int:
        self.generation += 1  # odd: being written
        self._header()
        self.shm.buf[HEADER_BYTES:HEADER_BYTES + payload.nbytes] = payload
        self.generation += 1  # even: complete
        self._header()
        return self.generation

    def destroy(self) -> None:
        self.shm.close()
        try:
            self.shm.unlink()
        except FileNotFoundError:
            pass


def _destroy_all(segments: list) -> None:
    for seg in segments:
        seg.destroy()
    segments.clear()


class ShmWriter:
    """Writes payloads into a rotation of `num_slots` owned segments, grown on demand."""

    def __init__(self, num_slots: int = 4):
        sweep_stale()
        self.num_slots = num_slots
        self._segments: list[_Segment] = []
        self._next = 0
        self._finalizer = weakref.finalize(self, _destroy_all, self._segments)

    def write(self, enc: Encoded) -> pb.BlockDescriptor:
        """Copy the payload into shared memory; return the descriptor with its shm locator."""
        slot = self._next % self.num_slots
        self._next += 1
        if slot == len(self._segments):
            self._segments.append(_Segment(max(enc.payload.nbytes, 1 << 20)))
        elif self._segments[slot].capacity < enc.payload.nbytes:
            self._segments[slot].destroy()
            self._segments[slot] = _Segment(enc.payload.nbytes)
        seg = self._segments[slot]
        generation = seg.write(enc.payload)
        d = pb.BlockDescriptor()
        d.CopyFrom(enc.descriptor)
        d.locator.shm.CopyFrom(pb.ShmLocator(segment=seg.name, offset=0, generation=generation))
        return d

    def write_batch(self, encoded: list[Encoded]) -> list[pb.BlockDescriptor]:
        """Write blocks into slots 0..n-1: a batch replaces the previous batch's blocks."""
        self._next = 0
        self.num_slots = max(self.num_slots, len(encoded))
        return [self.write(enc) for enc in encoded]

    @property
    def segment_names(self) -> list[str]:
        return [s.name for s in self._segments]

    def close(self) -> None:
        self._finalizer()


class ShmReader:
    """Attaches to writers' segments and copies validated payloads out of them."""

    def __init__(self):
        sweep_stale()
        self._attached: dict[str, shared_memory.SharedMemory] = {}

    def read(self, d: pb.BlockDescriptor) -> bytearray:
        """The payload of an (already validated) shm descriptor, checked against its checksum."""
        out = bytearray(d.byte_length)
        self.read_into(d, memoryview(out))
        return out

    def read_into(self, d: pb.BlockDescriptor, out: memoryview) -> None:
        """Copy the payload out, then check it (the copy cannot change under the check)."""
        shm, start = self._locate(d)
        out[:d.byte_length] = shm.buf[start:start + d.byte_length]
        self._check_generation(shm, d)
        if checksum(d.checksum_algorithm, out[:d.byte_length]) != d.checksum:
            raise BlockError("checksum", "payload does not match")

    @contextmanager
    def view(self, d: pb.BlockDescriptor) -> Iterator[memoryview]:
        """Zero-copy: a checked view of the payload in place, valid inside the `with` only.

        The generation is checked again on exit: a writer that reused the slot while the
        caller was reading makes the block fail (the caller must discard what it read).
        """
        shm, start = self._locate(d)
        payload = shm.buf[start:start + d.byte_length]
        try:
            if checksum(d.checksum_algorithm, payload) != d.checksum:
                self._check_generation(shm, d)
                raise BlockError("checksum", "payload does not match")
            yield payload
            self._check_generation(shm, d)
        finally:
            payload.release()

    def _locate(self, d: pb.BlockDescriptor) -> tuple[shared_memory.SharedMemory, int]:
        loc = d.locator.shm
        shm = self._attach(loc.segment)
        magic, _, capacity, _ = HEADER.unpack_from(shm.buf, 0)
        if magic != MAGIC:
            raise BlockError("locator.shm.segment", "not a hetspec segment")
        if loc.offset + d.byte_length > min(capacity, shm.size - HEADER_BYTES):
            raise BlockError("locator.shm.offset", f"{loc.offset} + {d.byte_length} bytes overruns the segment")
        self._check_generation(shm, d)
        return shm, HEADER_BYTES + loc.offset

    @staticmethod
    def _check_generation(shm: shared_memory.SharedMemory, d: pb.BlockDescriptor) -> None:
        generation = HEADER.unpack_from(shm.buf, 0)[1]
        if generation != d.locator.shm.generation:
            raise BlockError("locator.shm.generation",
                             f"segment is at {generation}, block was written at {d.locator.shm.generation}")

    def _attach(self, name: str) -> shared_memory.SharedMemory:
        if name in self._attached:
            return self._attached[name]
        try:
            shm = shared_memory.SharedMemory(name=name, create=False)
        except FileNotFoundError:
            sweep_stale()
            raise BlockError("locator.shm.segment", f"segment {name} does not exist (its writer is gone?)") from None
        # Python < 3.13 registers attachments too, and its tracker would unlink the
        # writer's segment when this reader exits: only the writer owns it.
        if name.split("_")[1] != str(os.getpid()):
            resource_tracker.unregister(shm._name, "shared_memory")  # type: ignore[attr-defined]
        if shm.size < HEADER_BYTES:
            shm.close()
            raise BlockError("locator.shm.segment", "segment is smaller than its header")
        self._attached[name] = shm
        return shm

    def close(self) -> None:
        for shm in self._attached.values():
            shm.close()
        self._attached.clear()
