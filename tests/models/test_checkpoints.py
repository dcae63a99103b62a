import json

import pytest

from orchestrator.errors import CheckpointError
from orchestrator.models import resolve


def test_embedded_default_resolves_to_a_cached_safetensors_dir(smollm2):
    assert (smollm2.hf_dir / "config.json").is_file()
    assert any(smollm2.hf_dir.glob("*.safetensors"))
    assert resolve(None).hf_dir == smollm2.hf_dir  # same content key, no second dequantization


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "missing.gguf", "not found"),
    (lambda d: _write(d / "model.bin", b"\x80\x02pickle"), "refusing pickle"),
    (lambda d: _write(d / "model.pt", b"\x80\x02pickle"), "refusing pickle"),
    (lambda d: _write(d / "model.txt", b"hello"), "unsupported model file"),
    (lambda d: _write(d / "bad.gguf", b"NOPE" + b"\0" * 64), "bad magic"),
    (lambda d: _write(d / "empty.gguf", b""), "bad magic"),
    (lambda d: _mkdir(d / "empty_dir"), "no config.json"),
    (lambda d: _hf_dir(d, weights={"pytorch_model.bin": b"x"}), "refusing pickle"),
    (lambda d: _hf_dir(d, weights={}), "no \\*.safetensors"),
    (lambda d: _hf_dir(d, config="{not json", weights={"model.safetensors": b"x"}), "not valid JSON"),
])
def test_bad_model_paths_give_clear_errors(tmp_path, make, match):
    with pytest.raises(CheckpointError, match=match):
        resolve(make(tmp_path))


def test_truncated_gguf_is_rejected_before_loading(tmp_path, smollm2):
    data = smollm2.source.read_bytes()
    for cut in (64, len(data) // 2, len(data) - 1000):
        path = _write(tmp_path / f"cut{cut}.gguf", data[:cut])
        with pytest.raises(CheckpointError, match="corrupt or truncated"):
            resolve(path)


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def _mkdir(path):
    path.mkdir()
    return path


def _hf_dir(root, weights: dict, config: str | None = None):
    d = root / "hf"
    d.mkdir()
    (d / "config.json").write_text(config if config is not None else json.dumps({"model_type": "llama"}))
    for name, data in weights.items():
        (d / name).write_bytes(data)
    return d
