"""`hetspec serve`, `hetspec client` and `hetspec drafter serve`."""

import argparse
import json
import logging
import signal
import sys
import threading

from orchestrator.errors import HetspecError

log = logging.getLogger("hetspec.server")


def add_parsers(sub, add_sampling_args) -> None:
    s = sub.add_parser("serve", help="serve hetspec.v1.Generation (streaming generation) over gRPC")
    _add_server_args(s, "server.port")
    s.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics on this port of --host (default: the profile's "
                        "server.metrics_port, off; 0 = any free port)")
    s.set_defaults(func=_serve)

    c = sub.add_parser("client", help="stream one generation from a running `hetspec serve`")
    c.add_argument("prompt")
    c.add_argument("--host", default="127.0.0.1")
    c.add_argument("--port", type=int, default=50051)
    add_sampling_args(c)
    c.add_argument("--timeout", type=float, default=None, help="deadline in seconds (the server frees the request's KV)")
    c.add_argument("--tls", action="store_true", help="use TLS (system roots unless --ca-file)")
    c.add_argument("--ca-file", default=None, help="CA certificate that signed the server's certificate")
    c.add_argument("--cert-file", default=None, help="client certificate (servers that require one)")
    c.add_argument("--key-file", default=None)
    c.add_argument("--token-env", default=None, metavar="VAR", help="environment variable holding the bearer token")
    c.set_defaults(func=_client)

    d = sub.add_parser("drafter", help="drafter workers for remote targets")
    dsub = d.add_subparsers(dest="drafter_command", required=True, parser_class=sub._parser_class)
    ds = dsub.add_parser("serve", help="serve a local drafter as hetspec.v1.Drafter sessions over gRPC")
    _add_server_args(ds, "server.drafter_port")
    ds.add_argument("--drafter", default=None, metavar="NAME",
                    help="which of the profile's drafters to serve (default: speculation.drafter)")
    ds.set_defaults(func=_drafter_serve)


def _add_server_args(p: argparse.ArgumentParser, port_key: str) -> None:
    p.add_argument("--profile", default="cpu", metavar="FILE|NAME", help="placement profile (default: the shipped 'cpu')")
    p.add_argument("--host", default=None, help="address to bind (default: the profile's server.host, 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help=f"port (default: the profile's {port_key}; 0 = any free port)")


def _server_options(profile, host: str | None, port: int | None, default_port: int):
    from orchestrator.server.grpc_util import ServerOptions, token_from_env

    s = profile.server
    if port is not None and not 0 <= port <= 65535:
        raise HetspecError(f"--port must be in 0..65535, got {port}")
    tls = s.tls
    return ServerOptions(host=host or s.host, port=default_port if port is None else port,
                         max_message_bytes=profile.transport.max_message_bytes,
                         max_workers=s.max_concurrent_requests + 8,  # + health checks, status, refusals
                         tls_cert_file=tls.cert_file if tls else None, tls_key_file=tls.key_file if tls else None,
                         tls_ca_file=tls.ca_file if tls else None, token=token_from_env(s.auth_token_env))


def _serve(args) -> int:
    from orchestrator.build import build_engine
    from orchestrator.profiles import load_profile
    from orchestrator.server.generation import EngineLoop, GenerationServicer
    from orchestrator.server.grpc_util import start_server

    profile = load_profile(args.profile)
    options = _server_options(profile, args.host, args.port, profile.server.port)
    config = profile.engine_config()
    engine, _ = build_engine(config, progress=True)
    kind = config.drafter.kind if engine.drafter is not None else "none"
    loop = EngineLoop(engine, kind, max_active=profile.server.max_concurrent_requests)
    servicer = GenerationServicer(loop, engine.tokenizer, max_new_tokens_limit=profile.server.max_new_tokens)
    served = start_server(options, [servicer.register])
    metrics_port = args.metrics_port if args.metrics_port is not None else profile.server.metrics_port
    if metrics_port is not None:
        _serve_metrics(engine, options.host, metrics_port)
    drafter = f"drafter {kind} k={config.num_speculative_tokens}" if engine.drafter is not None else "target only"
    _ready(f"serving hetspec.v1.Generation on {options.host}:{served.port} "
           f"(profile {profile.source}, {drafter}{', TLS' if options.tls_cert_file else ''}"
           f"{', token auth' if options.token else ''})")
    _wait_for_signal()
    served.stop()
    loop.stop()
    if engine.drafter is not None:
        engine.drafter.close()
    return 0


def _serve_metrics(engine, host: str, port: int) -> None:
    """Prometheus text format at http://host:port/metrics, fed by the engine's spans."""
    from prometheus_client import start_http_server

    from orchestrator.profiler.metrics import EngineMetrics

    metrics = EngineMetrics(engine, keep_spans=False)
    try:
        server, _ = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as e:
        raise HetspecError(f"cannot serve metrics on {host}:{port}: {e}") from None
    _ready(f"metrics on http://{host}:{server.server_port}/metrics")


def _drafter_serve(args) -> int:
    from orchestrator.build import build_drafter
    from orchestrator.checkpoints import resolve
    from orchestrator.profiles import load_profile
    from orchestrator.server.drafter_service import DrafterServicer
    from orchestrator.server.grpc_util import start_server

    profile = load_profile(args.profile)
    name = args.drafter or profile.speculation.drafter
    if name is None:
        raise HetspecError(f"profile {profile.source} names no drafter (speculation.drafter); pass --drafter NAME")
    if name not in profile.drafters:
        raise HetspecError(f"--drafter: profile {profile.source} has no drafter {name!r} "
                           f"(it has {', '.join(profile.drafters) or 'none'})")
    if profile.drafters[name].kind == "remote":
        raise HetspecError(f"drafter {name!r} is itself remote; serve a local one (onnx, torch, ngram)")
    speculation = profile.speculation.model_copy(update={"drafter": name})
    profile = profile.model_copy(update={"speculation": speculation})
    options = _server_options(profile, args.host, args.port, profile.server.drafter_port)
    config = profile.engine_config()
    ckpt = resolve(config.model)
    drafter = build_drafter(config, ckpt, progress=True)
    if drafter is None:
        raise HetspecError(f"profile {profile.source}: speculation.num_speculative_tokens is 0: nothing to serve")
    # a self-drafter (exported from the target's checkpoint) can take the target's K/V
    model_id = ckpt.key if config.drafter.model is None else None
    servicer = DrafterServicer(drafter, vocab_size=_vocab_size(ckpt), model_id=model_id)
    served = start_server(options, [servicer.register])
    _ready(f"serving hetspec.v1.Drafter ({config.drafter.kind}) on {options.host}:{served.port} "
           f"(profile {profile.source})")
    _wait_for_signal()
    served.stop()
    drafter.close()
    return 0


def _vocab_size(ckpt) -> int | None:
    config = ckpt.hf_dir / "config.json"
    if not config.is_file():
        return None
    return json.loads(config.read_text()).get("vocab_size")


def _ready(line: str) -> None:
    print(f"hetspec: {line}", file=sys.stderr, flush=True)


def _wait_for_signal() -> None:
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    _ready("shutting down (in-flight requests get 5 s)")


def _client(args) -> int:
    import grpc

    from orchestrator.config import SamplingParams
    from orchestrator.server.client import GenerationClient
    from orchestrator.server.grpc_util import ChannelOptions, token_from_env

    if not args.prompt.strip():
        raise HetspecError("prompt is empty")
    SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, stop=tuple(args.stop)).validate()
    options = ChannelOptions(tls=args.tls or args.ca_file is not None, ca_file=args.ca_file, cert_file=args.cert_file,
                             key_file=args.key_file, token=token_from_env(args.token_env, "--token-env"))
    k = args.num_speculative_tokens
    request = dict(raw=args.raw, max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, stop=tuple(args.stop), speculate=not args.no_spec,
                   num_speculative_tokens=k)
    address = f"{args.host}:{args.port}"
    from orchestrator.cli import print_result

    with GenerationClient(address, options) as client:
        try:
            if args.json:
                result = client.generate(args.prompt, timeout=args.timeout, **request)
            else:
                ids, text, result = [], [], None
                for delta in client.stream(args.prompt, timeout=args.timeout, **request):
                    print(delta.text, end="", flush=True)
                    ids += delta.token_ids
                    text.append(delta.text)
                    if delta.final is not None:
                        from orchestrator.server.generation import result_from_final

                        result = result_from_final(ids, "".join(text), delta.final)
        except grpc.RpcError as e:
            raise HetspecError(f"{address}: {e.code().name}: {e.details()}") from None
    print_result(result, as_json=args.json)
    return 0
