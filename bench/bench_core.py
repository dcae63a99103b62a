"""Side-by-side benchmark, one process, same target: prints both sides and the ratio.

(a) hetspec target-only vs HF transformers `generate` (greedy, same model, same dtype)
(b) hetspec speculative (ONNX drafters) vs hetspec target-only: speedup, alpha per position,
    mean accepted length, drafter/target cost ratio c
(c) hetspec n-gram drafter vs HF `prompt_lookup_num_tokens` on a grounded rewrite prompt

    python bench/bench_core.py [--dtype float32|bfloat16] [--tokens 128] [--prompts 5] [--k 4]
        [--drafters int4,int4-lmh8,int8]

Run it on an otherwise idle machine; results also go to bench/out/core-DTYPE.json.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from orchestrator.config import SamplingParams  # noqa: E402
from orchestrator.drafters.ngram import NgramDrafter  # noqa: E402
from orchestrator.engine import Engine  # noqa: E402
from orchestrator.models import (  # noqa: E402
    TargetRunner,  # noqa: E402
    eos_token_ids,
    load_tokenizer,
    resolve,  # noqa: E402
)

from prompts import GROUNDED, PROMPTS  # noqa: E402

DRAFTERS = {  # name -> ExportOptions kwargs
    "int4": dict(precision="int4", block_size=32),
    "int4-lmh8": dict(precision="int4", block_size=32, int8_lm_head=True),
    "int8": dict(precision="int8", block_size=32),
}


def encode(tok, prompt):
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def hetspec_side(engine, tokens):
    """One prompt through a hetspec engine -> (generated ids, stats)."""
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)

    def run(ids):
        seq = engine.generate(ids, params)
        return seq.output_ids, seq.stats
    return run


def hf_side(model, tokens, **kw):
    """One prompt through HF `generate` (greedy, exactly `tokens` new tokens) -> (ids, None)."""
    def run(ids):
        with torch.inference_mode():
            out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=False, **kw)
        return out[0, len(ids):].tolist(), None
    return run


def alternate(sides, prompts):
    """Run every side on each prompt in turn, so drifts in machine speed (this is a shared VM)
    hit all sides alike. -> per side: (tokens/s, outputs, stats)."""
    results = [[0.0, [], []] for _ in sides]
    for ids in prompts:
        for side, result in zip(sides, results):
            t0 = time.perf_counter()
            out, stats = side(ids)
            result[0] += time.perf_counter() - t0
            result[1].append(out)
            result[2].append(stats)
    return [(sum(map(len, out)) / elapsed, out, stats) for elapsed, out, stats in results]


def merge(stats):
    drafted, accepted = [], []
    for s in stats:
        for j, (d, a) in enumerate(zip(s.drafted_per_position, s.accepted_per_position)):
            if j == len(drafted):
                drafted.append(0)
                accepted.append(0)
            drafted[j] += d
            accepted[j] += a
    steps = sum(s.num_steps for s in stats)
    return {
        "alpha_per_position": [round(a / d, 3) if d else 0.0 for a, d in zip(accepted, drafted)],
        "acceptance_rate": round(sum(accepted) / max(1, sum(drafted)), 3),
        "mean_accepted_length": round(sum(s.num_committed for s in stats) / max(1, steps), 3),
        "draft_s": sum(s.time_draft_s for s in stats),
        "verify_s": sum(s.time_verify_s for s in stats),
        "num_drafted": sum(drafted),
        "num_steps": steps,
    }


def agreement(outputs, reference) -> str:
    """Identical outputs, and tokens before the first divergence (a near-tie flip in low precision)."""
    same = sum(a == b for a, b in zip(outputs, reference))
    prefix = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a)) for a, b in zip(outputs, reference)]
    return f"identical outputs {same}/{len(outputs)}, first divergence at tokens {prefix}"


def line(name, a_name, a, b_name, b):
    print(f"{name:<44} {a_name} {a:7.2f} tok/s | {b_name} {b:7.2f} tok/s | ratio {a / b:5.2f}x", flush=True)


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
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    ckpt = resolve(args.model)
    tok = load_tokenizer(ckpt)
    prompts = [encode(tok, p) for p in PROMPTS[:args.prompts]]
    dtype = getattr(torch, args.dtype)
    target = TargetRunner(ckpt, max_kv_tokens=8192, dtype=dtype)
    eos = eos_token_ids(ckpt, tok)
    plain = Engine(target, tok, None, eos_token_ids=eos)
    report = {"model": str(ckpt.source), "dtype": args.dtype, "tokens": args.tokens, "prompts": len(prompts),
              "threads": torch.get_num_threads()}
    print(f"model {ckpt.source.name}, {len(prompts)} prompts x {args.tokens} tokens, greedy, {args.dtype}, "
          f"{torch.get_num_threads()} threads")
    base_side = hetspec_side(plain, args.tokens)
    hetspec_side(plain, 8)(prompts[0])  # warm-up
    hf = AutoModelForCausalLM.from_pretrained(ckpt.hf_dir, dtype=dtype).eval()
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
    from orchestrator.drafters.onnx_drafter import OnnxDrafter
    from orchestrator.models import ExportOptions, export_drafter

    runs = [(n, False) for n in filter(None, args.drafters.split(","))]
    runs += [(n, True) for n in filter(None, args.adaptive.split(","))]
    for name, adaptive in runs:
        drafter = OnnxDrafter(export_drafter(ckpt, ExportOptions(**DRAFTERS[name]), progress=False))
        spec = Engine(target, tok, drafter, num_speculative_tokens=args.k, eos_token_ids=eos,
                      adaptive_k=adaptive)
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

    grounded = [encode(tok, GROUNDED)]
    report["c"] = {}
    for adaptive in (True, False):  # the plain n-gram run is the one compared with HF below
        ng = Engine(target, tok, NgramDrafter(), num_speculative_tokens=args.k, eos_token_ids=eos,
                    adaptive_k=adaptive)
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
    out_dir = Path(__file__).parent / "out"
    out_dir.mkdir(exist_ok=True)
    (out_dir / f"core-{args.dtype}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
