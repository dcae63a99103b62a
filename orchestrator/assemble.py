"""Assembly: an `EngineConfig` becomes a checkpoint, tokenizer, target, drafter and engine.

The one place parts are put together, for the CLI, the servers and profiling runs alike:

    engine = build_engine(config)                      # hetspec generate / serve
    parts = assemble(config, tracer=Tracer())          # profiling: several engines, one target
    baseline, spec = parts.engine(num_speculative_tokens=0), parts.engine(num_speculative_tokens=4)

Each part gets what it needs in its constructor. Drafter kinds come from the registry: the
local ones (`orchestrator.drafters`) and the remote one (a gRPC client in the service layer).
"""

from dataclasses import dataclass

import torch

from orchestrator.acceptance_policy import AcceptancePolicy
from orchestrator.config import CombinedDrafterConfig, DrafterConfig, EngineConfig, RemoteDrafterConfig
from orchestrator.drafters import LOCAL_DRAFTERS, Builder, DrafterContext
from orchestrator.drafters.combined import CombinedDrafter
from orchestrator.engine import Drafter, Engine
from orchestrator.errors import HetspecError
from orchestrator.models import Checkpoint, ModelSpec, TargetRunner, eos_token_ids, load_tokenizer, resolve
from orchestrator.profiles import Profile
from orchestrator.server import DrafterServicer
from orchestrator.server.remote_drafter import build_remote_drafter
from orchestrator.tracing import Tracer
from protocol import StagingPool

DRAFTERS: dict[type, Builder] = {**LOCAL_DRAFTERS, RemoteDrafterConfig: build_remote_drafter,
                                 CombinedDrafterConfig: lambda c, ctx: CombinedDrafter([build_drafter(d, ctx)
                                                                                       for d in c.drafters])}


@dataclass
class Assembly:
    """The built parts of one configuration; `engine()` puts them together (several times if asked)."""

    config: EngineConfig
    ckpt: Checkpoint
    tokenizer: object
    target: TargetRunner
    drafter: Drafter | None  # None: the config does not speculate
    eos_token_ids: tuple[int, ...]
    tracer: Tracer
    staging: StagingPool

    def engine(self, num_speculative_tokens: int | None = None, max_num_seqs: int | None = None,
               k_policy: str | None = None, acceptance: AcceptancePolicy | None = None,
               overlap: bool | None = None) -> Engine:
        """An engine over these parts; k = 0 gives a target-only engine over the same target."""
        c = self.config
        k = c.num_speculative_tokens if num_speculative_tokens is None else num_speculative_tokens
        return Engine(self.target, self.tokenizer, self.drafter if k else None, num_speculative_tokens=k,
                      max_num_seqs=max_num_seqs or c.max_num_seqs, eos_token_ids=self.eos_token_ids,
                      k_policy=k_policy or c.k_policy, preemption=c.preemption, tracer=self.tracer,
                      staging=self.staging, disable_by_batch_size=c.disable_by_batch_size,
                      draft_len_schedule=c.draft_len_schedule, acceptance=acceptance or c.acceptance,
                      overlap=c.overlap if overlap is None else overlap, block_transport=c.transport.kind)


def assemble(config: EngineConfig, tracer: Tracer | None = None, progress: bool = True,
             builders: dict[type, Builder] | None = None) -> Assembly:
    """Load the checkpoint and tokenizer, start the target on its device, build the drafter
    (`builders`: drafter kinds beyond the registry's, such as a cluster's drafter pool)."""
    config.validate()
    ckpt = resolve(config.model)
    tokenizer = load_tokenizer(ckpt)
    tracer = tracer or Tracer(enabled=False)
    target = build_target(config, ckpt)
    transport = config.transport
    staging = StagingPool(target.device, max_bytes=transport.staging_pool_bytes, pinned=transport.pinned_staging)
    drafter = None
    if config.speculates:
        ctx = drafter_context(config, ckpt, target=target, tracer=tracer, staging=staging, progress=progress,
                              target_tokenizer=tokenizer)
        builder = (builders or {}).get(type(config.drafter))
        drafter = builder(config.drafter, ctx) if builder else build_drafter(config.drafter, ctx)
    return Assembly(config, ckpt, tokenizer, target, drafter, eos_token_ids(ckpt, tokenizer), tracer, staging)


def build_engine(config: EngineConfig, tracer: Tracer | None = None, progress: bool = True) -> Engine:
    return assemble(config, tracer, progress).engine()


def build_target(config: EngineConfig, ckpt: Checkpoint) -> TargetRunner:
    """The target runner on the config's device and dtype, with its KV pool."""
    return TargetRunner(ckpt, device=config.device, dtype=getattr(torch, config.dtype),
                        block_size=config.kv_block_size, max_kv_tokens=config.max_kv_tokens)


def drafter_context(config: EngineConfig, ckpt: Checkpoint, target: TargetRunner | None = None,
                    tracer: Tracer | None = None, staging: StagingPool | None = None,
                    progress: bool = True, target_tokenizer=None) -> DrafterContext:
    """What a drafter builder may use; without `target`, a drafter for `hetspec drafter serve`."""
    return DrafterContext(target_ckpt=ckpt, target_tokenizer=target_tokenizer, target=target,
                          tracer=tracer or Tracer(enabled=False),
                          staging=staging, transport=config.transport.kind, kv_block_size=config.kv_block_size,
                          max_kv_tokens=config.max_kv_tokens, max_message_bytes=config.transport.max_message_bytes,
                          progress=progress)


def build_drafter(config: DrafterConfig, ctx: DrafterContext) -> Drafter:
    builder = DRAFTERS.get(type(config))
    if builder is None:
        raise HetspecError(f"unknown drafter config {type(config).__name__}")
    return builder(config, ctx)


def build_drafter_servicer(profile: Profile, name: str, progress: bool = True) -> tuple[DrafterServicer, EngineConfig]:
    """One of a profile's local drafters, built and wrapped as `hetspec.v1.Drafter` sessions
    (`hetspec drafter serve`, and a cluster's drafter actors)."""
    if profile.drafters[name].kind == "remote":
        raise HetspecError(f"drafter {name!r} is itself remote; serve a local one (onnx, torch, ngram, mtp)")
    speculation = profile.speculation.model_copy(update={"drafter": name, "drafters": []})
    # the target runs elsewhere (its GPU need not be here): only its checkpoint matters to the drafter
    target = profile.target.model_copy(update={"device": "cpu", "dtype": "float32", "fallback": []})
    profile = profile.model_copy(update={"speculation": speculation, "target": target})
    config = profile.engine_config()
    if not config.speculates:
        raise HetspecError(f"profile {profile.source}: speculation.num_speculative_tokens is 0: nothing to serve")
    ckpt = resolve(config.model)
    drafter = build_drafter(config.drafter, drafter_context(config, ckpt, progress=progress))
    # a self-drafter (exported from the target's checkpoint) can take the target's K/V
    model_id = ckpt.key if getattr(config.drafter, "model", None) is None else None
    vocab_size = ModelSpec.from_config(ckpt.config_dict()).vocab_size
    servicer = DrafterServicer(drafter, vocab_size=vocab_size, model_id=model_id, transport=config.transport.kind)
    return servicer, config
