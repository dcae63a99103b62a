"""Memory a placement needs per device, estimated from the checkpoint without loading it.

Weights: element counts from the safetensors headers × bytes of the dtype they run in (an
ONNX drafter: its exported files when they exist, else element counts × bits per weight).
KV: the paged pool the runner allocates up front, [layers, 2, blocks, block_size, kv_heads, head_dim].
"""

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config import OnnxDrafterConfig, TorchDrafterConfig
from orchestrator.models import MARKER, Checkpoint, ExportOptions, ModelSpec, default_export_dir, resolve

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# ONNX weight bytes per element: packed bits plus one fp32 scale per block (estimate before export)
ONNX_BITS = {"int4": 4, "int8": 8, "fp32": 32}


@dataclass(frozen=True)
class MemoryItem:
    device: str
    what: str  # "target weights", "target KV", "drafter 'cpu-int4' weights", ...
    nbytes: int
    note: str = ""  # e.g. "estimate: not exported yet"


def safetensors_numel(hf_dir: Path) -> int:
    """Total elements of every tensor in the directory's *.safetensors (headers only)."""
    total = 0
    for path in sorted(Path(hf_dir).glob("*.safetensors")):
        with open(path, "rb") as f:
            (header_len,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(header_len))
        for name, entry in header.items():
            if name != "__metadata__":
                n = 1
                for d in entry["shape"]:
                    n *= d
                total += n
    return total


def kv_pool_bytes(ckpt: Checkpoint, max_tokens: int, block_size: int, dtype: str) -> int:
    """Bytes of the KV pool a runner allocates for `max_tokens` (rounded up to whole blocks)."""
    spec = ModelSpec.from_config(ckpt.config_dict())
    num_blocks = -(-max_tokens // block_size)
    return spec.num_layers * 2 * num_blocks * block_size * spec.num_kv_heads * spec.head_dim * DTYPE_BYTES[dtype]


def target_items(ckpt: Checkpoint, device: str, dtype: str, max_tokens: int, block_size: int) -> list[MemoryItem]:
    return [MemoryItem(device, "target weights", safetensors_numel(ckpt.hf_dir) * DTYPE_BYTES[dtype]),
            MemoryItem(device, "target KV pool", kv_pool_bytes(ckpt, max_tokens, block_size, dtype),
                       f"{max_tokens} tokens")]


def drafter_items(name: str, config, target_ckpt: Checkpoint, target_kv_tokens: int,
                  block_size: int) -> list[MemoryItem]:
    """What drafter `name` (its kind's config) holds, on the device it runs on."""
    label = f"drafter {name!r}"
    if isinstance(config, TorchDrafterConfig):
        ckpt = target_ckpt if config.model is None else resolve(config.model)
        tokens = config.max_kv_tokens or target_kv_tokens
        return [MemoryItem(config.device, f"{label} weights",
                           safetensors_numel(ckpt.hf_dir) * DTYPE_BYTES[config.dtype]),
                MemoryItem(config.device, f"{label} KV pool",
                           kv_pool_bytes(ckpt, tokens, block_size, config.dtype), f"{tokens} tokens")]
    if isinstance(config, OnnxDrafterConfig):
        ckpt = target_ckpt if config.model is None else resolve(config.model)
        return [_onnx_item(label, config, ckpt)]
    return []  # n-gram: a token list per sequence; remote: memory on the serving host


def _onnx_item(label: str, config: OnnxDrafterConfig, ckpt: Checkpoint) -> MemoryItem:
    out = default_export_dir(ckpt, ExportOptions.for_drafter(config.precision, config.block_size,
                                                             config.int8_lm_head))
    if (out / MARKER).is_file():
        size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.suffix in (".onnx", ".data"))
        return MemoryItem(config.device, f"{label} weights", size, "exported files")
    bits = ONNX_BITS[config.precision]
    per_element = bits / 8 + (4 / config.block_size if bits < 32 else 0)
    return MemoryItem(config.device, f"{label} weights", int(safetensors_numel(ckpt.hf_dir) * per_element),
                      "estimate: not exported yet")


def per_device(items: list[MemoryItem]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for item in items:
        totals[item.device] = totals.get(item.device, 0) + item.nbytes
    return totals
