"""TLS and bearer-token auth on a real `hetspec serve` (target only: the model is not the point)."""

import json
import os
import shutil
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from orchestrator.server import ChannelOptions
from orchestrator.server.client import GenerationClient

from servers import Server, write_profile

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make certificates")
TOKEN = "tok-8d1f0c"


def make_certs(d):
    """A CA and a server certificate for 127.0.0.1 signed by it."""
    def ssl(*args):
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d)

    ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=hetspec test CA")
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    ssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "server.pem", "-days", "2", "-extfile", "san.ext")
    return d / "ca.pem", d / "server.pem", d / "server.key"


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_certs(d)
    profile = write_profile(d / "secure.yaml", None, server={
        "tls": {"cert_file": str(cert), "key_file": str(key)}, "auth_token_env": "HETSPEC_TEST_TOKEN"})
    server = Server("serve", "--profile", str(profile), "--port", "0", env={"HETSPEC_TEST_TOKEN": TOKEN})
    yield server, ca
    server.stop()


def test_token_is_required_and_checked_over_tls(secure):
    server, ca = secure
    for token in (None, "wrong"):
        with GenerationClient(server.address, ChannelOptions(ca_file=str(ca), token=token)) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.generate("hi", max_new_tokens=2)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with GenerationClient(server.address, ChannelOptions(ca_file=str(ca), token=TOKEN)) as c:
        assert c.generate("hi", max_new_tokens=2)["usage"]["completion_tokens"] == 2
    # health checks need no token (load balancers), but still TLS
    with grpc.secure_channel(server.address, grpc.ssl_channel_credentials(ca.read_bytes())) as ch:
        status = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        assert status == health_pb2.HealthCheckResponse.SERVING


def test_plaintext_clients_cannot_talk_to_a_tls_server(secure):
    server, _ = secure
    with GenerationClient(server.address, ChannelOptions(token=TOKEN)) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.generate("hi", max_new_tokens=2, timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_cli_client_with_ca_and_token(secure):
    server, ca = secure
    args = [sys.executable, "-m", "orchestrator.cli", "client", "hi", "--port", str(server.port), "--ca-file", str(ca),
            "--max-new-tokens", "3", "--json"]
    r = subprocess.run([*args, "--token-env", "T"], capture_output=True, text=True, env={**os.environ, "T": TOKEN},
                       check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["usage"]["completion_tokens"] == 3
    r = subprocess.run(args, capture_output=True, text=True, check=False)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"hetspec: error: {server.address}: UNAUTHENTICATED: missing or wrong bearer token"]
