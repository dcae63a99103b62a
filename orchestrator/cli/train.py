"""`hetspec train-drafter`: distil a multi-token-prediction drafter from a target (`orchestrator.mtp`)."""

import argparse
import json
from pathlib import Path

from orchestrator.cli.common import UsageError
from orchestrator.mtp.train import TrainOptions, train_drafter


def add_parser(sub) -> None:
    t = sub.add_parser("train-drafter", help="train an MTP drafter for a target by distillation (cached teacher)")
    t.add_argument("--target", required=True, metavar="MODEL",
                   help="the target: HF dir, GGUF file or an embedded name (e.g. smollm2-135m)")
    t.add_argument("--out", required=True, help="directory for the drafter (safetensors + JSON, curves)")
    d = TrainOptions(target="", out=Path())
    t.add_argument("--tokens", type=int, default=d.tokens, help=f"training-token budget (default {d.tokens})")
    t.add_argument("--distill-share", type=float, default=d.distill_share,
                   help="share of the tokens from the target's own greedy responses; the rest is Python "
                        f"stdlib source (default {d.distill_share})")
    t.add_argument("--response-tokens", type=int, default=d.response_tokens,
                   help=f"longest self-distilled response (default {d.response_tokens})")
    t.add_argument("--draft-vocab", type=int, default=d.draft_vocab,
                   help=f"draft vocabulary: the most frequent target tokens (default {d.draft_vocab})")
    t.add_argument("--epochs", type=int, default=d.epochs)
    t.add_argument("--batch-size", type=int, default=d.batch_size)
    t.add_argument("--seq-len", type=int, default=d.seq_len)
    t.add_argument("--lr", type=float, default=d.lr)
    t.add_argument("--temperature", type=float, nargs=2, default=d.temperature, metavar=("START", "END"),
                   help="KD temperature schedule (default 2.0 -> 1.0)")
    t.add_argument("--soft-weight", type=float, nargs=2, default=d.soft_weight, metavar=("START", "END"),
                   help="weight of the soft (KL) loss against the hard one, start -> end (default 0.9 -> 0.2)")
    t.add_argument("--unroll", type=int, default=d.unroll,
                   help="training passes per batch, each reading the features the pass before predicted, as "
                        f"drafting does past its first token (default {d.unroll})")
    t.add_argument("--unroll-decay", type=float, default=d.unroll_decay,
                   help=f"pass u's loss weighs DECAY^(u-1) (default {d.unroll_decay})")
    t.add_argument("--seed", type=int, default=d.seed)
    t.add_argument("--resume", action="store_true", help="continue the run in --out")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and any(out.iterdir()) and not args.resume:
        raise UsageError(f"--out {out} is not empty: pass --resume to continue that run, or another directory")
    opts = TrainOptions(target=args.target, out=out, tokens=args.tokens, distill_share=args.distill_share,
                        response_tokens=args.response_tokens, draft_vocab=args.draft_vocab, epochs=args.epochs,
                        batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr, unroll=args.unroll,
                        unroll_decay=args.unroll_decay,
                        temperature=tuple(args.temperature), soft_weight=tuple(args.soft_weight), seed=args.seed,
                        resume=args.resume, progress=not args.no_progress)
    summary = train_drafter(opts)
    held = summary["held_out"]
    print(json.dumps({"out": str(out), "tokens": summary["num_tokens"], "train_s": round(summary["train_s"], 1),
                      "total_s": round(summary["total_s"], 1), "alpha": [round(a, 3) for a in held["alpha"]],
                      "mean_accepted_len": round(held["mean_accepted_len"], 3)}))
    return 0
