"""`hetspec export-drafter`: build (or find in the cache) an ONNX drafter and print its directory."""

import argparse
from pathlib import Path

from orchestrator.cli.common import add_export_args, add_model_arg
from orchestrator.models import ExportOptions, export_drafter, resolve


def add_parser(sub) -> None:
    e = sub.add_parser("export-drafter", help="export a checkpoint as an ONNX drafter (cached)")
    add_model_arg(e)
    add_export_args(e)
    e.add_argument("--out", default=None, help="output directory (default: the user cache)")
    e.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    options = ExportOptions.for_drafter(args.precision, args.block_size, args.int8_lm_head)
    print(export_drafter(resolve(args.model), options, out_dir=Path(args.out) if args.out else None))
    return 0
