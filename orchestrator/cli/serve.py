"""`hetspec serve`: the profile's engine behind `hetspec.v1.Generation`, optionally behind the
OpenAI-compatible HTTP API too (`--http-port`), and Prometheus /metrics."""

import argparse
import dataclasses

from prometheus_client import start_http_server

from orchestrator.assemble import build_engine
from orchestrator.cli.common import on_signal, ready
from orchestrator.errors import HetspecError
from orchestrator.profiles import load_profile
from orchestrator.server import EngineLoop, EngineMetrics, GenerationServicer, server_options, start_server
from orchestrator.server.cpu_latency import CpuLatencyRequest
from orchestrator.tracing import Tracer


def add_parser(sub) -> None:
    s = sub.add_parser("serve", help="serve hetspec.v1.Generation (streaming generation) over gRPC")
    add_server_args(s, "server.port")
    s.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port of --host (default: the profile's "
                        "server.metrics_port, off; 0 = any free port)")
    s.add_argument("--http-port", type=int, default=None,
                   help="also serve the OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
                        "/v1/models, /health, /metrics) on this port of --host (default: the profile's "
                        "server.http_port, off; 0 = any free port)")
    s.set_defaults(func=run)


def add_server_args(p: argparse.ArgumentParser, port_key: str) -> None:
    p.add_argument("--profile", default="cpu", metavar="FILE|NAME", help="placement profile (default: the shipped 'cpu')")
    p.add_argument("--host", default=None, help="address to bind (default: the profile's server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help=f"port (default: the profile's {port_key}; 0 = any free port)")
    p.add_argument("--cpu-latency-us", type=int, default=None, metavar="US",
                   help="hold a Linux CPU latency QoS request of US microseconds while serving (0: idle CPUs "
                        "poll instead of halting: faster wake-ups for each message, CPU time burnt while idle; "
                        "needs write access to /dev/cpu_dma_latency; default: the profile's "
                        "server.cpu_latency_us, none)")


def cpu_latency(args: argparse.Namespace, profile) -> CpuLatencyRequest | None:
    """The flag's or the profile's CPU latency request, held (None: neither sets one)."""
    us = args.cpu_latency_us if args.cpu_latency_us is not None else profile.server.cpu_latency_us
    return None if us is None else CpuLatencyRequest(us)


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    options = server_options(profile, args.host, args.port, profile.server.port)
    metrics_port = args.metrics_port if args.metrics_port is not None else profile.server.metrics_port
    http_port = args.http_port if args.http_port is not None else profile.server.http_port
    for flag, value in (("--metrics-port", metrics_port), ("--http-port", http_port)):
        if value is not None and not 0 <= value <= 65535:
            raise HetspecError(f"{flag} must be in 0..65535, got {value}")
    latency = cpu_latency(args, profile)
    s = profile.server
    # the running batch is at most max_concurrent_requests; admitted requests past it wait in the
    # engine's queue (no KV held), up to max_queued_requests more
    config = dataclasses.replace(profile.engine_config(),
                                 max_num_seqs=min(profile.engine_config().max_num_seqs, s.max_concurrent_requests))
    # spans feed the metrics only (no span history is kept in a long-running server)
    tracer = Tracer(enabled=metrics_port is not None or http_port is not None, keep=False)
    engine = build_engine(config, tracer=tracer, progress=True)
    # the engine steps on this (main) thread, where torch loaded the model: on a thread of its own a CPU
    # target ran at half speed (orchestrator/server/engine_loop.py)
    loop = EngineLoop(engine, config.drafter_kind, max_active=s.max_concurrent_requests + s.max_queued_requests,
                      own_thread=False)
    servicer = GenerationServicer(loop, engine.tokenizer, max_new_tokens_limit=s.max_new_tokens)
    served = start_server(options, [servicer.register])
    served_model = config.model or "smollm2-135m"  # the name clients send as `model` (no model: the default)
    metrics = EngineMetrics(engine, model_name=served_model) if tracer.enabled else None
    if metrics_port is not None:
        serve_metrics(metrics, options.host, metrics_port)
    http = None
    if http_port is not None:  # the HTTP stack (FastAPI, uvicorn) is imported only when asked for
        from orchestrator.server.openai_http import build_app, start_http

        app = build_app(loop, engine.tokenizer, served_model, s.max_new_tokens, token=options.token,
                        registry=metrics.registry, max_body_bytes=options.max_message_bytes)
        http = start_http(app, options.host, http_port)
        ready(f"OpenAI-compatible HTTP on http://{options.host}:{http.port}/v1 (model {served_model!r})")

    def shutdown() -> None:  # the engine keeps stepping meanwhile: in-flight streams get their grace
        if http is not None:
            http.stop()
        served.stop()
        loop.stop()

    on_signal(shutdown)
    k = f"auto<={config.num_speculative_tokens}" if config.k_policy == "auto" else config.num_speculative_tokens
    drafter = f"drafter {config.drafter_kind} k={k}" if engine.drafter else "target only"
    ready(f"serving hetspec.v1.Generation on {options.host}:{served.port} "
          f"(profile {profile.source}, {drafter}{', TLS' if options.tls_cert_file else ''}"
          f"{', token auth' if options.token else ''}{latency_note(latency)})")
    loop.run()
    if engine.drafter is not None:
        engine.drafter.close()
    if latency is not None:
        latency.close()
    return 0


def latency_note(latency: CpuLatencyRequest | None) -> str:
    return "" if latency is None else f", CPU latency request {latency.microseconds} us"


def serve_metrics(metrics: EngineMetrics, host: str, port: int) -> None:
    """Prometheus text format at http://host:port/metrics, fed by the engine's spans."""
    try:
        server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as e:
        raise HetspecError(f"cannot serve metrics on {host}:{port}: {e}") from None
    ready(f"metrics on http://{host}:{server.server_port}/metrics")
