"""Client channels to hetspec servers: plaintext or TLS, message limits, the bearer token."""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from orchestrator.errors import HetspecError

log = logging.getLogger(__name__)


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
    ca = read_file(options.ca_file, "ca_file") if options.ca_file else None
    key = read_file(options.key_file, "key_file") if options.key_file else None
    cert = read_file(options.cert_file, "cert_file") if options.cert_file else None
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(ca, key, cert), options=opts)


def call_metadata(options: ChannelOptions | None) -> tuple:
    if options is not None and options.token:
        return (("authorization", f"Bearer {options.token}"),)
    return ()


def read_file(path: str | None, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except (OSError, TypeError) as e:
        raise HetspecError(f"{what}: cannot read {path!r}: {e}") from None


def token_from_env(name: str | None, key: str = "server.auth_token_env") -> str | None:
    """The bearer token in the environment variable a profile names; unset or empty is an error."""
    if not name:
        return None
    token = os.environ.get(name, "")
    if not token:
        raise HetspecError(f"{key} names ${name}, which is unset or empty")
    return token
