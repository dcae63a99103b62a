"""MTP drafters' agreement with their target on the prompts the benches measure, next to the held-out figure.

Training reports agreement on held-out responses to its own prompt set; this asks the same question
(`orchestrator.mtp.train.evaluate`: drafting only where inference drafts, after each prompt) on the
greedy responses to the chat and code prompts of `bench_mtp.py`, which training never saw. No timing:
it tells whether a drafter that looks better held out also agrees better where it is measured.

    python bench/bench_mtp_agreement.py --drafter DIR [DIR ...] [--tokens 128]

Prints and writes bench/figures/mtp-agreement-cpu.json: per drafter, its training summary's held-out
figures and, per workload (and with `--held-out` on training's own held-out split, scored as
training now scores it), top-1 agreement, acceptance per draft position, P(drafts 1..j all right)
and the mean committed tokens of a step drafting 6.
"""

import argparse

import torch

from orchestrator.models import cache_root, load_tokenizer, resolve
from orchestrator.mtp import MtpModel
from orchestrator.mtp.data import TEACHER_NAME, DataOptions, assemble_responses, build_teacher_data, self_distill
from orchestrator.mtp.train import evaluate

from bench_mtp import summary
from common import machine_line, write_report
from prompts import CODE, PROMPTS


def rounded(report: dict) -> dict:
    return {k: [round(x, 3) for x in v] if isinstance(v, list) and k != "tried" else
            (round(v, 3) if isinstance(v, float) else v) for k, v in report.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafter", nargs="+", required=True, help="MTP drafter directories (train-drafter --out)")
    ap.add_argument("--tokens", type=int, default=128, help="greedy response tokens per prompt")
    ap.add_argument("--positions", type=int, default=6, help="draft positions scored")
    ap.add_argument("--held-out", action="store_true",
                    help="also score every drafter on the held-out split of the cached teacher data of the "
                         "default training options (as training reports it, so old drafters are scored alike)")
    args = ap.parse_args()
    env = machine_line()
    targets = {MtpModel.read_config(d).target_name for d in args.drafter}
    if len(targets) != 1:
        ap.error(f"the drafters were trained for different targets: {sorted(targets)}")
    ckpt = resolve(targets.pop())
    tokenizer = load_tokenizer(ckpt)
    workloads = {}
    for name, prompts in (("chat", PROMPTS), ("code", CODE)):
        items = self_distill(ckpt, tokenizer, prompts, args.tokens, 10**9, progress=False)
        data = assemble_responses(items)
        workloads[name] = (data, list(range(data.num_sequences)))
        print(f"{name}: {len(prompts)} prompts, {sum(len(i[0]) - i[3] for i in items)} response tokens",
              flush=True)
    if args.held_out:
        options = DataOptions()
        if not (cache_root() / "mtp-teacher" / options.key(ckpt) / TEACHER_NAME).is_file():
            ap.error("--held-out: no cached teacher data for the default options; run train-drafter once first")
        data = build_teacher_data(ckpt, tokenizer, options, progress=False)
        workloads["held-out"] = (data, data.split()[1])
    report = {"environment": env, "target": ckpt.key, "tokens": args.tokens, "drafters": {}}
    for d in args.drafter:
        model = MtpModel.load(d)
        training = summary(d) or {}
        entry = {"held_out": rounded(training["held_out"]) if "held_out" in training else None,
                 "epochs": training.get("options", {}).get("epochs"), "workloads": {}}
        with torch.inference_mode():
            for name, (data, seqs) in workloads.items():
                r = rounded(evaluate(model, data, seqs, args.positions, max_starts=400 if name == "held-out" else 10**6))
                entry["workloads"][name] = r
                print(f"{d} {name:8s} top-1 {r['top1']:.3f} | alpha/pos {r['alpha']} | "
                      f"all right {r['all_right']} | mean committed (6 drafted) {r['mean_accepted_len']:.3f}",
                      flush=True)
        if entry["held_out"]:
            h = entry["held_out"]
            print(f"{d} held-out top-1 {h['top1']:.3f} | mean committed {h['mean_accepted_len']:.3f} "
                  f"(as its training reported it)", flush=True)
        report["drafters"][d] = entry
    write_report("mtp-agreement-cpu", report)


if __name__ == "__main__":
    main()
