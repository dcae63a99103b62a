"""Block-protocol benchmarks, both sides in one run.

(1) Transport throughput on loopback to a receiver in another process: inline gRPC (chunked
    BlockTransfer.Push) vs shared memory (descriptor over the same RPC, bytes through
    /dev/shm), 1 MiB - 256 MiB blocks, interleaved rep by rep. The receiver validates every
    descriptor and checksums every payload (XXH3) before it acknowledges.
(2) KV handoff on a >= 1,000-token prompt: time to first draft and acceptance with the
    target's prefill KV handed to the INT4 self-drafter vs the drafter's own prefill.

    python bench/bench_protocol.py [--sizes 1,4,16,64,256] [--reps 5] [--skip-handoff]

Run it on an otherwise idle machine; results also go to bench/out/protocol.json.
"""

import argparse
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from protocol import codec, shm, transfer  # noqa: E402
from protocol.pb import blocks_pb2 as pb  # noqa: E402
from protocol.pb import blocks_pb2_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RECEIVER = textwrap.dedent("""
    import sys, time
    from protocol import transfer
    server, port = transfer.serve()
    print(port, flush=True)
    sys.stdin.readline()
    server.stop(0)
""")


def transport_throughput(sizes_mib: list[int], reps: int, chunk_bytes: int | None) -> list[dict]:
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, cwd=ROOT)
    port = int(receiver.stdout.readline())
    stub = blocks_pb2_grpc.BlockTransferStub(transfer.channel(f"127.0.0.1:{port}"))
    writer = shm.ShmWriter(num_slots=2)
    rows = []
    try:
        for mib in sizes_mib:
            x = torch.randn(mib << 18)  # float32: mib MiB
            rows.append(_one_size(stub, writer, x, mib, reps, chunk_bytes))
            print(f"{mib:>5} MiB   inline gRPC {rows[-1]['inline_gbps']:6.2f} GB/s   "
                  f"shm {rows[-1]['shm_gbps']:6.2f} GB/s   shm/inline {rows[-1]['shm_gbps'] / rows[-1]['inline_gbps']:.2f}x",
                  flush=True)
    finally:
        writer.close()
        receiver.stdin.close()
        receiver.wait(timeout=30)
    return rows


def _one_size(stub, writer, x: torch.Tensor, mib: int, reps: int, chunk_bytes: int | None) -> dict:
    """Encode (checksum included) + send + receiver validation, per rep, sides alternating."""
    times = {"inline": [], "shm": []}
    for rep in range(reps + 1):  # rep 0 warms up both paths (segment creation, HTTP/2 windows)
        for side in ("inline", "shm"):
            t0 = time.perf_counter()
            enc = codec.encode(x, kind=pb.TENSOR_KIND_HIDDEN_STATE)
            if side == "inline":
                reply = transfer.push(stub, enc, chunk_bytes)
            else:
                reply = transfer.push_descriptor(stub, writer.write(enc))
            elapsed = time.perf_counter() - t0
            assert reply.byte_length == enc.payload.nbytes and reply.checksum == enc.descriptor.checksum
            if rep:
                times[side].append(elapsed)
    gb = x.numel() * 4 / 1e9
    return {"mib": mib, "reps": reps, **{f"{s}_s": sorted(t)[len(t) // 2] for s, t in times.items()},
            **{f"{s}_gbps": gb / sorted(t)[len(t) // 2] for s, t in times.items()}}


def _long_prompt(tokenizer, min_tokens: int) -> list[int]:
    text = (ROOT / "README.md").read_text()
    ids = tokenizer(text).input_ids
    if len(ids) < min_tokens:
        raise SystemExit(f"README.md has only {len(ids)} tokens; need {min_tokens}")
    body = tokenizer.decode(ids[:min_tokens])
    chat = [{"role": "user", "content": "Summarize this document in five bullet points.\n\n" + body}]
    out = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def kv_handoff(min_tokens: int, new_tokens: int, reps: int, k: int) -> dict:
    from orchestrator.assemble import build_drafter, drafter_context
    from orchestrator.config import EngineConfig, SamplingParams
    from orchestrator.drafters import KvHandoffDrafter
    from orchestrator.engine import Engine
    from orchestrator.models import TargetRunner, eos_token_ids, load_tokenizer, resolve

    ckpt = resolve(None)
    tokenizer = load_tokenizer(ckpt)
    target = TargetRunner(ckpt, block_size=16, max_kv_tokens=4096)
    config = EngineConfig()
    plain = build_drafter(config.drafter, drafter_context(config, ckpt, progress=True))
    sides = {"own prefill": plain, "kv handoff": KvHandoffDrafter(plain, target)}
    ids = _long_prompt(tokenizer, min_tokens)
    print(f"\nKV handoff: prompt {len(ids)} tokens, INT4 self-drafter (8-bit lm_head), k={k}", flush=True)
    # time to first draft: target prefill done -> drafter started -> first k drafts out
    ttfd = {name: [] for name in sides}
    for rep in range(reps + 1):
        for name, drafter in sides.items():
            seq_id = 1000 * rep + len(ttfd[name])
            first = int(target.forward([(seq_id, ids, 1)])[0].logits[-1].argmax())
            t0 = time.perf_counter()
            drafter.start(seq_id, ids)
            drafter.extend(seq_id, [first])
            drafter.propose(seq_id, k)
            if rep:
                ttfd[name].append(time.perf_counter() - t0)
            drafter.finish(seq_id)
            target.free(seq_id)
    result = {"prompt_tokens": len(ids), "k": k,
              "ttfd_ms": {n: 1e3 * sorted(t)[len(t) // 2] for n, t in ttfd.items()}}
    for name, value in result["ttfd_ms"].items():
        print(f"  time to first draft, {name:12s}: {value:8.1f} ms (median of {reps})")
    a, b = result["ttfd_ms"]["own prefill"], result["ttfd_ms"]["kv handoff"]
    print(f"  handoff speedup on time to first draft: {a:.1f} / {b:.1f} = {a / b:.2f}x")
    eos = eos_token_ids(ckpt, tokenizer)
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    outputs, result["acceptance"] = {}, {}
    for name, drafter in sides.items():
        seq = Engine(target, tokenizer, drafter, num_speculative_tokens=k, eos_token_ids=eos).generate(ids, params)
        s = seq.stats.to_dict()
        outputs[name] = seq.output_ids
        result["acceptance"][name] = {"per_position": s["acceptance_per_position"],
                                      "mean_accepted_length": s["mean_accepted_length"]}
        per = " ".join(f"{v:.2f}" for v in s["acceptance_per_position"])
        print(f"  acceptance, {name:12s}: per position [{per}], mean accepted length {s['mean_accepted_length']:.2f} "
              f"({new_tokens} greedy tokens)")
    result["outputs_identical"] = outputs["own prefill"] == outputs["kv handoff"]
    print(f"  greedy outputs identical: {result['outputs_identical']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4,16,64,256", help="block sizes in MiB")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--chunk-kib", type=int, default=0, help="inline chunk size (default: ~8 chunks, 256 KiB-2 MiB)")
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--skip-handoff", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"Transport throughput (sender encode + checksum -> receiver validate + checksum), median of "
          f"{args.reps} reps, inline chunks of {args.chunk_kib or 'size/8 in [256, 2048]'} KiB")
    sizes = [int(s) for s in args.sizes.split(",")]
    out = {"chunk_kib": args.chunk_kib, "transport": transport_throughput(sizes, args.reps, (args.chunk_kib << 10) or None)}
    if not args.skip_handoff:
        out["kv_handoff"] = kv_handoff(args.prompt_tokens, args.new_tokens, 3, 4)
    path = ROOT / "bench" / "out" / "protocol.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
