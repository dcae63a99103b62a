"""Shared-memory segment lifecycle with real processes: nothing left in /dev/shm, whoever dies."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from protocol import codec, shm
from protocol.pb import blocks_pb2 as pb
from protocol.validate import validate_descriptor

WRITER = textwrap.dedent("""
    import sys, torch
    from protocol import codec, shm
    from protocol.pb import blocks_pb2 as pb
    writer = shm.ShmWriter(num_slots=2)
    x = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    d = writer.write(codec.encode(x, kind=pb.TENSOR_KIND_HIDDEN_STATE, layout=pb.LAYOUT_TOKENS_HIDDEN))
    print(d.SerializeToString().hex(), flush=True)
    command = sys.stdin.readline().strip()  # "close", "exit" (no cleanup) or EOF/kill
    if command == "close":
        writer.close()
        print("closed", flush=True)
    elif command == "exit":
        import os
        os._exit(3)  # a crash: no finalizers, no atexit
    sys.stdin.readline()
""")

READER = textwrap.dedent("""
    import sys
    from protocol import shm
    from protocol.pb import blocks_pb2 as pb
    reader = shm.ShmReader()
    d = pb.BlockDescriptor.FromString(bytes.fromhex(sys.stdin.readline().strip()))
    print(len(reader.read(d)), flush=True)
    sys.stdin.readline()  # stay attached until killed
""")


def _spawn(code: str, new_session: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, cwd=os.getcwd(), start_new_session=new_session)


def _wait_gone(pid: int, timeout: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while shm.live_segments(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return shm.live_segments(pid)


def _descriptor(proc: subprocess.Popen) -> pb.BlockDescriptor:
    d = pb.BlockDescriptor.FromString(bytes.fromhex(proc.stdout.readline().strip()))
    validate_descriptor(d)
    return d


@pytest.fixture
def writer_proc():
    procs = []

    def start(new_session: bool = False):
        proc = _spawn(WRITER, new_session)
        procs.append(proc)
        return proc, _descriptor(proc)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        _wait_gone(proc.pid)


def _expected() -> torch.Tensor:
    return torch.arange(4096, dtype=torch.float32).reshape(64, 64)


def test_normal_close_leaves_nothing(writer_proc):
    proc, d = writer_proc()
    reader = shm.ShmReader()
    assert torch.equal(codec.decode(d, reader.read(d), verified=True), _expected())
    assert shm.live_segments(proc.pid)
    proc.stdin.write("close\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "closed"
    assert shm.live_segments(proc.pid) == []
    reader.close()


@pytest.mark.parametrize("how", ["sigkill", "crash"])
def test_writer_killed_leaves_nothing(writer_proc, how):
    proc, d = writer_proc()
    reader = shm.ShmReader()
    reader.read(d)  # attached when the writer dies
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    else:
        proc.stdin.write("exit\n")
        proc.stdin.flush()
    proc.wait()
    assert _wait_gone(proc.pid) == []  # its resource tracker (another process) unlinks them
    reader.close()


def test_writer_and_its_tracker_killed_are_swept(writer_proc):
    proc, d = writer_proc(new_session=True)
    assert shm.live_segments(proc.pid)
    os.killpg(proc.pid, signal.SIGKILL)  # the writer's whole process group, tracker included
    proc.wait()
    time.sleep(0.5)
    reader = shm.ShmReader()  # any new peer sweeps segments whose owner is gone
    assert shm.live_segments(proc.pid) == []
    with pytest.raises(Exception, match="does not exist"):
        reader.read(d)
    reader.close()


def test_killed_reader_does_not_take_the_writers_segment(writer_proc):
    proc, d = writer_proc()
    reader_proc = _spawn(READER)
    reader_proc.stdin.write(d.SerializeToString().hex() + "\n")
    reader_proc.stdin.flush()
    assert int(reader_proc.stdout.readline()) == d.byte_length
    reader_proc.send_signal(signal.SIGKILL)
    reader_proc.wait()
    time.sleep(1.0)  # give the dead reader's resource tracker time to act (it must not)
    reader = shm.ShmReader()
    assert torch.equal(codec.decode(d, reader.read(d), verified=True), _expected())
    reader.close()
    proc.stdin.write("close\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "closed"
    assert shm.live_segments(proc.pid) == []


def test_in_process_writer_closes_on_garbage_collection():
    writer = shm.ShmWriter()
    writer.write(codec.encode(torch.zeros(8), kind=pb.TENSOR_KIND_HIDDEN_STATE))
    names = writer.segment_names
    assert set(names) <= set(shm.live_segments(os.getpid()))
    del writer
    assert not set(names) & set(shm.live_segments())


def test_zero_copy_view_detects_a_rewrite_during_use():
    writer, reader = shm.ShmWriter(num_slots=1), shm.ShmReader()
    try:
        enc = codec.encode(torch.arange(64, dtype=torch.float32), kind=pb.TENSOR_KIND_HIDDEN_STATE)
        d = writer.write(enc)
        with reader.view(d) as payload:
            assert bytes(payload) == enc.payload.tobytes()
        with pytest.raises(Exception, match="generation"):
            with reader.view(d) as payload:
                writer.write(enc)  # the writer reuses the slot while the reader looks at it
    finally:
        writer.close()
        reader.close()
