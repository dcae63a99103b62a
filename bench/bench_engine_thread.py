"""Where the server's engine steps: on the main thread (what `hetspec serve` does) or on a thread of
its own (what it did before), one run, both sides alternating A B B A.

The engine loop of `hetspec serve` (`orchestrator.server.engine_loop.EngineLoop`) in process, 16 client
threads each submitting requests of `--tokens` greedy tokens (`ignore_eos`) back to back, the chat
prompts of the control bench; target-only and `k: auto` engines of the profile. On a thread of its own a
CPU target runs slower: torch's OpenMP runtime gives each thread that runs parallel work a team of its
own, and with more team threads than cores it stops spinning between the forward's kernels.

    python bench/bench_engine_thread.py [--profile cpu] [--tokens 48] [--requests 32] [--repeats 2]

Writes bench/figures/engine-thread-PROFILE.json (figures, machine, commit).
"""

import argparse
import statistics
import threading
import time

from orchestrator.assemble import assemble
from orchestrator.config import SamplingParams
from orchestrator.latency import load_workload
from orchestrator.models import encode_prompt
from orchestrator.profiles import load_profile
from orchestrator.server.engine_loop import Done, EngineLoop

from common import machine_line, write_report

CLIENTS = 16


def serve(engine, prompts: list[list[int]], tokens: int, on_main: bool) -> float:
    """`prompts` through an engine loop from CLIENTS threads -> committed tokens per second."""
    loop = EngineLoop(engine, "bench", max_active=CLIENTS, own_thread=not on_main)
    params = SamplingParams(max_new_tokens=tokens, ignore_eos=True)
    todo, lock, committed, errors = list(prompts), threading.Lock(), [], []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                ids = todo.pop()
            _, events = loop.submit(ids, params)
            while not isinstance(event := events.get(), Done):
                pass
            if event.error is not None:
                errors.append(event.error)
                return
            committed.append(len(event.result["token_ids"]))

    def clients():
        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        loop.stop()

    t0 = time.perf_counter()
    if on_main:
        driver = threading.Thread(target=clients)
        driver.start()
        loop.run()
        driver.join()
    else:
        clients()
    elapsed = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"a request failed: {errors[0]!r}")
    return sum(committed) / elapsed


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="cpu")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2, help="ABBA rounds")
    args = ap.parse_args()
    env = machine_line()
    config = load_profile(args.profile).engine_config()
    parts = assemble(config, progress=True)
    _, items = load_workload("chat")
    encoded = [encode_prompt(parts.tokenizer, item.prompt, chat=item.chat) for item in items]
    prompts = [encoded[i % len(encoded)] for i in range(args.requests)]
    engines = {"target-only": parts.engine(num_speculative_tokens=0, max_num_seqs=CLIENTS, k_policy="fixed"),
               "auto": parts.engine(num_speculative_tokens=config.num_speculative_tokens, max_num_seqs=CLIENTS,
                                    k_policy="auto")}
    report = {"environment": env, "profile": args.profile, "tokens": args.tokens, "requests": args.requests,
              "clients": CLIENTS, "engines": {}}
    for name, engine in engines.items():
        serve(engine, prompts[:CLIENTS], 8, on_main=True)  # warm-up (and the auto engine's first measurements)
        runs = {"main thread": [], "own thread": []}
        for _ in range(args.repeats):
            for side in ("main thread", "own thread", "own thread", "main thread"):
                runs[side].append(serve(engine, prompts, args.tokens, on_main=side == "main thread"))
                print(f"  {name}, engine on its {side}: {runs[side][-1]:.1f} tok/s", flush=True)
        main_s, own = statistics.median(runs["main thread"]), statistics.median(runs["own thread"])
        report["engines"][name] = {"tokens_per_s": runs, "median": {"main thread": main_s, "own thread": own},
                                   "main_over_own": main_s / own}
        print(f"{name}: engine on the main thread {main_s:.1f} tok/s vs on its own thread {own:.1f} tok/s "
              f"= {main_s / own:.2f}x", flush=True)
    write_report(f"engine-thread-{args.profile}", report)


if __name__ == "__main__":
    main()
