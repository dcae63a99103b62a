"""`hetspec profile check`, `hetspec devices` and `generate --profile`, run as a user runs them."""

import json
import subprocess
import sys
from importlib import resources

import pytest
import torch
import yaml

from orchestrator.profiles import shipped_profiles

from servers import free_port

CPU_PROFILES = ("cpu", "cpu-ngram")
PROMPT = "Repeat exactly: one two three four five six seven eight."


def hetspec(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def generate(*args) -> dict:
    r = hetspec("generate", PROMPT, "--max-new-tokens", "16", "--json", *args)
    assert r.returncode == 0, r.stderr
    return {**json.loads(r.stdout), "stderr": r.stderr}


def check(name: str) -> tuple[int, dict]:
    r = hetspec("profile", "check", name, "--json")
    assert "Traceback" not in r.stderr and r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


@pytest.mark.parametrize("name", CPU_PROFILES)
def test_cpu_profiles_check_and_run(name):
    rc, report = check(name)
    assert rc == 0 and report["ok"] and report["target"]["runs_on"] == {"device": "cpu", "dtype": "float32"}
    assert {row["device"] for row in report["devices"]} == {"cpu"}
    weights = next(m for m in report["memory"] if m["what"] == "target weights")
    assert 100e6 < weights["nbytes"] < 1e9  # SmolLM2-135M: ~135M params x 4 bytes
    out = generate("--profile", name)
    assert out["token_ids"] and out["stats"]["drafter"] == report["drafter"]["order"][0]["kind"]


def test_no_profile_is_the_cpu_profile_and_flags_override():
    default, cpu = generate(), generate("--profile", "cpu")
    assert default["token_ids"] == cpu["token_ids"] and default["stats"]["drafter"] == "onnx"
    ngram = generate("--profile", "cpu", "--drafter", "ngram", "-k", "3")
    assert ngram["stats"]["drafter"] == "ngram" and ngram["stats"]["k"] == 3
    assert ngram["token_ids"] == cpu["token_ids"]  # greedy fp32: lossless whatever drafts


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report on a machine without CUDA")
@pytest.mark.parametrize("name", ["gpu-target-cpu-drafter", "gpu-target-npu-drafter", "gpu-coder", "gpu-target-npu-coder"])
def test_gpu_profiles_report_the_missing_gpu(name, request):
    if "coder" in name:
        request.getfixturevalue("qwen15")  # the memory estimate reads its checkpoint (skips without [qwen])
    rc, report = check(name)
    assert rc == 1 and not report["ok"] and report["target"]["runs_on"] is None
    assert "cuda:0 is not present" in report["problems"][0] and "no fallback declared" in report["problems"][0]
    assert any(row["device"] == "cuda:0" and not row["present"] for row in report["devices"])


def test_npu_drafter_falls_back_to_the_declared_cpu_drafter():
    import onnxruntime

    if "CANNExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this machine has the CANN provider: no fallback to check")
    _, report = check("gpu-target-npu-drafter")
    d = report["drafter"]
    assert (d["wanted"], d["runs"]) == ("npu-int4", "cpu-int4")
    assert "CANNExecutionProvider is not offered" in d["skipped"][0]["reason"]
    assert "using the declared fallback 'cpu-int4'" in report["fallbacks_taken"][0]


@pytest.mark.skipif(hasattr(torch, "npu"), reason="checks the report on a machine without torch-npu")
def test_npu_only_reports_both_missing_npus():
    rc, report = check("npu-only")
    assert rc == 1 and len(report["problems"]) == 2
    assert all("torch-npu is not importable" in p for p in report["problems"])


def test_remote_drafter_that_does_not_answer_leaves_generate_target_only(tmp_path):
    rc, report = check("remote-drafter")
    assert rc == 0 and not report["problems"]
    profile = tmp_path / "remote.yaml"  # a port nothing listens on, a short connect timeout
    profile.write_text(resources.files("orchestrator.profiles.shipped").joinpath("remote-drafter.yaml").read_text()
                       .replace("127.0.0.1:50061", f"127.0.0.1:{free_port()}").replace("timeout_s: 5.0", "timeout_s: 0.5"))
    r = hetspec("generate", "hi", "--profile", str(profile), "--max-new-tokens", "4", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["stats"]["drafter"] == "remote" and out["stats"]["num_drafted"] == 0
    assert out["stats"]["num_fallback_steps"] >= 1 and "continuing target-only" in r.stderr


def test_text_check_of_every_shipped_profile_is_readable():
    for name in shipped_profiles():
        r = hetspec("profile", "check", name)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
        assert f"profile {name}:" in r.stdout and "memory (estimated)" in r.stdout
        assert ("result: runs here" in r.stdout) == (r.returncode == 0)


def test_fallbacks_run_end_to_end_and_are_logged(tmp_path):
    profile = {"version": 1,
               "target": {"device": "cuda:63", "dtype": "float16", "fallback": [{"device": "cpu"}]},
               "drafters": {"npu": {"kind": "onnx", "device": "npu:63", "fallback": ["lookup"]},
                            "lookup": {"kind": "ngram"}},
               "speculation": {"drafter": "npu", "num_speculative_tokens": 3}}
    path = tmp_path / "fallbacks.yaml"
    path.write_text(yaml.safe_dump(profile))
    out = generate("--profile", str(path))
    assert out["stats"]["drafter"] == "ngram" and out["stats"]["k"] == 3
    assert "target on cuda:63 (float16) cannot run here" in out["stderr"]
    assert "drafter 'npu' cannot run here" in out["stderr"]


@pytest.mark.parametrize("args, match", [
    (("profile", "check", "no-such"), "no shipped profile of that name"),
    (("generate", "hi", "--profile", "no-such"), "no shipped profile of that name"),
    (("generate", "hi", "--device", "tpu:0"), "--device: unknown device 'tpu:0'"),
    (("profile", "check"), "the following arguments are required"),
    (("profile", "frobnicate", "cpu"), "invalid choice"),
])
def test_cli_errors_are_one_line(args, match):
    r = hetspec(*args)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode != 0 and len(lines) == 1 and match in lines[0], r.stderr


@pytest.mark.parametrize("text, match", [
    ("", "empty file"),
    ("version: 1\ntarget: {device: tpu:0}\n", "target.device: unknown device 'tpu:0'"),
    ("version: 1\ntarget: {device: cpu}\nspeculation: {num_speculative_tokens: -4}\n",
     "speculation.num_speculative_tokens: must be auto or a whole number in 0..32"),
    ("{{{", "not valid YAML"),
])
def test_bad_profile_files_on_the_cli(tmp_path, text, match):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    for args in (("profile", "check", str(path)), ("generate", "hi", "--profile", str(path))):
        r = hetspec(*args)
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and match in lines[0], r.stderr
        assert lines[0].startswith("hetspec: error: profile ")


def test_devices_lists_every_backend_with_a_reason():
    r = hetspec("devices", "--json")
    assert r.returncode == 0, r.stderr
    found = json.loads(r.stdout)
    assert set(found["backends"]) >= {"cpu", "cuda", "npu"}
    assert found["backends"]["cpu"]["count"] == 1
    assert found["backends"]["cuda"]["count"] == torch.cuda.device_count()
    for entry in found["backends"].values():
        assert entry["count"] == len(entry["devices"]) and (entry["count"] or entry["reason"])
    assert "CPUExecutionProvider" in found["onnxruntime"]["providers"]
    text = hetspec("devices")
    assert text.returncode == 0 and text.stdout.startswith("cpu")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_target_profile_runs_on_cuda():
    rc, report = check("gpu-target-cpu-drafter")
    assert rc == 0, report["problems"]
    out = generate("--profile", "gpu-target-cpu-drafter")
    assert out["token_ids"] and out["stats"]["drafter"] == "onnx"


@pytest.mark.npu
@pytest.mark.skipif(not hasattr(torch, "npu"), reason="needs an Ascend NPU with torch-npu and CANN")
def test_npu_only_profile_runs_on_npus():
    rc, report = check("npu-only")
    assert rc == 0, report["problems"]
    out = generate("--profile", "npu-only")
    assert out["token_ids"] and out["stats"]["drafter"] == "torch"
