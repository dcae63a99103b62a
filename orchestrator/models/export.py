"""Export a checkpoint into an ONNX drafter (MatMulNBits INT4/INT8 or fp32) with KV-cache I/O.

The work is done by onnxruntime-genai's model builder, run as a subprocess so its logging
stays out of our stdout; we only pick its options, show progress, and cache the result under
the checkpoint's content key. A directory is complete once its marker file exists, and it is
built beside its final place and renamed into it, so a crash never leaves a half export.
"""

import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from orchestrator.errors import CheckpointError, ExportError
from orchestrator.models.cache import cache_root
from orchestrator.models.checkpoints import Checkpoint
from orchestrator.models.export_torch import export_with_torch
from orchestrator.models.transformer import ModelSpec

PRECISIONS = ("int4", "int8", "fp32")
BLOCK_SIZES = (16, 32, 64, 128, 256)
ALGOS = ("default", "rtn", "k_quant")
# MatMulNBits accuracy levels: minimum compute type for activations (1 fp32, 2 fp16, 3 bf16,
# 4 int8). None keeps the builder's default (4 on CPU: fastest, but a one-token step and a
# multi-token chunk then round activations differently, so near-tied argmaxes can flip).
ACCURACY_LEVELS = (None, 0, 1, 2, 3, 4)
EXECUTION_PROVIDERS = ("cpu", "cuda")
MARKER = ".hetspec-export.json"
NUM_TAIL_LINES = 25


@dataclass(frozen=True)
class ExportOptions:
    """What the builder is asked for. `int8_lm_head` keeps the sensitive lm_head at 8 bits."""

    precision: str = "int4"
    block_size: int = 32  # weights per quantization scale (int4/int8 only)
    int8_lm_head: bool = False  # int4 body, 8-bit lm_head (untied from the embedding)
    algo: str = "default"  # builder's weight-only quantization method
    accuracy_level: int | None = None
    execution_provider: str = "cpu"  # builder target; the ORT session may still pick others

    def __post_init__(self):
        _check_choice("precision", self.precision, PRECISIONS)
        _check_choice("block_size", self.block_size, BLOCK_SIZES)
        _check_choice("algo", self.algo, ALGOS)
        _check_choice("accuracy_level", self.accuracy_level, ACCURACY_LEVELS)
        _check_choice("execution_provider", self.execution_provider, EXECUTION_PROVIDERS)
        if self.int8_lm_head and self.precision != "int4":
            raise ExportError(f"int8_lm_head only applies to precision 'int4', not '{self.precision}'")

    @classmethod
    def for_drafter(cls, precision: str = "int4", block_size: int = 32, int8_lm_head: bool = True) -> "ExportOptions":
        """The export a drafter asks for (an 8-bit lm_head only means something for INT4)."""
        return cls(precision=precision, block_size=block_size, int8_lm_head=int8_lm_head and precision == "int4")

    @property
    def quantized(self) -> bool:
        return self.precision != "fp32"

    def tag(self) -> str:
        """Short directory-name form, e.g. 'int4-b32-lmh8-cpu'."""
        parts = [self.precision]
        if self.quantized:
            parts.append(f"b{self.block_size}")
            if self.algo != "default":
                parts.append(self.algo)
            if self.accuracy_level is not None:
                parts.append(f"acc{self.accuracy_level}")
        if self.int8_lm_head:
            parts.append("lmh8")
        parts.append(self.execution_provider)
        return "-".join(parts)

    def builder_extra_options(self) -> list[str]:
        """KEY=VALUE pairs for the builder's --extra_options."""
        extra = ["shared_embeddings=false"]  # tied lm_head stays its own (quantized) MatMul
        if self.quantized:
            extra.append(f"block_size={self.block_size}")
            if self.algo != "default":
                extra.append(f"algo_config={self.algo}")
            if self.accuracy_level is not None:
                extra.append(f"accuracy_level={self.accuracy_level}")
        if self.int8_lm_head:
            extra.append("matmul_mixed_precision=last_matmul:int8")
        return extra


def _check_choice(name: str, value, allowed: tuple) -> None:
    # bool is an int in Python: refuse True/False where a number is expected
    if isinstance(value, bool) or value not in allowed:
        shown = ", ".join(repr(a) for a in allowed)
        raise ExportError(f"export option {name}={value!r} is not supported; allowed: {shown}")


# architectures whose export goes through torch.onnx instead of onnxruntime-genai's builder
# (its builder raises KeyError: 'rope_type' on Gemma 3 with transformers 5)
TORCH_ROUTE_FAMILIES = ("gemma3",)


def export_route(ckpt: Checkpoint) -> str:
    """`builder` (onnxruntime-genai's model builder) or `torch` (export_torch: torch.onnx + MatMulNBitsQuantizer)."""
    return "torch" if ModelSpec.from_config(ckpt.config_dict()).family in TORCH_ROUTE_FAMILIES else "builder"


def default_export_dir(ckpt: Checkpoint, options: ExportOptions) -> Path:
    route = "-torch" if export_route(ckpt) == "torch" else ""
    return cache_root() / "drafters" / f"{ckpt.key[:16]}-{options.tag()}{route}"


def export_drafter(ckpt: Checkpoint, options: ExportOptions, out_dir: Path | None = None,
                   progress: bool = True) -> Path:
    """Build (or reuse) the ONNX drafter for `ckpt` and return its directory."""
    out = Path(out_dir) if out_dir is not None else default_export_dir(ckpt, options)
    if (out / MARKER).is_file():
        return out
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} exists but is not a complete hetspec export; remove it first")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", suffix=".tmp", dir=out.parent))
    try:
        if export_route(ckpt) == "torch":
            _run_torch_export(ckpt, options, tmp, progress)
        else:
            _run_builder(ckpt, options, tmp, progress)
        find_onnx_model(tmp)  # the exporter said it succeeded: check it left a model behind
        marker = {"checkpoint_key": ckpt.key, "options": asdict(options)}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2))
        if out.exists():
            out.rmdir()  # empty (checked above); os.replace cannot replace a directory
        try:
            os.replace(tmp, out)
        except OSError:  # another process finished the same export first: keep theirs
            if not (out / MARKER).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def find_onnx_model(path: Path) -> Path:
    """The decoder .onnx file of an export directory (or `path` itself if it is a file)."""
    path = Path(path)
    if path.is_file():
        return path
    if not path.is_dir():
        raise CheckpointError(f"ONNX drafter not found: {path}")
    config = path / "genai_config.json"
    if config.is_file():
        try:
            name = json.loads(config.read_text())["model"]["decoder"]["filename"]
        except (ValueError, KeyError, TypeError) as e:
            raise CheckpointError(f"{config} has no model.decoder.filename: {e}") from e
        if (path / name).is_file():
            return path / name
        raise CheckpointError(f"{config} names {name}, which is missing from {path}")
    models = sorted(path.glob("*.onnx"))
    if len(models) != 1:
        raise CheckpointError(f"expected one .onnx file in {path}, found {len(models)}")
    return models[0]


def _builder_command(ckpt: Checkpoint, options: ExportOptions, out: Path, cache: Path) -> list[str]:
    return [
        sys.executable, "-m", "onnxruntime_genai.models.builder",
        "-i", str(ckpt.hf_dir), "-o", str(out), "-p", options.precision,
        "-e", options.execution_provider, "-c", str(cache),
        "--extra_options", *options.builder_extra_options(),
    ]


def _run_builder(ckpt: Checkpoint, options: ExportOptions, out: Path, progress: bool) -> None:
    cache = out / ".builder-cache"  # builder scratch; removed before the rename
    cmd = _builder_command(ckpt, options, out, cache)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    num_layers = int(ckpt.config_dict().get("num_hidden_layers", 0))
    stages = _BuilderStages(num_layers, options.quantized)
    tail = collections.deque(maxlen=NUM_TAIL_LINES)
    # text mode reads '\r' as a line end too, so tqdm redraws arrive as separate lines
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, errors="replace")
    try:
        with _progress_bar(stages.total, options, progress) as bar:
            bar.set_postfix_str("starting builder")
            for line in proc.stdout:
                line = line.rstrip()
                if line:
                    tail.append(line)
                if line and (reached := stages.reached(line)):
                    bar.update(max(0, reached[0] - bar.n))
                    bar.set_postfix_str(reached[1], refresh=False)
            rc = proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: do not leave the builder running
            proc.kill()
            proc.wait()
    shutil.rmtree(cache, ignore_errors=True)
    if rc != 0:
        raise _builder_error(ckpt, options, rc, list(tail))


def _run_torch_export(ckpt: Checkpoint, options: ExportOptions, out: Path, progress: bool) -> None:
    if options.algo != "default" or options.execution_provider != "cpu":
        raise ExportError(f"the torch export route takes the default algorithm on the cpu provider, "
                          f"not {options.algo} / {options.execution_provider}")
    with _progress_bar(2, options, progress) as bar:
        bar.set_postfix_str("torch.onnx.export, then MatMulNBitsQuantizer")
        export_with_torch(ckpt, out, options.precision, options.block_size, options.int8_lm_head,
                          options.accuracy_level)
        bar.update(2)


def _progress_bar(total: int, options: ExportOptions, enabled: bool):
    return tqdm(total=total, desc=f"export {options.tag()}", unit="stage", disable=not enabled,
                leave=False, file=sys.stderr)


class _BuilderStages:
    """Maps builder log lines to (stages done, phase): load, read each layer, quantize, save."""

    _READ = re.compile(r"Reading layer (\d+)")
    _QUANT = re.compile(r"complete quantization of /model/layers\.(\d+)/")

    def __init__(self, num_layers: int, quantized: bool):
        self.num_layers = num_layers
        # load, read n layers + lm_head, [quantize n layers + lm_head], save
        self.total = 1 + (num_layers + 1) * (2 if quantized else 1) + 1

    def reached(self, line: str) -> tuple[int, str] | None:
        """Stages complete once `line` was printed, and the phase now running; None if neither."""
        n = self.num_layers
        if "Reading embedding layer" in line:
            return 1, "reading weights"
        if m := self._READ.search(line):
            return 1 + int(m.group(1)) + 1, "reading weights"
        if "Reading LM head" in line:
            return n + 2, "quantizing"
        if m := self._QUANT.search(line):
            return n + 2 + int(m.group(1)) + 1, "quantizing"
        if "Saving GenAI config" in line:
            return self.total, "done"
        if "complete quantization of /lm_head" in line or line.startswith("Saving "):
            return self.total - 1, "saving"
        return None


def _builder_error(ckpt: Checkpoint, options: ExportOptions, rc: int, tail: list[str]) -> ExportError:
    arch = ",".join(ckpt.config_dict().get("architectures", ["?"]))
    text = "\n".join(tail)
    if "KeyError: 'rope_type'" in text or "is not currently supported" in text:
        import transformers

        head = (f"onnxruntime-genai's model builder cannot export architecture {arch} "
                f"(with transformers {transformers.__version__})")
    else:
        head = f"onnxruntime-genai's model builder failed (exit {rc}) exporting {arch} as {options.tag()}"
    cause = tail[-1] if tail else "no output"
    log = cache_root() / "logs" / f"export-{ckpt.key[:16]}-{options.tag()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(text + "\n")
    return ExportError(f"{head}: {cause} (builder output: {log})")
