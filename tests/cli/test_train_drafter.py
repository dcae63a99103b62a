"""`hetspec train-drafter` end to end on the real SmolLM2 target with a tiny budget (mechanics: data,
teacher cache, checkpoint, curves, resume), then generating with what it wrote."""

import json
import subprocess
import sys

from safetensors.torch import load_file


def hetspec(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_train_resume_and_generate_losslessly_with_the_drafter(tmp_path):
    out = tmp_path / "mtp"
    train = ("train-drafter", "--target", "smollm2-135m", "--out", str(out), "--tokens", "3000",
             "--response-tokens", "48", "--batch-size", "4", "--seq-len", "64", "--no-progress")
    r = hetspec(*train, "--epochs", "1")
    assert r.returncode == 0, r.stderr
    first = json.loads(r.stdout)
    assert len(first["alpha"]) == 6 and first["tokens"] >= 3000 and first["mean_accepted_len"] >= 1.0
    for name in ("model.safetensors", "mtp_config.json", "trainer_state.safetensors", "training.png",
                 "summary.json", "history.json"):
        assert (out / name).is_file(), name
    steps = len(json.loads((out / "history.json").read_text()))
    weights = load_file(str(out / "model.safetensors"))
    assert weights["draft_ids"].numel() <= 8192 and "fc.weight" in weights

    again = hetspec(*train, "--epochs", "1")
    assert again.returncode == 2 and "--resume" in again.stderr  # never overwrites a run silently
    resumed = hetspec(*train, "--epochs", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    history = json.loads((out / "history.json").read_text())
    assert [h["step"] for h in history] == list(range(1, 2 * steps + 1))  # continued, not restarted
    assert "eval" in history[-1]

    gen = ("generate", "Write a Python function that adds two numbers.", "--max-new-tokens", "32", "--json")
    plain = hetspec(*gen, "--no-spec")
    spec = hetspec(*gen, "--drafter", "mtp", "--drafter-model", str(out), "-k", "3")
    assert plain.returncode == 0 and spec.returncode == 0, plain.stderr + spec.stderr
    a, b = json.loads(plain.stdout), json.loads(spec.stdout)
    assert b["token_ids"] == a["token_ids"]
    assert b["stats"]["drafter"] == "mtp" and b["stats"]["num_drafted"] > 0
    other = hetspec(*gen, "--model", "gemma3-270m", "--drafter", "mtp", "--drafter-model", str(out))
    assert other.returncode == 1 and "was trained for smollm2-135m" in other.stderr, other.stderr
