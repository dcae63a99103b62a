"""Protobuf <-> domain objects for `hetspec.v1.Generation`, in one place.

Requests become `SamplingParams` (validated once, by `SamplingParams.validate`, whose errors
name the request's fields); results and status become messages; a client turns the final
message back into the dict `hetspec generate --json` prints.
"""

from dataclasses import asdict

from google.protobuf.json_format import MessageToDict

from orchestrator.config import SamplingParams
from orchestrator.server.engine_loop import LoopStatus
from protocol.pb import generation_pb2 as pb

DEFAULT_MAX_NEW_TOKENS = 128


def sampling_params(request: pb.GenerateRequest, max_new_tokens_limit: int) -> SamplingParams:
    """The request's parameters; unset optional fields take the defaults."""
    def get(name: str, default):
        return getattr(request, name) if request.HasField(name) else default

    params = SamplingParams(
        max_new_tokens=get("max_new_tokens", min(DEFAULT_MAX_NEW_TOKENS, max_new_tokens_limit)),
        temperature=get("temperature", 0.0), top_k=request.top_k, top_p=get("top_p", 1.0), seed=get("seed", None),
        stop=tuple(request.stop), ignore_eos=request.ignore_eos, speculate=get("speculate", True),
        num_speculative_tokens=get("num_speculative_tokens", None), acceptance=get("acceptance", None),
        acceptance_options=tuple(sorted(request.acceptance_options.items())))
    params.validate(max_new_tokens_limit)
    return params


def final_to_pb(result: dict) -> pb.Final:
    s = dict(result["stats"])
    s["steps_per_k"] = {int(k): n for k, n in s.get("steps_per_k", {}).items()}  # JSON keys are strings
    fields = {f.name for f in pb.SpeculationStats.DESCRIPTOR.fields}
    return pb.Final(finish_reason=result["finish_reason"] or "",
                    usage=pb.Usage(**result["usage"]),
                    stats=pb.SpeculationStats(**{k: v for k, v in s.items() if k in fields}))


def result_from_final(token_ids: list[int], text: str, final: pb.Final) -> dict:
    """The client's side of `final_to_pb`: the same JSON shape as `hetspec generate --json`."""
    stats = MessageToDict(final.stats, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    for name in ("num_steps", "num_drafted", "num_accepted", "k", "num_fallback_steps", "num_preemptions",
                 "tokens_differing", "budget_exhausted_at", "steps_predrafted"):
        stats[name] = int(stats.get(name, 0))
    stats["drafted_per_position"] = [int(x) for x in stats.get("drafted_per_position", [])]
    stats["steps_per_k"] = {k: int(n) for k, n in sorted(stats.get("steps_per_k", {}).items(), key=lambda kv: int(kv[0]))}
    return {
        "text": text,
        "token_ids": token_ids,
        "finish_reason": final.finish_reason or None,
        "usage": {"prompt_tokens": final.usage.prompt_tokens, "completion_tokens": final.usage.completion_tokens},
        "stats": stats,
    }


def status_to_pb(status: LoopStatus) -> pb.ServerStatus:
    return pb.ServerStatus(**asdict(status))
