"""Starting a hetspec gRPC server: limits, TLS, the interceptors, health checking and reflection."""

from collections.abc import Callable, Iterable
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from orchestrator.errors import HetspecError
from orchestrator.profiles import Profile
from orchestrator.server.channels import read_file, token_from_env
from orchestrator.server.interceptors import HEALTH_SERVICE, ErrorInterceptor, TokenInterceptor


@dataclass
class ServerOptions:
    """Where and how a server listens. Localhost, no TLS and no token unless told otherwise."""

    host: str = "127.0.0.1"
    port: int = 50051  # 0 = any free port
    max_message_bytes: int = 64 << 20
    # handler threads: streams served at once, health and reflection included; calls past them wait
    # for a thread (gRPC itself refuses nothing: the engine loop bounds generations)
    max_workers: int = 32
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


def server_options(profile: Profile, host: str | None, port: int | None, default_port: int) -> ServerOptions:
    """The profile's `server` section as options; `host` / `port` (flags) win when given."""
    s = profile.server
    if port is not None and not 0 <= port <= 65535:
        raise HetspecError(f"--port must be in 0..65535, got {port}")
    tls = s.tls
    return ServerOptions(host=host or s.host, port=default_port if port is None else port,
                         max_message_bytes=profile.transport.max_message_bytes,
                         max_workers=s.max_concurrent_requests + s.max_queued_requests + 16,  # + health, reflection
                         tls_cert_file=tls.cert_file if tls else None, tls_key_file=tls.key_file if tls else None,
                         tls_ca_file=tls.ca_file if tls else None, token=token_from_env(s.auth_token_env))


def start_server(options: ServerOptions, register: Iterable[Callable[[grpc.Server], str]]) -> Served:
    """Start a server: each `register(server)` adds one service and returns its full name."""
    interceptors = [ErrorInterceptor()]
    if options.token:
        interceptors.insert(0, TokenInterceptor(options.token))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=options.max_workers),
                         interceptors=interceptors,
                         options=[("grpc.max_receive_message_length", options.max_message_bytes),
                                  ("grpc.max_send_message_length", options.max_message_bytes),
                                  ("grpc.so_reuseport", 0), *options.extra_options])
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
    key, cert = read_file(options.tls_key_file, "server.tls.key_file"), read_file(options.tls_cert_file, "server.tls.cert_file")
    ca = read_file(options.tls_ca_file, "server.tls.ca_file") if options.tls_ca_file else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)
