"""What every hetspec gRPC server shares: request parsing that names the bad field, one
interceptor mapping exceptions to status codes, bearer-token auth, TLS, size limits,
health checking and reflection.
"""

import hmac
import logging
import os
from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, unknown_fields
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchestrator.errors import HetspecError, InvalidRequestError
from protocol.errors import BlockError

log = logging.getLogger(__name__)

HEALTH_SERVICE = "grpc.health.v1.Health"


class Overloaded(HetspecError):
    """The server is at a limit (concurrent requests, queue): RESOURCE_EXHAUSTED."""


# ---- parsing requests -----------------------------------------------------------------------


@dataclass
class Malformed:
    """What a lenient deserializer returns for bytes that are not a valid request."""

    error: InvalidRequestError


def lenient(message_class: type[Message]) -> Callable[[bytes], "Message | Malformed"]:
    """A request deserializer that never raises: gRPC would answer INTERNAL for that.

    The handler wrapper (ErrorInterceptor) turns a Malformed into INVALID_ARGUMENT.
    """

    def deserialize(data: bytes):
        try:
            return parse(message_class, data)
        except InvalidRequestError as e:
            return Malformed(e)

    return deserialize


def parse(message_class: type[Message], data: bytes) -> Message:
    """Parse a request; InvalidRequestError names the field for bad UTF-8 or unknown fields."""
    try:
        msg = message_class.FromString(data)
    except DecodeError:
        raise InvalidRequestError(_why_undecodable(message_class, data)) from None
    unknown = _unknown_field(msg)
    if unknown is not None:
        raise InvalidRequestError(f"{unknown}: unknown field (this server speaks {message_class.DESCRIPTOR.full_name} "
                                  f"of hetspec.v1)")
    return msg


def _unknown_field(msg: Message, prefix: str = "") -> str | None:
    for f in unknown_fields.UnknownFieldSet(msg):
        return f"{prefix}field #{f.field_number}"
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        items = value if fd.is_repeated else [value]
        for i, item in enumerate(items):
            if fd.message_type.GetOptions().map_entry:
                continue
            name = f"{prefix}{fd.name}[{i}]." if fd.is_repeated else f"{prefix}{fd.name}."
            found = _unknown_field(item, name)
            if found:
                return found
    return None


def _why_undecodable(message_class: type[Message], data: bytes) -> str:
    """Re-parse with every string field read as bytes, to name the field that is not UTF-8."""
    twin = _bytes_twin(message_class)
    try:
        raw = twin.FromString(data)
    except DecodeError:
        return f"request: not a valid {message_class.DESCRIPTOR.full_name} message"
    bad = _first_bad_utf8(raw, message_class.DESCRIPTOR)
    return f"{bad}: not valid UTF-8" if bad else f"request: not a valid {message_class.DESCRIPTOR.full_name} message"


_TWINS: dict[str, type[Message]] = {}


def _bytes_twin(message_class: type[Message]) -> type[Message]:
    """The same message (and its nested types' file) with string fields typed as bytes."""
    name = message_class.DESCRIPTOR.full_name
    if name not in _TWINS:
        pool = descriptor_pool.DescriptorPool()
        files = _file_closure(message_class.DESCRIPTOR.file)
        for fd in files:
            proto = descriptor_pb2.FileDescriptorProto()
            fd.CopyToProto(proto)
            for m in proto.message_type:
                _strings_to_bytes(m)
            proto.ClearField("service")
            pool.Add(proto)
        _TWINS[name] = message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
    return _TWINS[name]


def _file_closure(fd) -> list:
    seen, order = set(), []

    def visit(f):
        if f.name in seen:
            return
        seen.add(f.name)
        for dep in f.dependencies:
            visit(dep)
        order.append(f)

    visit(fd)
    return order


def _strings_to_bytes(m: descriptor_pb2.DescriptorProto) -> None:
    for f in m.field:
        if f.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
            f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    for nested in m.nested_type:
        _strings_to_bytes(nested)


def _first_bad_utf8(raw: Message, desc, prefix: str = "") -> str | None:
    for fd, value in raw.ListFields():
        original = desc.fields_by_name[fd.name]
        items = value if fd.is_repeated else [value]
        for i, item in enumerate(items):
            name = f"{prefix}{fd.name}[{i}]" if fd.is_repeated else f"{prefix}{fd.name}"
            if original.type == original.TYPE_STRING:
                try:
                    item.decode("utf-8")
                except UnicodeDecodeError:
                    return name
            elif original.message_type is not None:
                found = _first_bad_utf8(item, original.message_type, name + ".")
                if found:
                    return found
    return None


# ---- exceptions -> status codes ----------------------------------------------------------------


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


# ---- servers and channels ------------------------------------------------------------------------


@dataclass
class ServerOptions:
    """Where and how a server listens. Localhost, no TLS and no token unless told otherwise."""

    host: str = "127.0.0.1"
    port: int = 50051  # 0 = any free port
    max_message_bytes: int = 64 << 20
    max_workers: int = 32  # handler threads (streams being served at once, incl. health)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_ca_file: str | None = None  # set: clients must present a certificate signed by it
    token: str | None = None  # bearer token; None = no auth
    extra_options: list = field(default_factory=list)


@dataclass
class Served:
    server: grpc.Server
    port: int
    health: health.HealthServicer

    def stop(self, grace: float = 5.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()


def token_from_env(name: str | None, key: str = "server.auth_token_env") -> str | None:
    """The bearer token in the environment variable a profile names; unset or empty is an error."""
    if not name:
        return None
    token = os.environ.get(name, "")
    if not token:
        raise HetspecError(f"{key} names ${name}, which is unset or empty")
    return token


def start_server(options: ServerOptions, register: Iterable[Callable[[grpc.Server], str]]) -> Served:
    """Start a server: each `register(server)` adds one service and returns its full name."""
    interceptors = [ErrorInterceptor()]
    if options.token:
        interceptors.insert(0, TokenInterceptor(options.token))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=options.max_workers),
                         interceptors=interceptors,
                         options=[("grpc.max_receive_message_length", options.max_message_bytes),
                                  ("grpc.max_send_message_length", options.max_message_bytes),
                                  ("grpc.so_reuseport", 0), *options.extra_options],
                         maximum_concurrent_rpcs=options.max_workers)
    names = [add(server) for add in register]
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*names, HEALTH_SERVICE, reflection.SERVICE_NAME], server)
    address = f"{options.host}:{options.port}"
    try:
        port = server.add_secure_port(address, _server_credentials(options)) if options.tls_cert_file \
            else server.add_insecure_port(address)
    except RuntimeError as e:
        raise HetspecError(f"cannot listen on {address}: {e}") from None
    if port == 0:
        raise HetspecError(f"cannot listen on {address} (in use, or not an address of this host)")
    server.start()
    for name in ("", *names):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return Served(server, port, health_servicer)


def _server_credentials(options: ServerOptions) -> grpc.ServerCredentials:
    key, cert = _read(options.tls_key_file, "server.tls.key_file"), _read(options.tls_cert_file, "server.tls.cert_file")
    ca = _read(options.tls_ca_file, "server.tls.ca_file") if options.tls_ca_file else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def _read(path: str | None, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except (OSError, TypeError) as e:
        raise HetspecError(f"{what}: cannot read {path!r}: {e}") from None


@dataclass
class ChannelOptions:
    """How a client reaches a server."""

    tls: bool = False
    ca_file: str | None = None  # trust this CA (default: the system roots)
    cert_file: str | None = None  # client certificate, for servers that require one
    key_file: str | None = None
    token: str | None = None
    max_message_bytes: int = 64 << 20


def open_channel(address: str, options: ChannelOptions | None = None, extra: list | None = None) -> grpc.Channel:
    options = options or ChannelOptions()
    opts = [("grpc.max_send_message_length", options.max_message_bytes),
            ("grpc.max_receive_message_length", options.max_message_bytes), *(extra or [])]
    if not (options.tls or options.ca_file):
        if options.token:
            log.warning("sending a bearer token without TLS: anyone on the path can read it")
        return grpc.insecure_channel(address, options=opts)
    ca = _read(options.ca_file, "ca_file") if options.ca_file else None
    key = _read(options.key_file, "key_file") if options.key_file else None
    cert = _read(options.cert_file, "cert_file") if options.cert_file else None
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca, key, cert), options=opts)


def call_metadata(options: ChannelOptions | None) -> tuple:
    if options is not None and options.token:
        return (("authorization", f"Bearer {options.token}"),)
    return ()
