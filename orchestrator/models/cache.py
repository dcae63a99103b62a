"""Where derived artefacts (dequantized checkpoints, ONNX exports) are cached."""

import hashlib
import os
from pathlib import Path


def cache_root() -> Path:
    """`$HETSPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/hetspec`, else `~/.cache/hetspec`."""
    explicit = os.environ.get("HETSPEC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hetspec"


def file_digest(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes (the content key of what we derive from it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def dir_digest(path: Path) -> str:
    """Content key of a checkpoint directory: names and digests of its files."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(file_digest(p).encode())
    return h.hexdigest()
