"""GGUF files: checked before anything reads them as a model."""

from pathlib import Path

from gguf import GGUFReader

from orchestrator.errors import CheckpointError


def validate_gguf(path: Path, what: str | None = None) -> None:
    """Parse the GGUF header and tensor index so a truncated file fails here, clearly."""
    what = what or str(path)
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{what} is not a GGUF file (bad magic)")
    try:
        reader = GGUFReader(path)
        size = path.stat().st_size
        for t in reader.tensors:
            if t.data_offset + t.n_bytes > size:
                raise ValueError(f"tensor {t.name} runs past the end of the file")
    except Exception as e:  # the reader raises many kinds on corrupt input
        raise CheckpointError(f"{what} is a corrupt or truncated GGUF file: {e}") from e
