"""Workloads: built-ins load; JSONL lines are validated with one-line errors naming line and field."""

import json

import pytest

from orchestrator.cli.profile import parse_sweep
from orchestrator.errors import HetspecError
from orchestrator.latency.workloads import BUILTIN, WorkloadPrompt, load_workload


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_workloads_are_nonempty(name):
    got_name, prompts = load_workload(name)
    assert got_name == name and len(prompts) >= 3 and all(p.prompt.strip() for p in prompts)


def test_jsonl_workload_reads_fields_and_skips_blank_lines(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "Hi"}) + "\n\n" +
                    json.dumps({"prompt": "def f():", "max_new_tokens": 8, "chat": False}) + "\n")
    assert load_workload(str(path)) == ("mine", [WorkloadPrompt("Hi"), WorkloadPrompt("def f():", 8, False)])


@pytest.mark.parametrize("line, message", [
    ('{"prompt": "ok"', "line 2: not valid JSON"),
    ('["a"]', "line 2: expected a JSON object, got list"),
    ('{"text": "x"}', "line 2: unknown field 'text'"),
    ('{"prompt": "  "}', "line 2: field 'prompt' must be a non-empty string"),
    ('{"prompt": 3}', "line 2: field 'prompt' must be a non-empty string"),
    ('{"prompt": "x", "max_new_tokens": 0}', "line 2: field 'max_new_tokens' must be a positive integer"),
    ('{"prompt": "x", "max_new_tokens": true}', "line 2: field 'max_new_tokens' must be a positive integer"),
    ('{"prompt": "x", "chat": "yes"}', "line 2: field 'chat' must be true or false"),
])
def test_bad_jsonl_lines_name_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(HetspecError, match=message) as err:
        load_workload(str(path))
    assert "\n" not in str(err.value) and "bad.jsonl" in str(err.value)


def test_unknown_workload_and_empty_file(tmp_path):
    with pytest.raises(HetspecError, match="neither a built-in"):
        load_workload("poetry")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(HetspecError, match="no prompts"):
        load_workload(str(tmp_path / "empty.jsonl"))


@pytest.mark.parametrize("text, ks", [("k=2,4,6,8", [2, 4, 6, 8]), ("4,2,4", [2, 4]), ("k=1", [1])])
def test_sweep_parses(text, ks):
    assert parse_sweep(text) == ks


@pytest.mark.parametrize("text", ["k=", "k=two", "k=0,2", "k=40"])
def test_bad_sweep_is_refused(text):
    with pytest.raises(HetspecError, match="--sweep"):
        parse_sweep(text)


def test_profiles_give_the_engine_config_and_profiling_defaults():
    from orchestrator.profiles import load_profile

    profile = load_profile("cpu")
    config, spec = profile.engine_config(), profile.profiling
    assert profile.name == "cpu" and config.drafter.kind == "onnx" and config.k_policy == "auto"
    assert spec.workload == "chat" and 0 not in spec.draft_lengths() and spec.max_new_tokens > 0
    assert load_profile("cpu-ngram").engine_config().drafter.kind == "ngram"


def test_profile_profiling_section_sets_the_run_defaults(tmp_path):
    from orchestrator.profiles import load_profile

    path = tmp_path / "p.yaml"
    path.write_text("version: 1\nname: p\ntarget: {model: smollm2-135m, device: cpu}\n"
                    "drafters: {d: {kind: ngram}}\nspeculation: {drafter: d}\n"
                    "profiling: {workload: code, k_sweep: [0, 3], warmup: 0, num_prompts: 2}\n")
    profile = load_profile(str(path))
    spec = profile.profiling
    assert (profile.name, spec.workload, spec.draft_lengths(), spec.warmup, spec.num_prompts) == ("p", "code", [3], 0, 2)
    assert profile.engine_config().drafter.kind == "ngram"
