"""`hetspec generate`: one prompt, streamed, over the profile's engine with explicit flags on top."""

import argparse

from orchestrator.assemble import build_engine
from orchestrator.cli.common import (
    add_export_args,
    add_model_arg,
    add_sampling_args,
    check_acceptance,
    positive,
    print_result,
    sampling_params,
)
from orchestrator.config import DTYPES
from orchestrator.models import encode_prompt
from orchestrator.profiles import Overrides, apply_overrides, load_profile

DEFAULT_PROFILE = "cpu"


def add_parser(sub) -> None:
    g = sub.add_parser("generate", help="generate text for one prompt, streaming it")
    g.add_argument("prompt")
    add_model_arg(g)
    # unset flags stay None: the profile's value is used (orchestrator/profiles/overrides.py)
    g.add_argument("--drafter", choices=("onnx", "ngram", "mtp"), default=None,
                   help="draft source (default onnx INT4); mtp: a drafter made by `hetspec train-drafter`, "
                        "given as --drafter-model DIR")
    g.add_argument("--drafter-model", default=None, metavar="MODEL",
                   help="the drafter's own checkpoint, e.g. qwen2.5-coder-0.5b for a qwen2.5-coder-1.5b target "
                        "(default: the target's), or the directory of an mtp drafter")
    add_sampling_args(g)
    g.add_argument("--adaptive-k", action="store_true",
                   help="HF's heuristic instead of the cost model: +2 after a full accept, -1 after a rejection")
    g.add_argument("--overlap", action="store_true", default=None,
                   help="draft the next step while the target verifies this one (greedy requests; "
                        "pays where drafter and target sit on different devices or cores)")
    g.add_argument("--device", default=None, help="target device, e.g. cpu or cuda:0")
    g.add_argument("--dtype", choices=DTYPES, default=None, help="target dtype")
    add_export_args(g, defaults=False)
    g.add_argument("--kv-handoff", action=argparse.BooleanOptionalAction, default=None,
                   help="start the ONNX self-drafter from the target's prefill K/V instead of its own prefill "
                        "(default: on where the drafter is the target's own export)")
    g.add_argument("--drafter-device", default=None, metavar="DEVICE",
                   help="the ONNX drafter's device: cpu, cuda:N or npu:N (picks the provider; KV buffers live there)")
    g.add_argument("--drafter-ep", action="append", default=None, metavar="PROVIDER",
                   help="ONNX Runtime execution provider(s) for the drafter, in order of preference "
                        "(repeatable; default: the drafter device's provider)")
    g.add_argument("--drafter-threads", type=positive, default=None, metavar="N",
                   help="ONNX Runtime intra-op threads for the drafter (default: one per core)")
    g.add_argument("--profile", default=None, metavar="FILE|NAME",
                   help=f"placement profile giving the defaults (default: the shipped '{DEFAULT_PROFILE}'); "
                        "flags override it")
    g.set_defaults(func=run)


def overrides(args: argparse.Namespace) -> Overrides:
    return Overrides(model=args.model, device=args.device, dtype=args.dtype, drafter=args.drafter,
                     drafter_model=args.drafter_model,
                     no_spec=args.no_spec, num_speculative_tokens=args.num_speculative_tokens,
                     adaptive_k=args.adaptive_k, precision=args.precision, block_size=args.block_size,
                     int8_lm_head=args.int8_lm_head, kv_handoff=args.kv_handoff, drafter_device=args.drafter_device,
                     drafter_providers=tuple(args.drafter_ep or ()), drafter_threads=args.drafter_threads,
                     overlap=args.overlap)


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)
    config = apply_overrides(load_profile(args.profile or DEFAULT_PROFILE), overrides(args))
    check_acceptance(params, config.acceptance)  # before the model loads
    engine = build_engine(config, progress=not args.json)
    prompt_ids = encode_prompt(engine.tokenizer, args.prompt, chat=not args.raw)

    def stream(out):
        if not args.json:
            print(out.text, end="", flush=True)

    seq = engine.generate(prompt_ids, params, on_output=stream)
    print_result(seq.result(config.drafter_kind if seq.k else "none"), as_json=args.json)
    return 0
