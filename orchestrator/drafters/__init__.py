"""Drafters: propose k tokens cheaply. One module per kind, chosen through a registry.

    drafter = build_local_drafter(OnnxDrafterConfig(device="npu:0"), DrafterContext(target_ckpt=ckpt))

Kinds: `onnx` (an exported INT4/INT8 decoder on ONNX Runtime: CPU, CUDA or CANN provider),
`torch` (a small model run by the target's own runner), `ngram` (prompt lookup, no model),
and `kv-handoff` wrapping an ONNX self-drafter so it starts from the target's K/V. Every
drafter implements `orchestrator.engine.Drafter`; model drafters share the committed/cached
bookkeeping of `cached.CachedDrafter`. The remote kind lives in the service layer.
"""

from orchestrator.drafters.cached import CachedDrafter
from orchestrator.drafters.handoff import KvHandoffDrafter
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.drafters.onnx_drafter import OnnxDrafter
from orchestrator.drafters.registry import LOCAL_DRAFTERS, Builder, DrafterContext, build_local_drafter
from orchestrator.drafters.torch_drafter import TorchDrafter

__all__ = ["Builder", "CachedDrafter", "DrafterContext", "KvHandoffDrafter", "LOCAL_DRAFTERS", "NgramDrafter",
           "OnnxDrafter", "TorchDrafter", "build_local_drafter"]
