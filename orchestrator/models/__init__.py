"""The model side: checkpoints, the torch transformer, the target runner over a paged KV pool,
tokenizers and the ONNX drafter export.

    ckpt = resolve("smollm2-135m")                    # HF dir, GGUF (dequantized once), embedded name
    target = TargetRunner(ckpt, device="cpu", dtype=torch.float32, block_size=16, max_kv_tokens=8192)
    (out,) = target.forward([(seq_id, new_ids, num_scored)])   # out.logits: [num_scored, vocab]
    target.rollback(seq_id, length); target.free(seq_id)
    export_drafter(ckpt, ExportOptions.for_drafter("int4"))     # cached INT4 ONNX drafter directory

Derived artefacts (dequantized checkpoints, exports) live in the user cache (`cache.cache_root`).
"""

from orchestrator.models.cache import cache_root
from orchestrator.models.checkpoints import Checkpoint, resolve
from orchestrator.models.embedded import EMBEDDED_MODELS
from orchestrator.models.export import MARKER, ExportOptions, default_export_dir, export_drafter, find_onnx_model
from orchestrator.models.kv_pool import BlockPool, PoolExhausted
from orchestrator.models.target import TargetOutput, TargetRunner
from orchestrator.models.tokenizer import (
    check_same_vocabulary,
    encode_messages,
    encode_prompt,
    eos_token_ids,
    load_tokenizer,
)
from orchestrator.models.transformer import ModelSpec, Transformer

__all__ = ["BlockPool", "Checkpoint", "EMBEDDED_MODELS", "ExportOptions", "MARKER", "ModelSpec", "PoolExhausted",
           "TargetOutput", "TargetRunner", "Transformer", "cache_root", "check_same_vocabulary", "default_export_dir", "encode_messages",
           "encode_prompt",
           "eos_token_ids", "export_drafter", "find_onnx_model", "load_tokenizer", "resolve"]
