"""Profiles: shipped ones load, bad ones fail in one line naming the key, placement and fallbacks."""

import logging
from dataclasses import replace

import pytest
import yaml

from orchestrator.config import EngineConfig
from orchestrator.errors import HetspecError, ProfileError
from orchestrator.profiles import Overrides, apply_overrides, load_profile, shipped_profiles

SHIPPED = ["cpu", "cpu-coder", "cpu-ngram", "gpu-coder", "gpu-target-cpu-drafter", "gpu-target-npu-coder",
           "gpu-target-npu-drafter", "npu-only", "remote-drafter"]
MISSING_CUDA = "cuda:63"  # absent on any machine these tests run on
MISSING_NPU = "npu:63"


def write(tmp_path, data) -> str:
    path = tmp_path / "p.yaml"
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return str(path)


def base(**sections) -> dict:
    """A minimal valid profile with `sections` replacing its top-level keys."""
    data = {"version": 1, "target": {"device": "cpu"}, "drafters": {"d": {"kind": "ngram"}},
            "speculation": {"drafter": "d"}}
    data.update(sections)
    return data


def test_all_shipped_profiles_are_listed_and_load():
    assert shipped_profiles() == sorted(SHIPPED)
    for name in SHIPPED:
        profile = load_profile(name)
        assert profile.source == name and profile.name == name
        assert profile.server.host == "127.0.0.1"  # localhost unless a profile says otherwise


def test_cpu_profile_is_todays_defaults():
    assert load_profile("cpu").engine_config() == replace(EngineConfig(), model="smollm2-135m")


def test_a_file_path_loads_and_sections_have_defaults(tmp_path):
    profile = load_profile(write(tmp_path, base()))
    assert profile.profiling.k_sweep == [1, 2, 4, 8] and profile.profiling.warmup == 1
    assert profile.transport.kind == "inline" and profile.server.port == 50051
    config = profile.engine_config()
    assert config.drafter.kind == "ngram" and (config.k_policy, config.num_speculative_tokens) == ("auto", 8)


@pytest.mark.parametrize("verification, name, options", [
    ("exact", "rejection", {}),
    ("strict", "strict", {}),
    ({"policy": "nkl", "delta": 0.2}, "nkl", {"delta": 0.2, "temperature": 0.6, "budget": 0.05}),
])
def test_the_acceptance_policy_reaches_the_engine_config(tmp_path, verification, name, options):
    config = load_profile(write(tmp_path, base(speculation={"drafter": "d", "verification": verification}))).engine_config()
    assert config.acceptance.name == name and dict(config.acceptance.options) == options


def test_overlap_reaches_the_engine_config_and_the_cli_flag_overrides_the_profile(tmp_path):
    from orchestrator.profiles import Overrides, apply_overrides

    profile = load_profile(write(tmp_path, base(speculation={"drafter": "d", "overlap": True})))
    assert profile.engine_config().overlap is True and load_profile("cpu").engine_config().overlap is False
    assert apply_overrides(load_profile("cpu"), Overrides(overlap=True)).overlap is True


def test_several_drafters_become_one_combined_drafter_in_the_order_given(tmp_path):
    data = base(drafters={"lookup": {"kind": "ngram"}, "int4": {"kind": "onnx", "precision": "int4"}},
                speculation={"drafters": ["lookup", "int4"]})
    config = load_profile(write(tmp_path, data)).engine_config()
    assert config.drafter.kind == "combined" and config.drafter.combine == "confidence"
    assert [d.kind for d in config.drafter.drafters] == ["ngram", "onnx"]


BAD = [  # (profile text or dict, what the one-line message must contain)
    ("", "empty file"),
    ("# only a comment\n", "empty file"),
    ("target: [cpu\n", "not valid YAML"),
    ("version: 1\n\ttarget: x\n", "not valid YAML"),
    ("- 1\n- 2\n", "(top level): expected a mapping"),
    ("hello\n", "(top level): expected a mapping"),
    ("version: 1\ntarget: {device: cpu}\ntarget: {device: cpu}\n", "duplicate key 'target'"),
    ({"target": {"device": "cpu"}}, "version: missing required key"),
    (base(version=2), "version: Input should be 1"),
    (base(version="1"), "version:"),
    ({"version": 1}, "target: missing required key"),
    (base(target={"dtype": "float32"}), "target.device: missing required key"),
    (base(target={"device": "tpu:0"}), "target.device: unknown device 'tpu:0': expected one of cpu, cuda, npu"),
    (base(target={"device": "cuda:x"}), "target.device: bad device index"),
    (base(target={"device": "cpu", "dtype": "float8"}), "target.dtype: Input should be 'float32', 'float16' or"),
    (base(target={"device": "cpu", "kv": {"block_size": -16}}), "target.kv.block_size: Input should be greater"),
    (base(target={"device": "cpu", "kv": {"max_tokens": 0}}), "target.kv.max_tokens: Input should be greater"),
    (base(target={"device": "cpu", "kv": {"max_tokens": "lots"}}), "target.kv.max_tokens: Input should be a valid int"),
    (base(target={"device": "cpu", "max_num_seqs": 1.5}), "target.max_num_seqs:"),
    (base(targte={"device": "cpu"}), "(top level): unknown key 'targte' (allowed: version, name"),
    (base(target={"device": "cpu", "devcie": "cpu"}), "target: unknown key 'devcie' (allowed:"),
    (base(target={"device": "cpu", "fallback": [{"device": "gpu"}]}), "target.fallback.0.device: unknown device"),
    (base(target={"device": "cpu", "fallback": "cpu"}), "target.fallback: Input should be a valid list"),
    (base(drafters={"d": {"device": "cpu"}}), "drafters.d: missing 'kind' (one of onnx, torch, ngram, mtp, remote)"),
    (base(drafters={"d": {"kind": "magic"}}), "drafters.d: unknown kind 'magic' (one of onnx, torch, ngram, mtp, remote)"),
    (base(drafters={"d": {"kind": "onnx", "max_ngram": 3}}), "drafters.d: unknown key 'max_ngram' (allowed:"),
    (base(drafters={"d": {"kind": "onnx", "precision": "int3"}}), "drafters.d.precision: Input should be 'int4'"),
    (base(drafters={"d": {"kind": "onnx", "block_size": 48}}), "drafters.d.block_size:"),
    (base(drafters={"d": {"kind": "onnx", "device": "gpu"}}), "drafters.d.device: unknown device 'gpu'"),
    (base(drafters={"d": {"kind": "onnx", "provider_options": {"x": [1]}}}),
     "drafters.d.provider_options.x: expected a string, number or boolean, got list"),
    (base(drafters={"d": {"kind": "onnx", "threads": 0}}), "drafters.d.threads: Input should be greater than or equal to 1"),
    (base(drafters={"d": {"kind": "onnx", "threads": "all"}}), "drafters.d.threads:"),
    (base(drafters={"d": {"kind": "ngram", "max_ngram": -1}}), "drafters.d.max_ngram: Input should be greater"),
    (base(drafters={"d": {"kind": "torch", "dtype": "int8"}}), "drafters.d.dtype:"),
    (base(drafters={"d": {"kind": "remote"}}), "drafters.d.address: missing required key"),
    (base(drafters={"d": {"kind": "remote", "address": "nohost"}}), "drafters.d.address: expected host:port"),
    (base(drafters={"d": {"kind": "remote", "address": "h:70000"}}), "drafters.d.address: expected host:port"),
    (base(drafters={"d": {"kind": "remote", "address": "h:1", "timeout_s": -1}}), "drafters.d.timeout_s:"),
    (base(drafters=[{"kind": "ngram"}]), "drafters: Input should be a valid dictionary"),
    (base(drafters={"my drafter": {"kind": "ngram"}}, speculation={}),
     "drafters.my drafter: 'my drafter': names may use only"),
    (base(speculation={"drafter": "nope"}), "speculation.drafter: unknown drafter 'nope' (drafters: d)"),
    (base(drafters={"d": {"kind": "ngram", "fallback": ["x"]}}), "drafters.d.fallback.0: unknown drafter 'x'"),
    (base(drafters={"d": {"kind": "ngram", "fallback": ["d"]}}), "drafters.d.fallback: fallback loop d -> d"),
    (base(drafters={"d": {"kind": "ngram", "fallback": ["e"]}, "e": {"kind": "ngram", "fallback": ["d"]}}),
     "fallback loop d -> e -> d"),
    (base(speculation={"drafter": "d", "num_speculative_tokens": 33}), "speculation.num_speculative_tokens:"),
    (base(speculation={"drafter": "d", "num_speculative_tokens": -1}), "speculation.num_speculative_tokens:"),
    (base(speculation={"drafter": "d", "num_speculative_tokens": "fast"}),
     "speculation.num_speculative_tokens: must be auto or a whole number in 0..32, got 'fast'"),
    (base(speculation={"drafter": "d", "adaptive_k": True}),
     "speculation: adaptive_k applies to a fixed num_speculative_tokens, not auto"),
    (base(speculation={"drafter": "d", "num_speculative_tokens": 4, "draft_len_schedule": {0: 2}}),
     "speculation.draft_len_schedule.0: Input should be greater than 0"),
    (base(speculation={"drafter": "d", "verification": "nkll"}),
     "speculation.verification: policy: unknown acceptance policy 'nkll'; allowed: rejection, strict, nkl,"),
    (base(speculation={"drafter": "d", "verification": {"policy": "nkl", "gamma": 1}}),
     "speculation.verification: gamma: policy 'nkl' has no option 'gamma'; its options: delta, temperature, budget"),
    (base(speculation={"drafter": "d", "verification": {"policy": "block", "m": 0}}),
     "speculation.verification: m: must be a whole number >= 1, got 0"),
    (base(speculation={"drafter": "d", "verification": {"delta": 0.1}}),
     "speculation.verification: a policy name or {policy: NAME, option: value}, got {'delta': 0.1}"),
    (base(speculation={"drafter": "d", "adaptive_k": "yes"}), "speculation.adaptive_k: Input should be a valid bool"),
    (base(speculation={"drafter": "d", "drafters": ["d", "e"]}), "speculation: give drafter or drafters, not both"),
    (base(speculation={"drafters": ["d"]}), "speculation: drafters: at least two different drafters, got ['d']"),
    (base(speculation={"drafters": ["d", "nope"]}), "speculation.drafters.1: unknown drafter 'nope' (drafters: d)"),
    (base(speculation={"drafters": ["d", "d2"], "combine": "tree"}), "speculation.combine: Input should be 'confidence'"),
    (base(drafters={"d": {"kind": "ngram"}, "e": {"kind": "onnx"}}, speculation={"drafters": ["d", "e"], "overlap": True}),
     "speculation: overlap needs a single drafter, not several (drafters)"),
    (base(speculation={"drafter": "d", "overlap": "sometimes"}), "speculation.overlap: Input should be a valid bool"),
    (base(server={"port": 0}), "server.port: Input should be greater than or equal to 1"),
    (base(server={"host": ""}), "server.host:"),
    (base(server={"cpu_latency_us": -1}), "server.cpu_latency_us: Input should be greater than or equal to 0"),
    (base(server={"cpu_latency_us": "low"}), "server.cpu_latency_us: Input should be a valid integer"),
    (base(server={"tls": {"cert_file": "c.pem"}}), "server.tls.key_file: missing required key"),
    (base(transport={"kind": "carrier-pigeon"}), "transport.kind: Input should be 'inline' or 'shared_memory'"),
    (base(transport={"staging_pool_bytes": -1}), "transport.staging_pool_bytes:"),
    (base(profiling={"k_sweep": []}), "profiling.k_sweep:"),
    (base(profiling={"k_sweep": [4, 99]}), "profiling.k_sweep.1:"),
    (base(profiling={"output_dir": 5}), "profiling.output_dir: Input should be a valid string"),
    (base(profiling={"warmup": -1}), "profiling.warmup: Input should be greater"),
    (base(profiling={"baseline": False}), "profiling: unknown key 'baseline'"),
]


@pytest.mark.parametrize("data, match", BAD, ids=[f"bad{i}" for i in range(len(BAD))])
def test_bad_profile_gives_one_line_naming_the_key(tmp_path, data, match):
    with pytest.raises(ProfileError) as info:
        load_profile(write(tmp_path, data))
    message = str(info.value)
    assert "\n" not in message and match in message, message


def test_bad_references(tmp_path):
    for ref, match in [("no-such-profile", r"no shipped profile of that name \(shipped: cpu, cpu-coder, cpu-ngram"),
                       (str(tmp_path), "not a file")]:
        with pytest.raises(ProfileError, match=match):
            load_profile(ref)
    binary = tmp_path / "b.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ProfileError, match="cannot read it as UTF-8"):
        load_profile(str(binary))


def test_target_takes_a_declared_fallback_and_logs_why(tmp_path, caplog):
    fallback = [{"device": MISSING_CUDA, "dtype": "float16"}, {"device": "cpu", "dtype": "bfloat16"}]
    profile = load_profile(write(tmp_path, base(target={"device": MISSING_NPU, "fallback": fallback})))
    with caplog.at_level(logging.WARNING, logger="hetspec.profiles"):
        config = profile.engine_config()
    assert (config.device, config.dtype) == ("cpu", "bfloat16")
    assert [p.device for p, _ in profile.plan().target_skipped] == [MISSING_NPU, MISSING_CUDA]
    (warning,) = caplog.messages
    assert f"target on {MISSING_NPU}" in warning and "declared fallback cpu (bfloat16)" in warning


def test_drafter_fallbacks_are_tried_depth_first(tmp_path):
    drafters = {"far": {"kind": "torch", "device": MISSING_CUDA, "fallback": ["npu", "last"]},
                "npu": {"kind": "torch", "device": MISSING_NPU, "fallback": ["lookup"]},
                "lookup": {"kind": "ngram", "max_ngram": 2},
                "last": {"kind": "onnx"}}
    plan = load_profile(write(tmp_path, base(drafters=drafters, speculation={"drafter": "far"}))).plan()
    assert plan.ok and plan.drafter == "lookup"
    assert [n for n, _ in plan.drafter_skipped] == ["far", "npu"]
    assert MISSING_CUDA in plan.drafter_skipped[0][1]
    assert plan.engine_config().drafter.max_ngram == 2


def test_missing_device_without_fallback_cannot_run(tmp_path):
    profile = load_profile(write(tmp_path, base(target={"device": MISSING_CUDA})))
    with pytest.raises(ProfileError, match=rf"target.device: {MISSING_CUDA} .*no fallback declared"):
        profile.engine_config()


def test_remote_drafter_profile_plans_the_remote_drafter(tmp_path, monkeypatch, smollm2):
    from orchestrator.assemble import build_drafter, drafter_context

    config = load_profile("remote-drafter").engine_config()
    assert (config.drafter.kind, config.drafter.address) == ("remote", "127.0.0.1:50061")
    assert not config.drafter.tls and config.drafter.token_env is None
    drafters = {"far": {"kind": "remote", "address": "127.0.0.1:1", "ca_file": "/ca.pem", "token_env": "HETSPEC_T",
                        "timeout_s": 0.1}}
    profile = load_profile(write(tmp_path, base(drafters=drafters, speculation={"drafter": "far"})))
    config = profile.engine_config()  # pure data: the token is read when the drafter connects
    assert (config.drafter.ca_file, config.drafter.token_env) == ("/ca.pem", "HETSPEC_T")
    with pytest.raises(HetspecError, match=r"token_env names \$HETSPEC_T, which is unset"):
        build_drafter(config.drafter, drafter_context(config, smollm2))
    monkeypatch.setenv("HETSPEC_T", "s3cret")
    with pytest.raises(HetspecError, match=r"ca_file: cannot read '/ca.pem'"):  # TLS, with that CA
        build_drafter(config.drafter, drafter_context(config, smollm2))


def test_onnx_drafter_device_picks_the_execution_provider_and_kv_memory(tmp_path):
    from devices import ort_placement

    npu = ort_placement("npu:1")
    assert (npu.provider.name, npu.options, npu.memory, npu.device_id) == (
        "CANNExecutionProvider", {"device_id": "1"}, "cann", 1)  # KV buffers on the NPU, not the host
    assert ort_placement("cuda:2", {"arena_extend_strategy": "kSameAsRequested"}).options == {
        "device_id": "2", "arena_extend_strategy": "kSameAsRequested"}
    assert ort_placement("cpu").memory == "cpu"
    config = load_profile("gpu-target-npu-drafter").drafters["npu-int4"].drafter_config()
    assert (config.device, config.providers, config.provider_options) == ("npu:0", (), {})


def test_onnx_drafter_threads_reach_its_onnx_runtime_session(tmp_path, smollm2):
    from orchestrator.assemble import build_drafter, drafter_context

    drafters = {"d": {"kind": "onnx", "threads": 1}}  # the cpu profile's export (cached), one thread
    config = load_profile(write(tmp_path, base(drafters=drafters, speculation={"drafter": "d"}))).engine_config()
    assert config.drafter.threads == 1
    drafter = build_drafter(config.drafter, drafter_context(config, smollm2))
    try:
        assert drafter.session.get_session_options().intra_op_num_threads == 1
    finally:
        drafter.close()
    assert load_profile("cpu").engine_config().drafter.threads is None  # ONNX Runtime's default


def _apply(profile: str = "cpu", **given):
    return apply_overrides(load_profile(profile), Overrides(**given))


def test_flags_override_the_profile():
    assert _apply() == load_profile("cpu").engine_config()
    c = _apply("gpu-target-cpu-drafter", device="cpu", dtype="float32")
    assert (c.device, c.dtype, c.drafter.kind, c.max_kv_tokens) == ("cpu", "float32", "onnx", 32768)
    c = _apply(drafter="ngram", num_speculative_tokens=2, adaptive_k=True)
    assert (c.drafter.kind, c.num_speculative_tokens, c.k_policy) == ("ngram", 2, "adaptive")
    c = _apply(precision="int8", int8_lm_head=False, drafter_providers=("CPUExecutionProvider",))
    assert (c.drafter.precision, c.drafter.int8_lm_head, c.drafter.block_size) == ("int8", False, 32)
    assert c.drafter.providers == ("CPUExecutionProvider",)
    assert _apply(drafter_device="npu:3").drafter.device == "npu:3"
    assert _apply(drafter_threads=3).drafter.threads == 3
    assert _apply(no_spec=True).drafter_kind == "none"


def test_flags_for_another_drafter_kind_are_refused_in_one_line():
    with pytest.raises(HetspecError, match="--precision: only for the onnx drafter, not the ngram drafter"):
        _apply(drafter="ngram", precision="int8")
    with pytest.raises(HetspecError, match="--drafter-threads: only for the onnx drafter, not the ngram drafter"):
        _apply(drafter="ngram", drafter_threads=2)
    with pytest.raises(HetspecError, match="kv_handoff needs an onnx drafter"):
        _apply(drafter="ngram", kv_handoff=True)
    with pytest.raises(HetspecError, match="--drafter-device: unknown device 'tpu:0'"):
        _apply(drafter_device="tpu:0")


def test_an_explicit_device_is_never_swapped_for_a_fallback(tmp_path):
    path = write(tmp_path, base(target={"device": "cpu", "fallback": [{"device": "cpu"}]}))
    with pytest.raises(ProfileError, match=f"{MISSING_CUDA}.*no fallback declared"):
        _apply(path, device=MISSING_CUDA)


def test_the_readme_example_loads_and_its_fallbacks_resolve(tmp_path):
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    example = readme.split("Writing one")[1].split("```yaml\n")[1].split("```")[0]
    plan = load_profile(write(tmp_path, example)).plan()
    assert plan.ok and plan.target.device in ("cpu", "cuda:0") and plan.drafter in ("npu-int4", "lookup")


def test_mtp_drafters_from_a_profile_and_from_flags(tmp_path):
    from orchestrator.config import MtpDrafterConfig, RemoteDrafterConfig

    profile = load_profile(write(tmp_path, base(drafters={
        "m": {"kind": "mtp", "model": "/d", "runtime": "onnx", "precision": "int8", "device": "npu:0",
              "fallback": ["r"]},
        "r": {"kind": "remote", "address": "127.0.0.1:50061", "hidden_states": True}},
        speculation={"drafter": "r"})))
    assert profile.engine_config().drafter == RemoteDrafterConfig(address="127.0.0.1:50061", hidden_states=True)
    assert profile.drafters["m"].drafter_config() == MtpDrafterConfig(model="/d", device="npu:0", runtime="onnx",
                                                                      precision="int8")
    assert "CANNExecutionProvider" in profile.drafters["m"].describe()
    c = _apply(drafter="mtp", drafter_model="/d")
    assert c.drafter == MtpDrafterConfig(model="/d")
    assert _apply(drafter="mtp", drafter_model="/d", precision="int4").drafter.runtime == "onnx"
    with pytest.raises(HetspecError, match="--drafter mtp needs --drafter-model DIR"):
        _apply(drafter="mtp")
    with pytest.raises(HetspecError, match="--block-size: only for the onnx drafter, not the mtp drafter"):
        _apply(drafter="mtp", drafter_model="/d", block_size=64)
    with pytest.raises(ProfileError, match="drafters.m.runtime: Input should be 'torch', 'onnx' or 'auto'"):
        load_profile(write(tmp_path, base(drafters={"m": {"kind": "mtp", "model": "/d", "runtime": "tvm"}},
                                          speculation={"drafter": "m"})))
    auto = load_profile(write(tmp_path, base(drafters={"m": {"kind": "mtp", "model": "/d", "runtime": "auto"}},
                                             speculation={"drafter": "m"}))).drafters["m"]
    assert auto.drafter_config().runtime == "auto" and auto.unavailable_reason() == ""
    assert "torch float32 or onnx fp32, timed at start-up" in auto.describe()
