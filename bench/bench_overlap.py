"""Overlapped vs sequential speculative decoding, side by side in one run.

The stand-in for two devices: the target's torch runs with one thread pinned to core 0, the ONNX
self-drafter (INT4 as the cpu profile's, or `--drafter int8`) with one thread on core 1 (every
drafter call, sequential or ahead, runs on a thread pinned there: the "drafter device"; the target
waits for it in the sequential loop). Then:

  pinned          in process: sequential vs overlapped (`Engine(overlap=True)`), target-only beside
  pinned-remote   the drafter behind `hetspec drafter serve` pinned to core 1 (taskset): sequential vs
                  overlapped; the remote overhead per step left on the critical path is reported
  pinned-remote-qos  the same, the drafter server holding a CPU latency QoS request (`drafter serve
                  --cpu-latency-us`, this bench's `--cpu-latency-us`, default 0: idle CPUs poll instead
                  of halting; system-wide, so the target's side too); needs write access to
                  /dev/cpu_dma_latency. Name remote parts in ABBA order to compare (`--parts
                  pinned-remote,pinned-remote-qos,pinned-remote-qos,pinned-remote`): the medians of
                  each side's tok/s and critical wire per step, request against none, are printed
  shared          no pinning, default threads on both cores: sequential vs overlapped
  device          with `--device cuda:0`: the target on that device (`--dtype`), the drafter on the CPU
                  (`--drafter-threads`): two real devices; target-only, sequential, overlapped
  device-remote   the same target, the drafter behind `hetspec drafter serve` (its own process: no GIL
                  shared with the target's launches): sequential vs overlapped

Greedy, fixed k (or `--k auto`), every side checked token for token against target-only. Prompts
alternate which side goes first. Also draws one overlapped request's spans (bench/figures/overlap-spans.png).

    python bench/bench_overlap.py [--prompts 10] [--tokens 128] [--k 3] [--parts pinned,pinned-remote,shared]
    python bench/bench_overlap.py --parts device --device cuda:0 --dtype float16 [--drafter-threads 4]

Results: bench/figures/overlap-cpu.json (overlap-cuda.json with a device part; `-int8` added to the
names with `--drafter int8`, `-kauto` with `--k auto`), or `--name NAME`: NAME.json and NAME-spans.png.
Run it on an otherwise idle machine.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from orchestrator.drafters.onnx_drafter import OnnxDrafter
from orchestrator.engine import Drafter, Engine
from orchestrator.models import ExportOptions, TargetRunner, eos_token_ids, export_drafter, load_tokenizer, resolve
from orchestrator.server.cpu_latency import current_cpu_latency_us
from orchestrator.server.remote_drafter import RemoteDrafter
from orchestrator.tracing import Tracer

from common import FIGURES, add_name_arg, agreement, alternate, hetspec_side, line, machine_line, merge, write_report
from prompts import GROUNDED, PROMPTS  # noqa: E402  (tests/, put on the path by common)
from servers import READY  # noqa: E402

TARGET_CORE, DRAFTER_CORE = 0, 1
PROFILE = """version: 1
name: cpu-{precision}
target: {{model: smollm2-135m, device: cpu, dtype: float32}}
drafters:
  d: {{kind: onnx, device: cpu, precision: {precision}, block_size: {block_size}, int8_lm_head: {lm_head}{threads}}}
speculation: {{drafter: d}}
"""  # the drafter the remote parts serve: the one the in-process parts run


class OnCore(Drafter):
    """Every call of `inner` runs on one worker thread pinned to `core` (the drafter's device), and the
    caller waits for it: the sequential loop's drafter calls as much as the overlapped worker's."""

    def __init__(self, inner: Drafter, core: int):
        self.inner, self.name, self.device, self.batched = inner, inner.name, inner.device, inner.batched
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drafter-core")
        self._pool.submit(os.sched_setaffinity, 0, {core}).result()

    def _call(self, fn, *args):
        return self._pool.submit(fn, *args).result()

    def start(self, seq_id, prompt_ids):
        return self._call(self.inner.start, seq_id, prompt_ids)

    def propose(self, seq_id, k, *args):
        return self._call(self.inner.propose, seq_id, k, *args)

    def propose_batch(self, requests):
        return self._call(self.inner.propose_batch, requests)

    def propose_ahead(self, requests, assumed):
        return self._call(self.inner.propose_ahead, requests, assumed)

    def extend(self, seq_id, token_ids):
        return self._call(self.inner.extend, seq_id, token_ids)

    def rollback(self, seq_id, n):
        return self._call(self.inner.rollback, seq_id, n)

    def finish(self, seq_id):
        return self._call(self.inner.finish, seq_id)


def drafter_options(precision: str) -> ExportOptions:
    """The self-drafter's export: block 32, an 8-bit lm_head for INT4 (the cpu profile's)."""
    return ExportOptions.for_drafter(precision, 32, True)


def drafter_server(core: int | None, precision: str, cpu_latency_us: int | None = None) -> tuple[subprocess.Popen, int]:
    """`hetspec drafter serve` with the ONNX self-drafter at `precision` on a free port; pinned to
    `core` (taskset) with one ONNX Runtime thread, as the in-process drafter, if given; holding a CPU
    latency request (`--cpu-latency-us`: system-wide, so the target's side wakes faster too) if given."""
    opts = drafter_options(precision)
    profile = Path(tempfile.mkdtemp(prefix="hetspec-overlap-")) / f"cpu-{precision}.yaml"
    threads = ", threads: 1" if core is not None else ""
    profile.write_text(PROFILE.format(precision=opts.precision, block_size=opts.block_size,
                                      lm_head=str(opts.int8_lm_head).lower(), threads=threads))
    cmd = [sys.executable, "-m", "orchestrator.cli", "drafter", "serve", "--profile", str(profile), "--port", "0"]
    if cpu_latency_us is not None:
        cmd += ["--cpu-latency-us", str(cpu_latency_us)]
    if core is not None:
        cmd = ["taskset", "-c", str(core)] + cmd
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    for text in proc.stderr:
        m = READY.search(text)
        if m:
            shutil.rmtree(profile.parent)  # read at start-up
            return proc, int(m[1])
    raise RuntimeError(f"the drafter server exited ({proc.wait()}) before it was ready")


def engines(target, tokenizer, ckpt, drafter, k: str, tracer: Tracer | None = None) -> dict:
    """Sequential and overlapped engines at a fixed k, or `auto` (the cost model, up to 8 drafts)."""
    eos = eos_token_ids(ckpt, tokenizer)
    policy = dict(num_speculative_tokens=8, k_policy="auto") if k == "auto" else dict(num_speculative_tokens=int(k))
    return {"sequential": Engine(target, tokenizer, drafter, eos_token_ids=eos, **policy),
            "overlapped": Engine(target, tokenizer, drafter, eos_token_ids=eos, overlap=True, tracer=tracer, **policy)}


def run_part(name: str, sides: dict, prompts_ids: list, tokens: int, reference: list | None,
             after_warmup=None) -> dict:
    """Warm up, then every side on each prompt (order rotating); tokens/s, ratios, overlap counters.
    Outputs are checked against `reference`, or the target-only side's when the part has one."""
    for engine in sides.values():
        hetspec_side(engine, 16)(prompts_ids[0])
        if engine.overlap is not None:
            engine.overlap.stats = type(engine.overlap.stats)()
    if after_warmup is not None:
        after_warmup()
    names = list(sides)
    results = alternate([hetspec_side(sides[n], tokens) for n in names], prompts_ids)
    if "target-only" in sides:
        reference = results[names.index("target-only")][1]
    out = {"reference": reference}
    for n, (tps, outputs, stats) in zip(names, results):
        out[n] = {"tok_per_s": round(tps, 2), **merge(stats),
                  "steps_predrafted": sum(s.steps_predrafted for s in stats)}
        if sides[n].overlap is not None:
            out[n]["overlap"] = sides[n].overlap.stats.to_dict()
            out[n]["gate"] = sides[n].overlap.gate.to_dict()
        if reference is not None:
            out[n]["agreement"] = agreement(outputs, reference)
            out[n]["identical"] = outputs == reference
            print(f"  {name} {n}: {out[n]['agreement']}", flush=True)
    seq, ov = out["sequential"]["tok_per_s"], out["overlapped"]["tok_per_s"]
    out["overlapped_over_sequential"] = round(ov / seq, 3)
    line(f"{name}: overlapped / sequential", "overlapped", ov, "sequential", seq)
    stats = out["overlapped"]["overlap"]
    print(f"  pre-draft hit rate {stats['hit_rate']:.2f} ({stats['hits']}/{stats['hits'] + stats['misses']}), "
          f"hidden {stats['hidden_s']:.2f} s, waited for {stats['exposed_s']:.2f} s", flush=True)
    gate = out["overlapped"]["gate"]
    print(f"  gate: drafted ahead on {gate['steps_ahead']} steps, not on {gate['steps_not_ahead']}; measured "
          f"forward slowdown {gate['forward_slowdown']}", flush=True)
    if "target-only" in out:
        line(f"{name}: overlapped / target-only", "overlapped", ov, "target-only", out["target-only"]["tok_per_s"])
    return out


def remote_part(name: str, target, tokenizer, ckpt, args, prompts_ids: list, reference: list | None,
                core: int | None, cpu_latency_us: int | None = None) -> dict:
    """Sequential vs overlapped with the drafter behind `hetspec drafter serve` (pinned to `core` if
    given). Each side has its own session, so its wire time is its own: per round trip, and per step
    what the engine waited for (the remote overhead on the critical path; a pre-draft's is hidden)."""
    proc, port = drafter_server(core, args.drafter, cpu_latency_us)
    held = current_cpu_latency_us()  # None where this process may not read it
    if cpu_latency_us is not None and held is not None and held > cpu_latency_us:
        raise RuntimeError(f"the drafter server holds no CPU latency request of {cpu_latency_us} us (now {held})")
    print(f"  {name}: CPU latency bound {held if held is not None else 'unknown'} us", flush=True)
    try:
        remotes = {side: RemoteDrafter(f"127.0.0.1:{port}", vocab_size=target.vocab_size, timeout_s=30)
                   for side in ("sequential", "overlapped")}
        sides = {side: engines(target, tokenizer, ckpt, remote, args.k)[side] for side, remote in remotes.items()}

        def reset():
            for remote in remotes.values():
                remote.round_trip_s = remote.compute_s = remote.critical_wire_s = 0.0
                remote.num_batches = 0

        result = run_part(name, sides, prompts_ids, args.tokens, reference, after_warmup=reset)
        for side, remote in remotes.items():
            result[side].update(round_trips=remote.num_batches, wire_ms_per_round_trip=round(
                1e3 * (remote.round_trip_s - remote.compute_s) / max(1, remote.num_batches), 3),
                critical_wire_ms_per_step=round(1e3 * remote.critical_wire_s / result[side]["num_steps"], 3))
        wire_s = sum(remote.round_trip_s - remote.compute_s for remote in remotes.values())  # both sessions
        trips = sum(remote.num_batches for remote in remotes.values())
        result["wire_ms_per_round_trip"] = round(1e3 * wire_s / max(1, trips), 3)
        print("  remote overhead on the critical path per step: " + ", ".join(
            f"{side} {result[side]['critical_wire_ms_per_step']:.2f} ms ({result[side]['round_trips']} round trips, "
            f"{result[side]['wire_ms_per_round_trip']:.2f} ms wire each)" for side in remotes), flush=True)
        for remote in remotes.values():
            remote.close()
        return result
    finally:
        proc.terminate()
        proc.wait()


def compare_qos(parts: dict) -> None:
    """pinned-remote-qos against pinned-remote, per side: medians over the repeats of each."""
    plain = [p for k, p in parts.items() if k.split("#")[0] == "pinned-remote"]  # repeats: KEY#2, KEY#3
    qos = [p for k, p in parts.items() if k.split("#")[0] == "pinned-remote-qos"]
    if not plain or not qos:
        return
    for side in ("sequential", "overlapped"):
        for field, unit in (("tok_per_s", "tok/s"), ("critical_wire_ms_per_step", "ms")):
            a = statistics.median(p[side][field] for p in qos)
            b = statistics.median(p[side][field] for p in plain)
            print(f"remote {side} {field}: cpu latency request {a:.2f} {unit} | none {b:.2f} {unit} | "
                  f"ratio {a / b if b else float('nan'):.2f}x (medians over {len(qos)} and {len(plain)} runs)", flush=True)


def spans_picture(tracer: Tracer, path: Path, seconds: float = 1.5) -> Path:
    """The target's and the drafter's spans of one overlapped request, side by side in time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spans = [s for s in tracer.spans if s.name in ("prefill", "verify", "draft", "wire")]
    t0 = min(s.start_ns for s in spans)
    spans = [s for s in spans if s.start_ns - t0 < seconds * 1e9]
    tracks = sorted({s.track.label for s in spans})
    colours = {"prefill": "tab:blue", "verify": "tab:blue", "draft": "tab:orange", "wire": "tab:grey"}
    fig, ax = plt.subplots(figsize=(11, 1 + 0.8 * len(tracks)))
    for i, label in enumerate(tracks):
        for s in (s for s in spans if s.track.label == label):
            ahead = s.args.get("ahead", False)
            ax.broken_barh([((s.start_ns - t0) / 1e6, s.dur_ms)], (i - 0.35, 0.7), facecolors=colours[s.name],
                           alpha=0.55 if ahead else 1.0, edgecolor="black", linewidth=0.3)
    ax.set_yticks(range(len(tracks)), tracks)
    ax.set_xlabel("ms")
    ax.set_title("overlapped drafting: verify (blue) on the target's core, drafts (orange; pale = drafted ahead) "
                 "on the drafter's", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--k", default="3", help="drafts per step, or auto (the cost model, up to 8)")
    ap.add_argument("--drafter", default="int4", choices=["int4", "int8"],
                    help="the self-drafter's precision (int4: block 32, 8-bit lm_head, as the cpu profile)")
    ap.add_argument("--parts", default="pinned,pinned-remote,shared")
    ap.add_argument("--device", default="cpu", help="the target's device in the device part")
    ap.add_argument("--dtype", default="float16", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--drafter-threads", type=int, default=None, help="ONNX Runtime threads (device part)")
    ap.add_argument("--cpu-latency-us", type=int, default=0,
                    help="the CPU latency QoS request pinned-remote-qos's drafter server holds (default 0)")
    add_name_arg(ap, "overlap-DEVICE[-int8][-kauto]")
    args = ap.parse_args()
    parts = args.parts.split(",")
    env = machine_line()
    ckpt = resolve(None)
    tokenizer = load_tokenizer(ckpt)
    prompts = (PROMPTS[:args.prompts - 1] + [GROUNDED])[:args.prompts]
    prompts_ids = [tokenizer(p).input_ids for p in prompts]
    export = export_drafter(ckpt, drafter_options(args.drafter), progress=False)
    report = {"machine": env, "prompts": len(prompts), "tokens": args.tokens, "k": args.k, "drafter": args.drafter,
              "parts": {}}

    suffix = ("" if args.drafter == "int4" else f"-{args.drafter}") + ("-kauto" if args.k == "auto" else "")
    reference = None
    if {"pinned", "pinned-remote", "pinned-remote-qos"} & set(parts):
        default_threads = torch.get_num_threads()
        torch.set_num_threads(1)
        os.sched_setaffinity(0, {TARGET_CORE})  # this (main) thread: the target's device
        target = TargetRunner(ckpt, block_size=16, max_kv_tokens=8192)
        eos = eos_token_ids(ckpt, tokenizer)
        target_only = Engine(target, tokenizer, None, eos_token_ids=eos)
        if "pinned" in parts:
            tracer = Tracer(enabled=False)
            drafter = OnCore(OnnxDrafter(export, num_threads=1), DRAFTER_CORE)
            sides = {"target-only": target_only, **engines(target, tokenizer, ckpt, drafter, args.k, tracer)}
            result = run_part("pinned", sides, prompts_ids, args.tokens, None)
            reference = result["reference"]
            report["parts"]["pinned"] = result
            tracer.enabled = True  # one request traced, for the picture
            hetspec_side(sides["overlapped"], 48)(prompts_ids[-1])
            tracer.flush()
            picture = f"{args.name}-spans.png" if args.name else f"overlap-spans{suffix}.png"
            print(f"wrote {spans_picture(tracer, FIGURES / picture)}", flush=True)
        remote_parts = [p for p in parts if p in ("pinned-remote", "pinned-remote-qos")]
        if remote_parts and reference is None:  # the outputs every remote side must equal
            reference = alternate([hetspec_side(target_only, args.tokens)], prompts_ids)[0][1]
        for i, part in enumerate(remote_parts):  # in the order given (repeat them for ABBA)
            n = remote_parts[:i + 1].count(part)
            key = part if n == 1 else f"{part}#{n}"
            latency = args.cpu_latency_us if part.endswith("-qos") else None
            report["parts"][key] = remote_part(key, target, tokenizer, ckpt, args, prompts_ids, reference,
                                               DRAFTER_CORE, latency)
            report["parts"][key]["cpu_latency_us"] = latency
        compare_qos(report["parts"])
        torch.set_num_threads(default_threads)
        os.sched_setaffinity(0, set(range(os.cpu_count())))

    if "shared" in parts:
        target = TargetRunner(ckpt, block_size=16, max_kv_tokens=8192)
        drafter = OnnxDrafter(export)
        sides = engines(target, tokenizer, ckpt, drafter, args.k)
        report["parts"]["shared"] = run_part("shared", sides, prompts_ids, args.tokens, reference)
    if "device" in parts or "device-remote" in parts:
        if args.device == "cpu":
            raise SystemExit("the device parts need --device (e.g. cuda:0)")
        target = TargetRunner(ckpt, block_size=16, max_kv_tokens=8192, dtype=getattr(torch, args.dtype),
                              device=args.device)
        report.update(device=args.device, dtype=args.dtype, drafter_threads=args.drafter_threads)
        if "device" in parts:
            drafter = OnnxDrafter(export, num_threads=args.drafter_threads)
            eos = eos_token_ids(ckpt, tokenizer)
            sides = {"target-only": Engine(target, tokenizer, None, eos_token_ids=eos),
                     **engines(target, tokenizer, ckpt, drafter, args.k)}
            report["parts"]["device"] = run_part("device", sides, prompts_ids, args.tokens, None)
            reference = report["parts"]["device"]["reference"]
        if "device-remote" in parts:
            report["parts"]["device-remote"] = remote_part("device-remote", target, tokenizer, ckpt, args,
                                                           prompts_ids, reference, None)
    for part in report["parts"].values():
        part.pop("reference")
    device_kind = args.device.split(":")[0] if {"device", "device-remote"} & set(parts) else "cpu"
    write_report(args.name or f"overlap-{device_kind}{suffix}", report)


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"bench_overlap took {time.perf_counter() - t0:.0f} s")
