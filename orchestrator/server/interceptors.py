"""One mapping from exceptions to gRPC status codes, applied to every handler; bearer-token auth.

Errors that name a field (`InvalidRequestError.field`, `BlockError.field`) also send it as
trailing metadata (`hetspec-error-field`), so a client can react to the field without
reading the message text.
"""

import hmac
import logging

import grpc

from orchestrator.errors import HetspecError, InvalidRequestError
from orchestrator.server.parsing import Malformed
from protocol import BlockError

log = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"
ERROR_FIELD_KEY = "hetspec-error-field"


class Overloaded(HetspecError):
    """The server is at a limit (concurrent requests, queue): RESOURCE_EXHAUSTED."""


def status_for(e: BaseException) -> tuple[grpc.StatusCode, str]:
    """The one mapping from exceptions to status codes; details never carry a traceback."""
    if isinstance(e, (InvalidRequestError, BlockError)):
        return grpc.StatusCode.INVALID_ARGUMENT, str(e)
    if isinstance(e, Overloaded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(e)
    if isinstance(e, HetspecError):
        return grpc.StatusCode.FAILED_PRECONDITION, str(e)
    return grpc.StatusCode.INTERNAL, "internal error (the server log has the details)"


class _Aborted(Exception):
    """Raised by context.abort: the status is already set, let it through."""


def _wrap_unary(behavior):
    def call(request, context):
        if isinstance(request, Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request.error))
        try:
            return behavior(request, context)
        except Exception as e:
            _abort(context, e)

    return call


def _wrap_stream_out(behavior):
    def call(request, context):
        if isinstance(request, Malformed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request.error))
        try:
            yield from behavior(request, context)
        except Exception as e:
            _abort(context, e)

    return call


def _wrap_stream_in(behavior, streaming_out: bool):
    def requests(iterator):
        for request in iterator:
            if isinstance(request, Malformed):
                raise request.error
            yield request

    if streaming_out:
        def call(iterator, context):
            try:
                yield from behavior(requests(iterator), context)
            except Exception as e:
                _abort(context, e)
    else:
        def call(iterator, context):
            try:
                return behavior(requests(iterator), context)
            except Exception as e:
                _abort(context, e)
    return call


def _abort(context: grpc.ServicerContext, e: Exception) -> None:
    if context.code() is not None and context.code() != grpc.StatusCode.OK:  # already aborted
        raise e
    if not context.is_active():  # the client cancelled or its deadline passed: nobody to tell
        return
    code, details = status_for(e)
    if code is grpc.StatusCode.INTERNAL:
        log.error("internal error in a request", exc_info=e)
    field = getattr(e, "field", None)
    if field and code is not grpc.StatusCode.INTERNAL:
        context.set_trailing_metadata(((ERROR_FIELD_KEY, field),))
    context.abort(code, details)


class ErrorInterceptor(grpc.ServerInterceptor):
    """Every handler's exceptions become a status with a one-line message (see status_for)."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        kind = (handler.request_streaming, handler.response_streaming)
        common = dict(request_deserializer=handler.request_deserializer,
                      response_serializer=handler.response_serializer)
        if kind == (False, False):
            return grpc.unary_unary_rpc_method_handler(_wrap_unary(handler.unary_unary), **common)
        if kind == (False, True):
            return grpc.unary_stream_rpc_method_handler(_wrap_stream_out(handler.unary_stream), **common)
        if kind == (True, False):
            return grpc.stream_unary_rpc_method_handler(_wrap_stream_in(handler.stream_unary, False), **common)
        return grpc.stream_stream_rpc_method_handler(_wrap_stream_in(handler.stream_stream, True), **common)


class TokenInterceptor(grpc.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every call but health checks."""

    def __init__(self, token: str):
        self._expected = f"Bearer {token}".encode()

        def deny(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")

        self._deny = deny

    def intercept_service(self, continuation, handler_call_details):
        if handler_call_details.method.startswith(f"/{HEALTH_SERVICE}/"):
            return continuation(handler_call_details)
        got = dict(handler_call_details.invocation_metadata or ()).get("authorization", "")
        if hmac.compare_digest(got.encode(), self._expected):
            return continuation(handler_call_details)
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        # answer with the method's own shape so the client sees UNAUTHENTICATED, not UNIMPLEMENTED
        makers = {(False, False): grpc.unary_unary_rpc_method_handler,
                  (False, True): grpc.unary_stream_rpc_method_handler,
                  (True, False): grpc.stream_unary_rpc_method_handler,
                  (True, True): grpc.stream_stream_rpc_method_handler}
        return makers[(handler.request_streaming, handler.response_streaming)](self._deny)
