"""One `hetspec.v1.Drafter` session stream as the target side sees it: frames out, answers in order.

Frames go out through a queue (gRPC's sender thread drains it); answers are read on the
caller's thread, with a watchdog that cancels the call when one is overdue, so a round trip
costs no extra thread hand-off. A new session is used only after a probe frame has been
answered, and that answer is awaited off the engine thread.
"""

import queue
import threading
import time

import grpc

from orchestrator.server.interceptors import ERROR_FIELD_KEY
from protocol.pb import blocks_pb2, drafter_pb2_grpc
from protocol.pb import drafter_pb2 as pb

V1 = blocks_pb2.PROTOCOL_VERSION_1


class DrafterFailure(Exception):
    """The session cannot go on: the drafter died, stalled, or sent something malformed.

    `field` is the request field the drafter refused, when its status said so.
    """

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


class Session:
    """One bidirectional stream, with a watchdog on the answer being waited for."""

    WATCH_EVERY_S = 0.02

    def __init__(self, stub: drafter_pb2_grpc.DrafterStub, metadata: tuple):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self.call = stub.Session(self._frames(), metadata=metadata)
        self._deadline: float | None = None  # while a receive waits
        self._stalled = False
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="hetspec-remote-drafter-watchdog", daemon=True).start()

    def _frames(self):
        while (frame := self._requests.get()) is not None:
            yield frame

    def _watch(self) -> None:
        while not self._closed.wait(self.WATCH_EVERY_S):
            deadline = self._deadline
            if deadline is not None and time.perf_counter() > deadline:
                self._stalled = True
                self.call.cancel()
                return

    def send(self, frame: pb.DrafterRequest) -> None:
        self._requests.put(frame)

    def receive(self, timeout: float) -> pb.DrafterResponse:
        self._deadline = time.perf_counter() + max(timeout, 0.0)
        try:
            return next(self.call)
        except StopIteration:
            raise DrafterFailure("the drafter ended the session") from None
        except grpc.RpcError as e:
            if self._stalled:
                raise DrafterFailure(f"no answer within {timeout:.1f} s (stalled)") from None
            raise DrafterFailure(f"{e.code().name}: {e.details()}", _error_field(e)) from None
        except Exception as e:  # an answer the client cannot parse
            raise DrafterFailure(f"unreadable answer: {e}") from None
        finally:
            self._deadline = None

    def close(self) -> None:
        self._closed.set()
        self._requests.put(None)
        self.call.cancel()


def _error_field(e: grpc.RpcError) -> str:
    """The field the server named in its trailing metadata, or ''."""
    metadata = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    return dict(metadata or ()).get(ERROR_FIELD_KEY, "")


def check_answer(response: pb.DrafterResponse, request_id: int, body: str | None = None) -> None:
    """Answers come in request order, in protocol version 1, with the expected body."""
    if response.request_id != request_id or response.protocol_version != V1:
        raise DrafterFailure(f"answer {response.request_id} (version {response.protocol_version}) "
                             f"out of order: expected {request_id}")
    if body is not None and response.WhichOneof("body") != body:
        raise DrafterFailure(f"request {request_id}: expected {body}, got {response.WhichOneof('body')}")


class Probe:
    """The first frame of a new session, an empty VerifyBatch, answered off the engine thread.

    The drafter server answers it only when its drafter is free, so until then the engine keeps
    stepping target-only; a probe that times out or is answered wrongly fails the session."""

    def __init__(self, session: Session, request_id: int, timeout_s: float):
        self.session, self.request_id = session, request_id
        self.error: DrafterFailure | None = None
        self.done = threading.Event()
        session.send(pb.DrafterRequest(protocol_version=V1, request_id=request_id, verify=pb.VerifyBatch()))
        threading.Thread(target=self._await, args=(timeout_s,), name="hetspec-remote-drafter-probe",
                         daemon=True).start()

    def _await(self, timeout_s: float) -> None:
        try:
            check_answer(self.session.receive(timeout_s), self.request_id, "ack")
        except DrafterFailure as e:
            self.error = e
        finally:
            self.done.set()
