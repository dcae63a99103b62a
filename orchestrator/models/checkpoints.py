"""Resolve a model path (HF directory or GGUF file) into a safetensors checkpoint directory.

GGUF files are dequantized once through transformers + gguf and cached under the user cache
directory, keyed by the file's content digest. Pickle checkpoints are refused.
"""

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from orchestrator.errors import CheckpointError
from orchestrator.models.cache import cache_root, dir_digest, file_digest
from orchestrator.models.embedded import EMBEDDED_MODELS
from orchestrator.models.gguf import validate_gguf

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class Checkpoint:
    """A loadable checkpoint: config.json + *.safetensors + tokenizer files in `hf_dir`."""

    hf_dir: Path
    source: Path  # what the user named (GGUF file or the directory itself)
    key: str  # content digest of the source; derived artefacts are cached under it

    def config_dict(self) -> dict:
        return json.loads((self.hf_dir / "config.json").read_text())


def resolve(model: str | os.PathLike | None = None) -> Checkpoint:
    """Turn a short name, HF directory or GGUF path into a `Checkpoint` (dequantizing GGUF)."""
    name = DEFAULT_MODEL if model is None else str(model)
    path = EMBEDDED_MODELS[name].path() if name in EMBEDDED_MODELS else Path(name).expanduser()
    if not path.exists():
        known = ", ".join(EMBEDDED_MODELS)
        raise CheckpointError(f"model path not found: {path} (or use one of: {known})")
    if path.is_dir():
        _check_hf_dir(path)
        return Checkpoint(hf_dir=path, source=path, key=dir_digest(path))
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise CheckpointError(f"refusing pickle checkpoint {path}: use safetensors, GGUF or ONNX")
    if path.suffix.lower() != ".gguf":
        raise CheckpointError(f"unsupported model file {path}: expected a GGUF file or an HF directory")
    return _dequantized_gguf(path)


def _check_hf_dir(path: Path) -> None:
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path} is not a Hugging Face checkpoint: no config.json")
    if not any(path.glob("*.safetensors")):
        if any(p.suffix in PICKLE_SUFFIXES for p in path.iterdir()):
            raise CheckpointError(f"refusing pickle weights in {path}: convert them to safetensors")
        raise CheckpointError(f"{path} has no *.safetensors weights")
    try:
        json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path / 'config.json'} is not valid JSON: {e}") from e


def _dequantized_gguf(path: Path) -> Checkpoint:
    key = file_digest(path)
    out = cache_root() / "checkpoints" / key[:16]
    if not (out / "config.json").is_file():
        validate_gguf(path)  # a corrupt file has its own digest, so it is never cached
        log.info("dequantizing %s into %s (once)", path.name, out)
        _dequantize_into(path, out)
    return Checkpoint(hf_dir=out, source=path, key=key)


def _dequantize_into(path: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer  # heavy: only when a GGUF is first seen

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        kw = dict(gguf_file=path.name)
        tokenizer = AutoTokenizer.from_pretrained(path.parent, **kw)
        model = AutoModelForCausalLM.from_pretrained(path.parent, dtype=torch.float32, **kw)
        # save_pretrained refuses a model that still carries the GGUF quantization marker;
        # the weights are already dequantized, so the marker is simply wrong from here on.
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        model.hf_quantizer = None
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished first: keep theirs
            if not (out / "config.json").is_file():
                raise
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"could not load GGUF {path}: {e}") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
