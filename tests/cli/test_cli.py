"""The command line, as a user runs it: real subprocesses, real model."""

import json
import subprocess
import sys

import pytest


def hetspec(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_generate_json_with_ngram_drafter_overlapped():
    r = hetspec("generate", "Repeat exactly: one two three four five six seven eight.", "--drafter", "ngram",
                "--max-new-tokens", "24", "--json", "--overlap")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["text"] and 0 < len(out["token_ids"]) <= 24
    stats = out["stats"]
    assert {"mean_accepted_length", "acceptance_per_position", "tokens_per_s"} <= stats.keys()
    assert stats["tokens_per_s"] > 0 and stats["drafter"] == "ngram"
    assert 0 <= stats["steps_predrafted"] <= stats["num_steps"]  # drafted ahead while the target verified


def test_streamed_text_equals_json_text_and_no_spec_matches():
    args = ("generate", "Name three colours.", "--max-new-tokens", "16", "--drafter", "ngram")
    streamed = hetspec(*args)
    plain = hetspec(*args, "--no-spec", "--json")
    assert streamed.returncode == 0 and plain.returncode == 0, streamed.stderr + plain.stderr
    assert streamed.stdout.rstrip("\n") == json.loads(plain.stdout)["text"]
    assert "tok/s" in streamed.stderr


@pytest.mark.parametrize("args, match", [
    (("generate", ""), "prompt is empty"),
    (("generate", "   "), "prompt is empty"),
    (("generate", "hi", "--model", "/no/such/model.gguf"), "not found"),
    (("generate", "hi", "--drafter", "magic"), "invalid choice"),
    (("generate", "hi", "--dtype", "float7"), "invalid choice"),
    (("generate", "hi", "--max-new-tokens", "0"), "must be positive"),
    (("generate", "hi", "--max-new-tokens", "many"), "invalid"),
    (("generate", "hi", "--drafter-threads", "0"), "--drafter-threads: must be positive, got 0"),
    (("generate", "hi", "--drafter", "ngram", "--drafter-threads", "2"),
     "--drafter-threads: only for the onnx drafter, not the ngram drafter"),
    (("generate", "hi", "--temperature", "-1"), "temperature"),
    (("generate", "hi", "--top-p", "2"), "top_p"),
    (("generate", "hi", "--no-such-flag"), "unrecognized"),
    (("generate", "word " * 9000, "--drafter", "ngram"), "context limit"),
    (("export-drafter", "--precision", "int3"), "invalid choice"),
    (("generate", "hi", "--acceptance", "fuzzy"), "invalid choice: 'fuzzy' (choose from"),
    (("generate", "hi", "--acceptance", "nkl", "--acceptance-option", "gamma=1"),
     "--acceptance-option gamma: policy 'nkl' has no option 'gamma'; its options: delta, temperature, budget"),
    (("generate", "hi", "--acceptance", "nkl", "--acceptance-option", "delta"), "expected key=number, got 'delta'"),
    (("generate", "hi", "--acceptance", "typical", "--temperature", "0.8"), "typical is lossy and judges greedy"),
    (("generate", "hi", "--drafter", "mtp"), "--drafter mtp needs --drafter-model DIR"),
    (("generate", "hi", "--drafter", "mtp", "--drafter-model", "/no/such/dir"), "not an MTP drafter"),
    (("train-drafter", "--target", "smollm2-135m", "--out", "/tmp/x", "--tokens", "10"), "--tokens must be >= 1000"),
])
def test_bad_input_gives_one_line_and_nonzero_exit(args, match):
    r = hetspec(*args)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and match in lines[0], r.stderr


def test_corrupt_gguf_gives_one_line(tmp_path, smollm2):
    gguf = tmp_path / "cut.gguf"
    gguf.write_bytes(smollm2.source.read_bytes()[:100_000])
    r = hetspec("generate", "hi", "--model", str(gguf))
    assert r.returncode == 1 and "Traceback" not in r.stderr and "truncated" in r.stderr


def test_export_drafter_prints_a_complete_cached_export():
    from pathlib import Path

    r = hetspec("export-drafter", "--precision", "int4")
    assert r.returncode == 0, r.stderr
    out = Path(r.stdout.strip())
    assert (out / ".hetspec-export.json").is_file() and any(out.glob("*.onnx"))


def test_gemma3_exports_through_torch_and_drafts_losslessly(gemma3):
    # onnxruntime-genai's builder cannot take Gemma 3: the torch.onnx route builds its drafter
    from pathlib import Path

    r = hetspec("export-drafter", "--model", "gemma3-270m")
    assert r.returncode == 0, r.stderr
    out = Path(r.stdout.strip())
    assert out.name.endswith("-torch") and (out / ".hetspec-export.json").is_file()
    assert (out / "model.onnx").stat().st_size < 10 << 20  # the weights live in model.onnx.data
    assert "[INFO]" not in r.stderr  # onnxruntime's quantizer did not turn on INFO logging
    args = ("generate", "def fibonacci(n):", "--model", "gemma3-270m", "--max-new-tokens", "40", "--json")
    spec = json.loads((r := hetspec(*args, "-k", "4")).stdout or "{}")
    assert r.returncode == 0, r.stderr
    plain = json.loads((r := hetspec(*args, "--no-spec")).stdout or "{}")
    assert r.returncode == 0, r.stderr
    assert spec["token_ids"] == plain["token_ids"]
    stats = spec["stats"]
    assert stats["num_drafted"] >= 20 and stats["acceptance_rate"] > 0.5, stats


def test_kv_handoff_keeps_greedy_output_and_refuses_non_self_drafters():
    prompt = "Summarize in one sentence: speculative decoding lets a small drafter propose tokens that a large target checks."
    handed = hetspec("generate", prompt, "--kv-handoff", "--max-new-tokens", "24", "--json")
    plain = hetspec("generate", prompt, "--no-spec", "--max-new-tokens", "24", "--json")
    assert handed.returncode == 0 and plain.returncode == 0, handed.stderr + plain.stderr
    out = json.loads(handed.stdout)
    assert out["token_ids"] == json.loads(plain.stdout)["token_ids"]
    assert out["stats"]["num_drafted"] > 0
    bad = hetspec("generate", "hi", "--drafter", "ngram", "--kv-handoff")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "kv_handoff needs an onnx drafter" in bad.stderr


def test_closed_stdout_is_not_an_internal_error():
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "devices"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # like `hetspec devices | head -c 0`
    stderr = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and "internal error" not in stderr and "Traceback" not in stderr


def test_a_drafter_with_another_vocabulary_is_refused_in_one_line(qwen05):
    r = hetspec("generate", "hi", "--drafter-model", "qwen2.5-coder-0.5b", "--max-new-tokens", "4")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("hetspec: error: drafter qwen2.5-coder-0.5b: its tokenizer gives"), r.stderr


@pytest.mark.parametrize("args", [
    ("--acceptance", "fuzzy"),
    ("--acceptance", "block", "--acceptance-option", "m=0"),
    ("--acceptance-option", "budget=0.1"),  # the default policy (rejection) has no options
])
def test_bad_acceptance_flags_exit_2_like_any_bad_flag(args):
    r = hetspec("generate", "hi", *args)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len([ln for ln in r.stderr.splitlines() if ln.strip()]) == 1, r.stderr


def test_the_cli_imports_the_http_stack_only_for_serve_http():
    """`hetspec generate` and `profile check` start without FastAPI/uvicorn (a GPU host whose FastAPI
    lacked a dependency could not even check a profile)."""
    code = "import sys, orchestrator.cli; print(sorted(m for m in ('fastapi', 'uvicorn') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
