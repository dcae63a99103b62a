"""The MTP drafter against the ONNX self-drafters and target-only, side by side in one run.

SmolLM2-135M fp32 target on torch CPU, greedy, fixed length; sides: target-only, the MTP drafter
(`hetspec train-drafter`, in process, its torch layer: `runtime: torch`), the INT4 (8-bit lm_head) and
INT8 ONNX self-drafters, each at the same k policy. Workloads: chat (tests/prompts.py PROMPTS, chat
template) and code (CODE). Every side runs each prompt in turn, the order rotating. `--remote` adds the
MTP drafter behind `hetspec drafter serve` in another process (hidden states over the wire) as one more
side.

    hetspec train-drafter --target smollm2-135m --out DIR
    python bench/bench_mtp.py --drafter DIR [--also DIR ...] [--onnx fp32 ...] [--prompts 12] [--tokens 128]
                              [-k auto|N] [--remote] [--auto]

`--also` adds more MTP drafters (another epoch count, other data) as sides `mtp:NAME` of the same run,
the only fair way to compare two drafters' speed; `--onnx` adds --drafter's ONNX export on ONNX
Runtime (`runtime: onnx` in a profile) at the given precisions, `--auto` the drafter with `runtime: auto`
(the default of profiles and the CLI: whichever of torch and the fp32 export a call measured faster on at
start-up). The `--also` and `--remote` sides run the torch layer, as `mtp` does. Prints and writes
bench/figures/NAME.json (`--name`, default mtp-cpu): tokens/s, speedup, alpha per position, mean
accepted length and c per side and workload, with the machine and commit, and the drafter's training
summary.
"""

import argparse
import json
import tempfile
from pathlib import Path

import yaml

from orchestrator.assemble import assemble
from orchestrator.config import EngineConfig, MtpDrafterConfig, OnnxDrafterConfig, RemoteDrafterConfig
from orchestrator.models import encode_prompt

from common import agreement, alternate, hetspec_side, machine_line, merge, write_report
from prompts import CODE, PROMPTS
from servers import Server


def engine_for(drafter, k: str, max_kv_tokens: int = 8192):
    policy = "auto" if k == "auto" else "fixed"
    config = EngineConfig(drafter=drafter, k_policy=policy, max_kv_tokens=max_kv_tokens,
                          **({} if k == "auto" else {"num_speculative_tokens": int(k)}))
    return assemble(config, progress=True).engine(max_num_seqs=1)


def serve_mtp(drafter_dir: str, workdir: Path) -> Server:
    profile = workdir / "mtp-drafter.yaml"
    profile.write_text(yaml.safe_dump({
        "version": 1, "target": {"model": "smollm2-135m", "device": "cpu", "dtype": "float32"},
        "drafters": {"mtp": {"kind": "mtp", "model": drafter_dir, "runtime": "torch"}},
        "speculation": {"drafter": "mtp", "num_speculative_tokens": 8}}))
    return Server("drafter", "serve", "--profile", str(profile), "--port", "0")


def summary(drafter_dir: str) -> dict | None:
    path = Path(drafter_dir) / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", required=True, help="the MTP drafter's directory (hetspec train-drafter --out)")
    ap.add_argument("--prompts", type=int, default=12, help="chat prompts (code has 5)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("-k", default="auto", help="fixed k for every drafter, or auto (the default)")
    ap.add_argument("--remote", action="store_true", help="also the MTP drafter behind `hetspec drafter serve`")
    ap.add_argument("--skip-int8", action="store_true")
    ap.add_argument("--also", nargs="+", default=[], metavar="DIR", help="more MTP drafters, as sides mtp:NAME")
    ap.add_argument("--name", default="mtp-cpu", help="writes bench/figures/NAME.json")
    ap.add_argument("--onnx", nargs="+", default=[], choices=["fp32", "int8", "int4"], metavar="PRECISION",
                    help="also --drafter's ONNX export on ONNX Runtime at these precisions, as sides mtp-onnx-P")
    ap.add_argument("--auto", action="store_true",
                    help="also --drafter with `runtime: auto` (torch or its fp32 export, timed at start-up), as "
                         "side mtp-auto")
    args = ap.parse_args()
    env = machine_line()
    training = summary(args.drafter)
    sides = {"target-only": engine_for(None, "0"),
             "mtp": engine_for(MtpDrafterConfig(model=args.drafter, runtime="torch"), args.k),
             **{f"mtp:{Path(d).name}": engine_for(MtpDrafterConfig(model=d, runtime="torch"), args.k)
                for d in args.also},
             **{f"mtp-onnx-{p}": engine_for(MtpDrafterConfig(model=args.drafter, runtime="onnx", precision=p), args.k)
                for p in args.onnx},
             **({"mtp-auto": engine_for(MtpDrafterConfig(model=args.drafter, runtime="auto"), args.k)}
                if args.auto else {}),
             "onnx-int4": engine_for(OnnxDrafterConfig(precision="int4"), args.k)}
    if not args.skip_int8:
        sides["onnx-int8"] = engine_for(OnnxDrafterConfig(precision="int8", int8_lm_head=False), args.k)
    server = None
    if args.remote:
        server = serve_mtp(str(Path(args.drafter).resolve()), Path(tempfile.mkdtemp()))
        sides["mtp-remote"] = engine_for(RemoteDrafterConfig(address=server.address, hidden_states=True), args.k)
    tokenizer = sides["target-only"].tokenizer
    workloads = {"chat": [encode_prompt(tokenizer, p, chat=True) for p in PROMPTS[:args.prompts]],
                 "code": [encode_prompt(tokenizer, p, chat=True) for p in CODE]}
    report = {"environment": env, "target": "smollm2-135m fp32", "k": args.k, "tokens": args.tokens,
              "drafter_dir": str(args.drafter), "training": training, "workloads": {},
              "also": {f"mtp:{Path(d).name}": {"drafter_dir": d, "training": summary(d)} for d in args.also}}
    if args.auto:
        drafter = sides["mtp-auto"].drafter
        report["auto"] = {"chosen": drafter.runtime, "ms_per_call": drafter.timings_ms}
        print(f"mtp-auto: runtime {drafter.runtime} (ms per call: {drafter.timings_ms})", flush=True)
    print(f"SmolLM2-135M fp32 target, k={args.k}, {args.tokens} tokens per prompt, greedy; sides "
          f"{', '.join(sides)}", flush=True)
    try:
        for engine in sides.values():  # warm-up: allocator, ORT sessions, the drafter server
            hetspec_side(engine, 8)(workloads["chat"][0])
        for name, prompts in workloads.items():
            runs = alternate([hetspec_side(e, args.tokens) for e in sides.values()], prompts)
            base_tps, base_out, _ = runs[0]
            cells = {}
            for side, (tps, out, stats) in zip(sides, runs):
                cell = {"tokens_per_s": round(tps, 2), "speedup": round(tps / base_tps, 3),
                        "agreement": agreement(out, base_out), "identical": out == base_out}
                if side != "target-only":
                    m = merge(stats)
                    # c: the drafter's seconds per drafted token over the target's seconds per token
                    m["c"] = round(m["draft_s"] / max(1, m["num_drafted"]) * base_tps, 3)
                    cell.update(m)
                cells[side] = cell
                extra = "" if side == "target-only" else (
                    f" | alpha/pos {cell['alpha_per_position']} | mean accepted {cell['mean_accepted_length']}"
                    f" | c {cell['c']}")
                print(f"{name:5} {side:16} {tps:7.2f} tok/s  {tps / base_tps:5.2f}x  {cell['agreement']}{extra}",
                      flush=True)
            report["workloads"][name] = {"prompts": len(prompts), "sides": cells}
    finally:
        if server is not None:
            server.stop()
    write_report(args.name, report)


if __name__ == "__main__":
    main()
