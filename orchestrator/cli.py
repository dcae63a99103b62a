"""`hetspec` command line: one subcommand per verb; each sets `func` to its handler."""

import argparse
import json
import logging
import os
import sys

from orchestrator.config import DRAFTERS, DTYPES, DrafterConfig, SamplingParams
from orchestrator.errors import HetspecError

PRECISIONS = ("int4", "int8", "fp32")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        self.exit(2, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None,
                   help="HF checkpoint dir, GGUF file, or smollm2-135m / gemma3-270m (default smollm2-135m)")


def _add_drafter_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--precision", choices=PRECISIONS, default="int4", help="ONNX drafter weights")
    p.add_argument("--block-size", type=_positive, default=32, help="quantization block size")
    p.add_argument("--int8-lm-head", action=argparse.BooleanOptionalAction, default=True,
                   help="keep the sensitive lm_head at 8 bits (INT4 only; default on: better acceptance)")


def _add_provider_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter-ep", action="append", default=None, metavar="PROVIDER",
                   help="ONNX Runtime execution provider for the drafter, in order of preference "
                        "(repeatable; default CPUExecutionProvider)")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    """The per-request flags shared by `generate` and `client`."""
    p.add_argument("--no-spec", action="store_true", help="target only, no speculation")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4, help="draft length k")
    p.add_argument("--max-new-tokens", type=_positive, default=128)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not apply the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    # unset: the profile's (generate) or the server's (client) k
    p.set_defaults(num_speculative_tokens=None)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hetspec", description="Speculative decoding across heterogeneous devices.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    g = sub.add_parser("generate", help="generate text for one prompt, streaming it")
    g.add_argument("prompt")
    _add_model_args(g)
    g.add_argument("--drafter", choices=DRAFTERS[:2], default="onnx", help="draft source (default onnx INT4)")
    add_sampling_args(g)
    g.add_argument("--adaptive-k", action="store_true",
                   help="vary the draft length per step: +2 after a full accept, -1 after a rejection")
    g.add_argument("--device", default="cpu", help="target device, e.g. cpu or cuda:0")
    g.add_argument("--dtype", choices=DTYPES, default="float32", help="target dtype")
    _add_drafter_args(g)
    g.add_argument("--kv-handoff", action="store_true", default=None,
                   help="start the ONNX self-drafter from the target's prefill K/V instead of its own prefill")
    _add_provider_arg(g)
    g.add_argument("--profile", default=None, metavar="FILE|NAME",
                   help="placement profile giving the defaults (default: the shipped 'cpu'); flags override it")
    # unset flags stay None, so the profile's value is used (see orchestrator/profiles/overrides.py)
    g.set_defaults(device=None, dtype=None, drafter=None, num_speculative_tokens=None, adaptive_k=None,
                   precision=None, block_size=None, int8_lm_head=None)

    e = sub.add_parser("export-drafter", help="export a checkpoint as an ONNX drafter (cached)")
    _add_model_args(e)
    _add_drafter_args(e)
    e.add_argument("--out", default=None, help="output directory (default: the user cache)")
    g.set_defaults(func=_generate)
    e.set_defaults(func=_export)
    _add_profile_group(sub)
    from orchestrator.server import cli as server_cli

    server_cli.add_parsers(sub, add_sampling_args)  # serve, client, drafter serve
    # Further subcommands register themselves: add_parser(sub) puts a parser with
    # set_defaults(func=handler) on `sub`; handlers take the args and return an exit code.
    return parser


def _add_profile_group(sub) -> None:
    """`hetspec profile <verb>`: each verb's module registers itself on `psub`; plus `hetspec devices`."""
    from orchestrator.profiler import cli as profiler_cli
    from orchestrator.profiles import cli as profiles_cli

    p = sub.add_parser("profile", help="device-placement profiles (check) and profiling runs (run, compare)")
    psub = p.add_subparsers(dest="profile_command", required=True, parser_class=_Parser)
    profiles_cli.add_parsers(psub)
    profiler_cli.add_parsers(psub)  # run, compare
    profiles_cli.add_devices_parser(sub)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING, format="hetspec: %(message)s")
    _quiet_transformers()
    try:
        return args.func(args)
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
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:
        pass


def _drafter_config(args, kind: str) -> DrafterConfig:
    return DrafterConfig(kind=kind, precision=args.precision, block_size=args.block_size,
                         int8_lm_head=args.int8_lm_head)


def _generate(args) -> int:
    from orchestrator.build import build_engine, encode_prompt
    from orchestrator.profiles.overrides import engine_config_from_args

    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                            top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=tuple(args.stop),
                            speculate=not args.no_spec)
    params.validate()
    if not args.prompt.strip():
        raise HetspecError("prompt is empty")
    config = engine_config_from_args(args)
    kind = config.drafter.kind
    engine, ckpt = build_engine(config, progress=not args.json)
    prompt_ids = encode_prompt(engine.tokenizer, args.prompt, chat=not args.raw)

    def stream(out):
        if not args.json:
            print(out.text, end="", flush=True)

    seq = engine.generate(prompt_ids, params, on_output=stream)
    print_result(seq.result(kind if seq.k else "none"), as_json=args.json)
    return 0


def print_result(result: dict, as_json: bool) -> None:
    """After streaming: one JSON object (--json), or a newline and the summary line on stderr."""
    if as_json:
        print(json.dumps(result))
    else:
        print()
        print(_summary(result), file=sys.stderr)


def _summary(result: dict) -> str:
    s = result["stats"]
    line = (f"[hetspec] {result['usage']['completion_tokens']} tokens, {s['tokens_per_s']:.1f} tok/s, "
            f"TTFT {s['ttft_s'] * 1000:.0f} ms, finish={result['finish_reason']}")
    if s["drafter"] != "none":
        per_pos = " ".join(f"{a:.2f}" for a in s["acceptance_per_position"])
        line += (f" | drafter {s['drafter']} k={s['k']}: accepted {s['num_accepted']}/{s['num_drafted']}, "
                 f"mean accepted length {s['mean_accepted_length']:.2f}, per position [{per_pos}]")
    return line


def _export(args) -> int:
    from pathlib import Path

    from orchestrator.build import export_options
    from orchestrator.checkpoints import resolve
    from orchestrator.export import export_drafter

    options = export_options(_drafter_config(args, "onnx"))
    out = export_drafter(resolve(args.model), options, out_dir=Path(args.out) if args.out else None)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
