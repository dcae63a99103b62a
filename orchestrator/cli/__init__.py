"""`hetspec` command line: one module per verb, each adding its parser and handler.

    hetspec generate | export-drafter | train-drafter | devices | profile check|run|compare | serve | client | drafter serve
    | cluster up|status|down

A handler takes the parsed args and returns an exit code. Errors a user can act on
(`HetspecError`) are one line on stderr and exit 1; bad flags exit 2; a bug is one line
too (exit 70), with the traceback behind HETSPEC_DEBUG=1.
"""

import logging
import os
import sys

from orchestrator.cli import client, cluster, devices, drafter, export, generate, profile, serve, train
from orchestrator.cli.common import Parser, UsageError
from orchestrator.errors import HetspecError


def build_parser() -> Parser:
    parser = Parser(prog="hetspec", description="Speculative decoding across heterogeneous devices.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    generate.add_parser(sub)
    export.add_parser(sub)
    train.add_parser(sub)
    profile.add_parser(sub, Parser)
    devices.add_parser(sub)
    serve.add_parser(sub)
    client.add_parser(sub)
    drafter.add_parser(sub, Parser)
    cluster.add_parser(sub, Parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="hetspec: %(message)s")
    _quiet_transformers()
    try:
        return args.func(args)
    except UsageError as e:
        print(f"hetspec {args.command}: error: {e}", file=sys.stderr)
        return 2
    except HetspecError as e:
        print(f"hetspec: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`hetspec generate ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141
    except Exception as e:  # a bug: still one line for the user, the traceback on request
        if os.environ.get("HETSPEC_DEBUG"):
            raise
        print(f"hetspec: internal error: {type(e).__name__}: {e} (HETSPEC_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 70


def _quiet_transformers() -> None:
    try:
        from transformers.utils import logging as hf_logging  # heavy; only its logger is wanted here

        hf_logging.set_verbosity_error()
    except ImportError:
        pass
