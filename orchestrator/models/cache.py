"""Where derived artefacts (dequantized checkpoints, ONNX exports) are cached."""

import hashlib
import json
import os
import tempfile
from pathlib import Path


def cache_root() -> Path:
    """`$HETSPEC_CACHE_DIR`, else `$XDG_CACHE_HOME/hetspec`, else `~/.cache/hetspec`."""
    explicit = os.environ.get("HETSPEC_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hetspec"


def file_digest(path: Path, chunk_bytes: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes (the content key of what we derive from it).

    Remembered per (path, size, mtime) in the cache, so a multi-GB checkpoint is read once,
    not at every start.
    """
    path = Path(path).resolve()
    stat = path.stat()
    memo = cache_root() / "digests" / f"{hashlib.sha256(str(path).encode()).hexdigest()[:32]}.json"
    stamp = {"path": str(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    try:
        known = json.loads(memo.read_text())
        if {k: known.get(k) for k in stamp} == stamp:
            return known["sha256"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # not remembered yet, or unreadable: compute it
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    _write_atomically(memo, json.dumps({**stamp, "sha256": h.hexdigest()}))
    return h.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def dir_digest(path: Path) -> str:
    """Content key of a checkpoint directory: names and digests of its files."""
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            h.update(str(p.relative_to(path)).encode())
            h.update(file_digest(p).encode())
    return h.hexdigest()
