"""A profiling run: one target, a target-only baseline and one speculative side per k,
interleaved prompt by prompt (this kind of machine drifts over minutes), spans on."""

import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from datetime import datetime, timezone

from tqdm import tqdm

from orchestrator.assemble import assemble
from orchestrator.config import EngineConfig, SamplingParams
from orchestrator.engine import Engine
from orchestrator.engine.overlap import OverlapStats
from orchestrator.errors import HetspecError
from orchestrator.latency.environment import environment
from orchestrator.latency.workloads import WorkloadPrompt
from orchestrator.models import encode_prompt
from orchestrator.tracing import Tracer

SCHEMA = "hetspec.profile.run/1"
BASELINE = "target-only"
OVERLAP_COUNTS = tuple(f.name for f in fields(OverlapStats))  # kept per request


@dataclass
class Side:
    """One configuration measured in the run: the baseline (k = 0), a fixed draft length, or auto."""

    name: str
    k: int  # the fixed k, or the most the auto policy may draft
    engine: Engine
    policy: str = "fixed"


def build_sides(config: EngineConfig, ks: list[int], progress: bool = True,
                auto: bool = False) -> tuple[list[Side], object]:
    """Target-only baseline, one engine per fixed k and (with `auto`) the cost model's, all sharing
    one target, one drafter and one tracer."""
    if not config.speculates:
        raise HetspecError("the profile has no drafter: a profiling run compares speculation with the baseline")
    k_auto = config.num_speculative_tokens if config.k_policy == "auto" else max(ks)
    parts = assemble(replace(config, num_speculative_tokens=max(ks + [k_auto])), tracer=Tracer(), progress=progress)
    sides = [Side(BASELINE, 0, parts.engine(num_speculative_tokens=0, max_num_seqs=1))]
    sides += [Side(f"k={k}", k, parts.engine(num_speculative_tokens=k, max_num_seqs=1, k_policy="fixed"))
              for k in ks]
    if auto:
        sides.append(Side("auto", k_auto, parts.engine(num_speculative_tokens=k_auto, max_num_seqs=1,
                                                      k_policy="auto"), "auto"))
    return sides, parts.tokenizer


def encode(tokenizer, item: WorkloadPrompt) -> list[int]:
    return encode_prompt(tokenizer, item.prompt, chat=item.chat)


def run_request(side: Side, prompt_ids: list[int], params: SamplingParams, index: int) -> dict:
    """One request through one side -> its timings, statistics and raw spans."""
    tracer = side.engine.tracer
    tracer.clear()
    ahead = side.engine.overlap  # overlapped drafting: its counters over this request
    before = ahead.stats.to_dict() if ahead is not None else {}
    t0 = time.perf_counter_ns()
    seq = side.engine.generate(prompt_ids, params)
    wall_ms = (time.perf_counter_ns() - t0) / 1e6
    after = ahead.stats.to_dict() if ahead is not None else {}
    n = len(seq.output_ids)
    first, finish = seq.first_token_s or seq.arrival_s, seq.finish_s or seq.arrival_s
    return {
        "prompt_index": index,
        "prompt_tokens": len(prompt_ids),
        "output_tokens": n,
        "finish_reason": seq.finish_reason,
        "start_ns": t0,
        "wall_ms": wall_ms,
        "ttft_ms": (first - seq.arrival_s) * 1e3,
        "tpot_ms": (finish - first) * 1e3 / (n - 1) if n > 1 else None,
        "stats": seq.stats.to_dict(),
        "output_ids": list(seq.output_ids),
        "spans": [s.to_dict() for s in tracer.clear()],
        "overlap": {key: after[key] - before[key] for key in OVERLAP_COUNTS} if ahead is not None else None,
    }


def interleave(sides: list[Side], prompts: list[list[int]], params: list[SamplingParams],
               progress: bool = True) -> dict[str, list[dict]]:
    """Every side on each prompt in turn, the side order rotating per prompt -> requests per side."""
    results: dict[str, list[dict]] = {s.name: [] for s in sides}
    bar = tqdm(total=len(prompts) * len(sides), desc="profile", unit="req", disable=not progress,
               file=sys.stderr)
    for i, (ids, p) in enumerate(zip(prompts, params)):
        for j in range(len(sides)):
            side = sides[(i + j) % len(sides)]
            bar.set_postfix_str(f"prompt {i + 1}/{len(prompts)} {side.name}")
            results[side.name].append(run_request(side, ids, p, i))
            bar.update()
    bar.close()
    return results


def warm_up(sides: list[Side], prompt_ids: list[int], num_requests: int = 1) -> None:
    """Short requests per side first, so one-time costs (allocations, caches) stay out of the run."""
    for side in sides:
        for _ in range(num_requests):
            side.engine.generate(prompt_ids, SamplingParams(max_new_tokens=8, ignore_eos=True))
        side.engine.tracer.clear()


def run_profile(config: EngineConfig, profile_name: str, workload: tuple[str, list[WorkloadPrompt]],
                ks: list[int], max_new_tokens: int, ignore_eos: bool = True, progress: bool = True,
                warmup: int = 1, auto: bool = False) -> dict:
    """The whole run -> the raw part of run.json (summaries are added by `summary.summarize`)."""
    name, items = workload
    sides, tokenizer = build_sides(config, ks, progress, auto)
    prompts = [encode(tokenizer, item) for item in items]
    params = [SamplingParams(max_new_tokens=item.max_new_tokens or max_new_tokens, ignore_eos=ignore_eos)
              for item in items]
    warm_up(sides, prompts[0], warmup)
    t0 = time.perf_counter_ns()
    results = interleave(sides, prompts, params, progress)
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(),
        "profile": {"name": profile_name, "engine_config": asdict(config)},
        "workload": {"name": name, "num_prompts": len(items), "max_new_tokens": max_new_tokens,
                     "ignore_eos": ignore_eos, "prompts": [item.prompt for item in items]},
        "run_start_ns": t0,
        "sides": [{"name": s.name, "k": s.k, "policy": s.policy, "requests": results[s.name]} for s in sides],
    }
