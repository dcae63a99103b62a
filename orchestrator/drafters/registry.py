"""The local drafter kinds: each config type maps to the function that builds its drafter.

A builder gets its kind's typed config and a `DrafterContext` (what the rest of the
assembly has already built); it returns a ready `Drafter`. The remote kind is a gRPC client
and is added to this table by the assembly (`orchestrator.assemble`), above the service layer.
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import protocol
from orchestrator.config import MtpDrafterConfig, NgramDrafterConfig, OnnxDrafterConfig, TorchDrafterConfig
from orchestrator.drafters.handoff import KvHandoffDrafter
from orchestrator.drafters.mtp import MtpDrafter
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.drafters.onnx_drafter import OnnxDrafter
from orchestrator.drafters.torch_drafter import TorchDrafter
from orchestrator.engine import Drafter
from orchestrator.errors import HetspecError
from orchestrator.models import (
    Checkpoint,
    ExportOptions,
    TargetRunner,
    check_same_vocabulary,
    export_drafter,
    load_tokenizer,
    resolve,
)
from orchestrator.tracing import Tracer


@dataclass
class DrafterContext:
    """What a drafter may need from the rest of the assembly."""

    target_ckpt: Checkpoint  # the target's checkpoint: a drafter without its own model drafts with it
    target_tokenizer: object = None  # the target's (loaded from target_ckpt when a drafter needs it)
    target: TargetRunner | None = None  # the running target (KV handoff); None in `hetspec drafter serve`
    tracer: Tracer = field(default_factory=lambda: Tracer(enabled=False))
    staging: protocol.StagingPool | None = None  # the engine's staging buffers (KV handoff)
    transport: str = "inline"  # how blocks this process sends travel: inline | shared_memory
    kv_block_size: int = 16  # the target's, for drafters that keep a paged pool
    max_kv_tokens: int = 8192
    max_message_bytes: int = 64 << 20  # gRPC message limit (remote drafters)
    progress: bool = True  # progress bars for long work (exports)


Builder = Callable[[object, DrafterContext], Drafter]


def drafter_checkpoint(model: str | None, ctx: DrafterContext) -> Checkpoint:
    """The drafter's own checkpoint (checked to share the target's vocabulary), or the target's."""
    if model is None:
        return ctx.target_ckpt
    ckpt = resolve(model)
    if ckpt.key != ctx.target_ckpt.key:
        target_tokenizer = ctx.target_tokenizer or load_tokenizer(ctx.target_ckpt)
        check_same_vocabulary(target_tokenizer, load_tokenizer(ckpt), model)
    return ckpt


def build_onnx(config: OnnxDrafterConfig, ctx: DrafterContext) -> Drafter:
    ckpt = drafter_checkpoint(config.model, ctx)
    options = ExportOptions.for_drafter(config.precision, config.block_size, config.int8_lm_head)
    drafter = OnnxDrafter(export_drafter(ckpt, options, progress=ctx.progress), device=config.device,
                          providers=list(config.providers) or None, provider_options=config.provider_options,
                          num_threads=config.threads)
    handoff = config.model is None if config.kv_handoff == "auto" else config.kv_handoff
    if not handoff or ctx.target is None:  # a drafter server takes K/V per session instead
        return drafter
    if config.model is not None:
        raise HetspecError("kv_handoff needs an onnx drafter exported from the target itself (no drafter model)")
    return KvHandoffDrafter(drafter, ctx.target, tracer=ctx.tracer, staging=ctx.staging, transport=ctx.transport)


def build_torch(config: TorchDrafterConfig, ctx: DrafterContext) -> Drafter:
    ckpt = drafter_checkpoint(config.model, ctx)
    return TorchDrafter(ckpt, device=config.device, dtype=getattr(torch, config.dtype),
                        max_kv_tokens=config.max_kv_tokens or ctx.max_kv_tokens, block_size=ctx.kv_block_size)


def build_ngram(config: NgramDrafterConfig, ctx: DrafterContext) -> Drafter:
    return NgramDrafter(max_ngram=config.max_ngram)


def build_mtp(config: MtpDrafterConfig, ctx: DrafterContext) -> Drafter:
    if not config.model:
        raise HetspecError("the mtp drafter needs `model`: the directory `hetspec train-drafter --out` wrote")
    drafter = MtpDrafter(config.model, device=config.device, dtype=getattr(torch, config.dtype),
                         runtime=config.runtime, precision=config.precision)
    trained_for = drafter.config
    if trained_for.target_model_id != ctx.target_ckpt.key:
        raise HetspecError(f"mtp drafter {config.model} was trained for {trained_for.target_name} "
                           f"(checkpoint {trained_for.target_model_id[:12]}); this target is "
                           f"{ctx.target_ckpt.source} (checkpoint {ctx.target_ckpt.key[:12]})")
    return drafter


LOCAL_DRAFTERS: dict[type, Builder] = {
    OnnxDrafterConfig: build_onnx,
    TorchDrafterConfig: build_torch,
    NgramDrafterConfig: build_ngram,
    MtpDrafterConfig: build_mtp,
}


def build_local_drafter(config, ctx: DrafterContext) -> Drafter:
    """A drafter that runs in this process (what `hetspec drafter serve` can serve)."""
    builder = LOCAL_DRAFTERS.get(type(config))
    if builder is None:
        raise HetspecError(f"drafter kind {getattr(config, 'kind', type(config).__name__)!r} does not run "
                           f"in this process (local kinds: onnx, torch, ngram, mtp)")
    return builder(config, ctx)
