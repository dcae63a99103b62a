"""Batched against one-by-one drafting, side by side in one run: the same ONNX drafter drafting k
tokens for B sequences as one `propose_batch` (one ONNX Runtime run per draft position for all of
them) or as B `propose` calls (one run per sequence per position). Drafts are identical (checked).
`--threads 1,4,16` repeats the whole run per ONNX Runtime intra-op thread count (default: its own, one
per core): on a many-core host beside a GPU target, how many threads a drafter call needs.

    python bench/bench_drafting.py [--model smollm2-135m] [--batches 1,4,16] [--k 4] [--repeats 5] [--threads N,..]

Writes bench/figures/drafting.json (milliseconds per step's drafting, machine, commit).
"""

import argparse
import time

from orchestrator.drafters.onnx_drafter import OnnxDrafter
from orchestrator.engine import DraftRequest
from orchestrator.models import ExportOptions, export_drafter, load_tokenizer, resolve

from common import machine_line, write_report
from prompts import PROMPTS


def one_step(drafter, requests, batched: bool) -> tuple[float, dict]:
    t0 = time.perf_counter()
    if batched:
        proposals = drafter.propose_batch(requests)
    else:
        proposals = {r.seq_id: drafter.propose(r.seq_id, r.k) for r in requests}
    elapsed = time.perf_counter() - t0
    for r in requests:  # nothing committed: the next step redoes the same work
        drafter.extend(r.seq_id, [])
    return elapsed, {s: p.draft_ids for s, p in proposals.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", default="", help="intra-op thread counts to compare (default: ORT's own)")
    args = ap.parse_args()
    env = machine_line()
    ckpt = resolve(args.model)
    path = export_drafter(ckpt, ExportOptions.for_drafter(), progress=True)
    tokenizer = load_tokenizer(ckpt)
    cells = []
    for threads in [int(t) for t in args.threads.split(",") if t] or [None]:
        drafter = OnnxDrafter(path, num_threads=threads)
        try:
            cells += run_sizes(drafter, tokenizer, args, threads)
        finally:
            drafter.close()
    write_report("drafting", {"environment": env, "model": args.model, "cells": cells})


def run_sizes(drafter, tokenizer, args, threads: int | None) -> list[dict]:
    cells = []
    for size in (int(b) for b in args.batches.split(",")):
        prompts = [tokenizer(PROMPTS[i % len(PROMPTS)]).input_ids for i in range(size)]
        for i, p in enumerate(prompts):
            drafter.start(i, p)
        requests = [DraftRequest(i, args.k) for i in range(size)]
        one_step(drafter, requests, True)  # prefill and warm-up
        times = {"batched": [], "one-by-one": []}
        drafts = {}
        for rep in range(args.repeats):
            order = ("batched", "one-by-one") if rep % 2 == 0 else ("one-by-one", "batched")  # ABBA
            for side in order:
                elapsed, drafts[side] = one_step(drafter, requests, side == "batched")
                times[side].append(elapsed * 1000)
        for i in range(size):
            drafter.finish(i)
        best = {side: min(v) for side, v in times.items()}
        cell = {"threads": threads, "sequences": size, "k": args.k, "ms": times, "best_ms": best,
                "speedup": best["one-by-one"] / best["batched"], "identical": drafts["batched"] == drafts["one-by-one"]}
        cells.append(cell)
        print(f"threads {threads or 'default'}: {size:>3} sequences x k={args.k}: batched {best['batched']:7.1f} ms | one-by-one "
              f"{best['one-by-one']:7.1f} ms | one-by-one / batched {cell['speedup']:.2f}x | "
              f"identical drafts {cell['identical']}", flush=True)
    return cells


if __name__ == "__main__":
    main()
