"""`hetspec client`: stream one generation from a running `hetspec serve`."""

import argparse

import grpc

from orchestrator.cli.common import add_sampling_args, print_result, sampling_params
from orchestrator.errors import HetspecError
from orchestrator.server import ChannelOptions, GenerationClient, token_from_env


def add_parser(sub) -> None:
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
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    p = sampling_params(args)  # checked here too: a bad flag never reaches the server
    options = ChannelOptions(tls=args.tls or args.ca_file is not None, ca_file=args.ca_file, cert_file=args.cert_file,
                             key_file=args.key_file, token=token_from_env(args.token_env, "--token-env"))
    request = dict(raw=args.raw, max_new_tokens=p.max_new_tokens, temperature=p.temperature, top_k=p.top_k,
                   top_p=p.top_p, seed=p.seed, stop=p.stop, speculate=p.speculate,
                   num_speculative_tokens=p.num_speculative_tokens, acceptance=p.acceptance,
                   acceptance_options=dict(p.acceptance_options))
    address = f"{args.host}:{args.port}"

    def stream(delta) -> None:
        if not args.json:
            print(delta.text, end="", flush=True)

    with GenerationClient(address, options) as client:
        try:
            result = client.generate(args.prompt, timeout=args.timeout, on_delta=stream, **request)
        except grpc.RpcError as e:
            raise HetspecError(f"{address}: {e.code().name}: {e.details()}") from None
    print_result(result, as_json=args.json)
    return 0
