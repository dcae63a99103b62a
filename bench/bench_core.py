"""Side-by-side benchmark, one process, same target: prints both sides and the ratio.

(a) hetspec target-only vs HF transformers `generate` (greedy, same model, same dtype)
(b) hetspec speculative (ONNX drafters) vs hetspec target-only: speedup, alpha per position,
    mean accepted length, drafter/target cost ratio c
(c) hetspec n-gram drafter vs HF `prompt_lookup_num_tokens` on a grounded rewrite prompt

    python bench/bench_core.py [--dtype float32|bfloat16|float16] [--tokens 128] [--prompts 5] [--k 4]
        [--drafters int4,int4-lmh8,int8] [--device cpu|cuda:0]

`--device` places the target (and HF's model); the ONNX drafters stay on the CPU provider: on a GPU
host that is the heterogeneous pair (GPU target, CPU drafter). Run it on an otherwise idle machine;
results also go to bench/figures/core-DTYPE.json (core-DTYPE-cuda.json for a CUDA target; `--name NAME`: NAME.json).
"""

import argparse

import torch

from orchestrator.drafters import NgramDrafter, OnnxDrafter
from orchestrator.engine import Engine
from orchestrator.models import (
    ExportOptions,
    TargetRunner,
    encode_prompt,
    eos_token_ids,
    export_drafter,
    load_tokenizer,
    resolve,
)

from common import add_name_arg, agreement, alternate, hetspec_side, hf_side, line, machine_line, merge, write_report
from prompts import GROUNDED, PROMPTS

DRAFTERS = {  # name -> ExportOptions kwargs
    "int4": dict(precision="int4", block_size=32),
    "int4-lmh8": dict(precision="int4", block_size=32, int8_lm_head=True),
    "int8": dict(precision="int8", block_size=32),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--drafters", default="int4,int4-lmh8,int8")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--adaptive", default="int4-lmh8", help="drafters also run with adaptive k")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--device", default="cpu", help="the target's device (the ONNX drafters run on the CPU)")
    add_name_arg(ap, "core-DTYPE[-DEVICE]")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    ckpt = resolve(args.model)
    tok = load_tokenizer(ckpt)
    prompts = [encode_prompt(tok, p, chat=True) for p in PROMPTS[:args.prompts]]
    dtype = getattr(torch, args.dtype)
    target = TargetRunner(ckpt, max_kv_tokens=8192, dtype=dtype, device=args.device)
    eos = eos_token_ids(ckpt, tok)
    plain = Engine(target, tok, None, eos_token_ids=eos)
    report = {"environment": machine_line(), "model": str(ckpt.source.name), "dtype": args.dtype, "device": args.device,
              "tokens": args.tokens, "prompts": len(prompts)}
    print(f"model {ckpt.source.name}, {len(prompts)} prompts x {args.tokens} tokens, greedy, {args.dtype}, "
          f"{torch.get_num_threads()} threads, target on {args.device}")
    base_side = hetspec_side(plain, args.tokens)
    hetspec_side(plain, 8)(prompts[0])  # warm-up
    hf = AutoModelForCausalLM.from_pretrained(ckpt.hf_dir, dtype=dtype).to(args.device).eval()
    if not args.skip_hf:
        (base_tps, base_out, _), (hf_tps, hf_out, _) = alternate(
            [base_side, hf_side(hf, args.tokens)], prompts)
        same = sum(a == b for a, b in zip(base_out, hf_out))
        line("(a) target-only vs HF generate", "hetspec", base_tps, "HF", hf_tps)
        print(f"    vs HF: {agreement(base_out, hf_out)}")
        report["target_only_tps"] = base_tps
        report["a"] = {"hetspec_tps": base_tps, "hf_tps": hf_tps, "ratio": base_tps / hf_tps,
                       "identical": same}

    report["b"] = {}
    runs = [(n, False) for n in filter(None, args.drafters.split(","))]
    runs += [(n, True) for n in filter(None, args.adaptive.split(","))]
    for name, adaptive in runs:
        drafter = OnnxDrafter(export_drafter(ckpt, ExportOptions(**DRAFTERS[name]), progress=False))
        spec = Engine(target, tok, drafter, num_speculative_tokens=args.k, eos_token_ids=eos,
                      k_policy="adaptive" if adaptive else "fixed")
        name += " adaptive" if adaptive else ""
        hetspec_side(spec, 8)(prompts[0])  # warm-up
        (tps, out, stats), (base_tps, base_out, _) = alternate(
            [hetspec_side(spec, args.tokens), base_side], prompts)
        m = merge(stats)
        c = (m["draft_s"] / max(1, m["num_drafted"])) * base_tps
        line(f"(b) spec {name} k={args.k} vs target-only", "spec", tps, "target", base_tps)
        print(f"    alpha per position {m['alpha_per_position']}, mean accepted length "
              f"{m['mean_accepted_length']}, c = {c:.3f}")
        print(f"    vs target-only: {agreement(out, base_out)}")
        report["b"][name] = {"spec_tps": tps, "target_tps": base_tps, "ratio": tps / base_tps, "c": c, **m}
        drafter.close()

    grounded = [encode_prompt(tok, GROUNDED, chat=True)]
    report["c"] = {}
    for adaptive in (True, False):  # the plain n-gram run is the one compared with HF below
        ng = Engine(target, tok, NgramDrafter(), num_speculative_tokens=args.k, eos_token_ids=eos,
                    k_policy="adaptive" if adaptive else "fixed")
        (ng_tps, ng_out, ng_stats), (ngp_tps, ngp_out, _) = alternate(
            [hetspec_side(ng, args.tokens), base_side], grounded * 2)
        line(f"(c0) n-gram{' adaptive' if adaptive else ''} vs target-only (grounded)", "ngram", ng_tps,
             "target", ngp_tps)
        print(f"    vs target-only: {agreement(ng_out, ngp_out)}; mean accepted length "
              f"{merge(ng_stats)['mean_accepted_length']}")
        report["c"]["adaptive" if adaptive else "ngram"] = {"ngram_tps": ng_tps, "target_tps": ngp_tps,
                                                             **merge(ng_stats)}
    if not args.skip_hf:  # `ng` is now the plain n-gram engine; alternate it with HF's prompt lookup
        (ng_tps, ng_out, _), (hfpl_tps, hfpl_out, _) = alternate(
            [hetspec_side(ng, args.tokens), hf_side(hf, args.tokens, prompt_lookup_num_tokens=args.k)],
            grounded * 2)
        same = ng_out == hfpl_out
        line("(c) n-gram vs HF prompt_lookup (grounded)", "hetspec", ng_tps, "HF", hfpl_tps)
        print(f"    identical outputs: {same}")
        report["c"].update(hetspec_ngram_tps=ng_tps, hf_prompt_lookup_tps=hfpl_tps, ratio=ng_tps / hfpl_tps)
    device_kind = args.device.split(":")[0]
    write_report(args.name or f"core-{args.dtype}" + ("" if device_kind == "cpu" else f"-{device_kind}"), report)

if __name__ == "__main__":
    main()
