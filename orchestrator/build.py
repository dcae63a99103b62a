"""Assemble an engine (checkpoint, tokenizer, target, drafter) from an `EngineConfig`."""

import logging

import torch

from orchestrator.checkpoints import Checkpoint, resolve
from orchestrator.config import DrafterConfig, EngineConfig
from orchestrator.drafters.base import Drafter
from orchestrator.engine import Engine
from orchestrator.errors import CheckpointError, HetspecError
from orchestrator.target import TargetRunner

log = logging.getLogger(__name__)


def load_tokenizer(ckpt: Checkpoint):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ckpt.hf_dir)
    except Exception as e:  # transformers raises many kinds for a broken directory
        raise CheckpointError(f"could not load the tokenizer from {ckpt.hf_dir}: {e}") from e


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    """Token ids of a prompt, wrapped in the model's chat template when `chat` and it has one."""
    if chat and getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return tokenizer(prompt).input_ids


def eos_token_ids(ckpt: Checkpoint, tokenizer) -> tuple[int, ...]:
    """EOS ids from generation_config.json, config.json and the tokenizer, merged."""
    import json

    ids: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = ckpt.hf_dir / name
        if path.is_file():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [value] if value is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))


def build_drafter(config: EngineConfig, ckpt: Checkpoint, progress: bool = True) -> Drafter | None:
    d = config.drafter
    if d.kind == "none" or config.num_speculative_tokens == 0:
        return None
    if d.kind == "ngram":
        from orchestrator.drafters.ngram import NgramDrafter

        return NgramDrafter(max_ngram=d.max_ngram)
    if d.kind == "remote":
        from orchestrator.drafters.remote import RemoteDrafter

        return RemoteDrafter(d.address, d.remote_channel, timeout_s=d.remote_timeout_s)
    draft_ckpt = ckpt if d.model is None else resolve(d.model)
    if d.kind == "torch":
        from orchestrator.drafters.torch_drafter import TorchDrafter

        return TorchDrafter(draft_ckpt, device=d.device, dtype=getattr(torch, d.dtype),
                            max_kv_tokens=d.max_kv_tokens or config.max_kv_tokens,
                            block_size=config.kv_block_size)
    from orchestrator.drafters.onnx_drafter import OnnxDrafter
    from orchestrator.export import export_drafter

    return OnnxDrafter(export_drafter(draft_ckpt, export_options(d), progress=progress),
                       providers=list(d.providers), provider_options=list(d.provider_options) or None)


def export_options(d: DrafterConfig):
    """The export a drafter config asks for (an 8-bit lm_head only means something for INT4)."""
    from orchestrator.export import ExportOptions

    return ExportOptions(precision=d.precision, block_size=d.block_size,
                         int8_lm_head=d.int8_lm_head and d.precision == "int4")


def build_target(config: EngineConfig, ckpt: Checkpoint) -> TargetRunner:
    """The target runner on the config's device and dtype, with its KV pool."""
    return TargetRunner(ckpt, device=config.device, dtype=getattr(torch, config.dtype),
                        block_size=config.kv_block_size, max_kv_tokens=config.max_kv_tokens)


def build_engine(config: EngineConfig, progress: bool = True) -> tuple[Engine, Checkpoint]:
    config.validate()
    ckpt = resolve(config.model)
    tokenizer = load_tokenizer(ckpt)
    target = build_target(config, ckpt)
    drafter = build_drafter(config, ckpt, progress=progress)
    if drafter is not None and hasattr(drafter, "vocab_size") and config.drafter.kind == "remote":
        drafter.vocab_size = target.vocab_size  # remote draft ids are checked against the target's vocabulary
    if drafter is not None and config.drafter.kv_handoff:
        drafter = with_kv_handoff(drafter, config.drafter, target)
    engine = Engine(target, tokenizer, drafter, num_speculative_tokens=config.num_speculative_tokens,
                    max_num_seqs=config.max_num_seqs, eos_token_ids=eos_token_ids(ckpt, tokenizer),
                    adaptive_k=config.adaptive_k, preemption=config.preemption)
    return engine, ckpt


def with_kv_handoff(drafter: Drafter, d: DrafterConfig, target: TargetRunner) -> Drafter:
    """Wrap a self-drafter so it starts from the target's prefill K/V (same model, same geometry)."""
    from orchestrator.drafters.handoff import KvHandoffDrafter
    from orchestrator.drafters.onnx_drafter import OnnxDrafter
    from orchestrator.drafters.remote import RemoteDrafter

    if isinstance(drafter, RemoteDrafter):  # the K/V go with each OpenSequence; the drafter server checks the model
        drafter.kv_source = target
        return drafter
    if not isinstance(drafter, OnnxDrafter) or d.model is not None:
        raise HetspecError("kv_handoff needs an onnx drafter exported from the target itself (no drafter model)")
    return KvHandoffDrafter(drafter, target)
