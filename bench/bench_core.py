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
from prompts import GROUNDED, PROMPTS  # noqa: E402

from orchestrator.build import eos_token_ids, load_tokenizer  # noqa: E402
from orchestrator.checkpoints import resolve  # noqa: E402
from orchestrator.config import SamplingParams  # noqa: E402
from orchestrator.drafters.ngram import NgramDrafter  # noqa: E402
from orchestrator.engine import Engine  # noqa: E402
from orchestrator.target import TargetRunner  # noqa: E402

DRAFTERS = {  # name -> ExportOptions kwargs
    "int4": dict(precision="int4", block_size=32),
    "int4-lmh8": dict(precision="int4", block_size=32, int8_lm_head=True),
    "int8": dict(precision="int8", block_size=32),
}


def encode(tok, prompt):
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def run_hetspec(engine, prompts, tokens, k=None):
    """-> (tokens/s over all prompts, outputs, merged stats)."""
    outputs, elapsed, stats = [], 0.0, []
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True, num_speculative_tokens=k)
    for ids in prompts:
        t0 = time.perf_counter()
        seq = engine.generate(ids, params)
        elapsed += time.perf_counter() - t0
        outputs.append(seq.output_ids)
        stats.append(seq.stats)
    return sum(map(len, outputs)) / elapsed, outputs, stats


def side_by_side(engine, baseline, prompts, tokens):
    """Alternate candidate and baseline prompt by prompt, so drifts in machine speed (this is a
    shared VM) hit both sides alike. -> ((tok/s, outputs, stats) candidate, same for baseline)."""
    sides = {"cand": [0.0, [], []], "base": [0.0, [], []]}
    for ids in prompts:
        for name, eng in (("cand", engine), ("base", baseline)):
            tps, out, stats = run_hetspec(eng, [ids], tokens)
            sides[name][0] += len(out[0]) / tps
            sides[name][1] += out
            sides[name][2] += stats
    return tuple((sum(map(len, out)) / elapsed, out, stats) for elapsed, out, stats in sides.values())


def run_hf(model, prompts, tokens, **kw):
    outputs, elapsed = [], 0.0
    for ids in prompts:
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(x, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, **kw)
        elapsed += time.perf_counter() - t0
        outputs.append(out[0, len(ids):].tolist())
    return sum(map(len, outputs)) / elapsed, outputs


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
    run_hetspec(plain, prompts[:1], 8)  # warm-up
    hf = AutoModelForCausalLM.from_pretrained(ckpt.hf_dir, dtype=dtype).eval()
    if not args.skip_hf:
        base_tps, base_out, hf_tps, hf_out = 0.0, [], 0.0, []
        t_base = t_hf = 0.0
        for ids in prompts:  # alternate, as side_by_side does
            tps, out, _ = run_hetspec(plain, [ids], args.tokens)
            base_out += out
            t_base += len(out[0]) / tps
            tps, out = run_hf(hf, [ids], args.tokens)
            hf_out += out
            t_hf += len(out[0]) / tps
        base_tps, hf_tps = sum(map(len, base_out)) / t_base, sum(map(len, hf_out)) / t_hf
        same = sum(a == b for a, b in zip(base_out, hf_out))
        line("(a) target-only vs HF generate", "hetspec", base_tps, "HF", hf_tps)
        print(f"    vs HF: {agreement(base_out, hf_out)}")
        report["target_only_tps"] = base_tps
        report["a"] = {"hetspec_tps": base_tps, "hf_tps": hf_tps, "ratio": base_tps / hf_tps,
                       "identical": same}

    report["b"] = {}
    from orchestrator.drafters.onnx_drafter import OnnxDrafter
    from orchestrator.export import ExportOptions, export_drafter

    runs = [(n, False) for n in filter(None, args.drafters.split(","))]
    runs += [(n, True) for n in filter(None, args.adaptive.split(","))]
    for name, adaptive in runs:
        drafter = OnnxDrafter(export_drafter(ckpt, ExportOptions(**DRAFTERS[name]), progress=False))
        spec = Engine(target, tok, drafter, num_speculative_tokens=args.k, eos_token_ids=eos,
                      adaptive_k=adaptive)
        name += " adaptive" if adaptive else ""
        run_hetspec(spec, prompts[:1], 8)
        (tps, out, stats), (base_tps, base_out, _) = side_by_side(spec, plain, prompts, args.tokens)
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
        (ng_tps, ng_out, ng_stats), (ngp_tps, ngp_out, _) = side_by_side(ng, plain, grounded * 2, args.tokens)
        line(f"(c0) n-gram{' adaptive' if adaptive else ''} vs target-only (grounded)", "ngram", ng_tps,
             "target", ngp_tps)
        print(f"    vs target-only: {agreement(ng_out, ngp_out)}; mean accepted length "
              f"{merge(ng_stats)['mean_accepted_length']}")
        report["c"]["adaptive" if adaptive else "ngram"] = {"ngram_tps": ng_tps, "target_tps": ngp_tps,
                                                             **merge(ng_stats)}
    if not args.skip_hf:  # `ng` is now the plain n-gram engine; alternate it with HF's prompt lookup
        elapsed, counts, same = [0.0, 0.0], [0, 0], True
        for ids in grounded * 2:
            tps, out, _ = run_hetspec(ng, [ids], args.tokens)
            hf_tps, hf_out = run_hf(hf, [ids], args.tokens, prompt_lookup_num_tokens=args.k)
            for i, (t, o) in enumerate(((tps, out[0]), (hf_tps, hf_out[0]))):
                elapsed[i] += len(o) / t
                counts[i] += len(o)
            same = same and out[0] == hf_out[0]
        ng_tps, hfpl_tps = counts[0] / elapsed[0], counts[1] / elapsed[1]
        line("(c) n-gram vs HF prompt_lookup (grounded)", "hetspec", ng_tps, "HF", hfpl_tps)
        print(f"    identical outputs: {same}")
        report["c"].update(hetspec_ngram_tps=ng_tps, hf_prompt_lookup_tps=hfpl_tps, ratio=ng_tps / hfpl_tps)
    out_dir = Path(__file__).parent / "out"
    out_dir.mkdir(exist_ok=True)
    (out_dir / f"core-{args.dtype}.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
