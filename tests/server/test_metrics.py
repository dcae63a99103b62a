"""Prometheus metrics fed by a real engine (SmolLM2-135M, INT4 ONNX drafter), read back by scraping."""

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.assemble import build_engine
from orchestrator.config import EngineConfig, SamplingParams
from orchestrator.server.metrics import EngineMetrics
from orchestrator.tracing import HOST_TRACK, Span, Tracer, Track


def scrape(registry) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} from the exposition text."""
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture(scope="module")
def engine():
    engine = build_engine(EngineConfig(num_speculative_tokens=3), tracer=Tracer(keep=False), progress=False)
    return engine


def test_counters_and_histograms_match_the_engine_after_a_real_generation(engine, smollm2_tokenizer):
    metrics = EngineMetrics(engine)
    ids = smollm2_tokenizer("The history of the printing press begins").input_ids
    seq = engine.generate(ids, SamplingParams(max_new_tokens=24, ignore_eos=True))
    m = scrape(metrics.registry)
    st = seq.stats
    assert m[("hetspec_draft_tokens_total", ())] == st.num_drafted > 0
    assert m[("hetspec_accepted_tokens_total", ())] == st.num_accepted
    assert m[("hetspec_verify_steps_total", ())] == st.num_steps
    for j, (d, a) in enumerate(zip(st.drafted_per_position, st.accepted_per_position)):
        assert m[("hetspec_draft_tokens_by_position_total", (("position", str(j + 1)),))] == d
        assert m.get(("hetspec_accepted_tokens_by_position_total", (("position", str(j + 1)),)), 0) == a
    assert m[("hetspec_step_seconds_count", ())] == st.num_steps + 1  # + the prefill step
    verify = (("device", "cpu"), ("phase", "verify"), ("role", "target"))
    assert m[("hetspec_phase_seconds_count", verify)] == st.num_steps
    assert 0 < m[("hetspec_phase_seconds_sum", verify)] < m[("hetspec_step_seconds_sum", ())]
    assert m[("hetspec_kv_blocks_used", ())] == 0  # the finished request gave its blocks back
    assert m[("hetspec_kv_blocks_total", ())] == engine.target.pool.num_blocks
    # the same counts under vLLM's names: drafts are verify steps that had drafts, positions 0-based
    vllm = (("engine", "0"), ("model_name", "hetspec"))
    drafted_steps = sum(1 for n in st.steps_per_k.items() for _ in range(n[1]) if n[0] > 0)
    assert m[("vllm:spec_decode_num_drafts_total", vllm)] == drafted_steps > 0
    assert m[("vllm:spec_decode_num_draft_tokens_total", vllm)] == st.num_drafted
    assert m[("vllm:spec_decode_num_accepted_tokens_total", vllm)] == st.num_accepted
    for j, a in enumerate(st.accepted_per_position):
        assert m.get(("vllm:spec_decode_num_accepted_tokens_per_pos_total", (*vllm, ("position", str(j)))), 0) == a
    assert m[("vllm:kv_cache_usage_perc", vllm)] == 0.0
    assert m[("vllm:num_requests_running", vllm)] == 0


def test_queue_depth_and_kv_usage_are_read_when_scraped(engine, smollm2_tokenizer):
    metrics = EngineMetrics(engine)
    ids = smollm2_tokenizer("Hello there").input_ids
    seq_ids = [engine.add_request(ids, SamplingParams(max_new_tokens=4)) for _ in range(2)]
    assert scrape(metrics.registry)[("hetspec_queue_depth", ())] == 2
    engine.step()
    m = scrape(metrics.registry)
    assert m[("hetspec_queue_depth", ())] == 0 and m[("hetspec_running_sequences", ())] == 2
    assert m[("hetspec_kv_blocks_used", ())] >= 2
    for seq_id in seq_ids:
        engine.cancel(seq_id)
        engine.release(seq_id)
    assert scrape(metrics.registry)[("hetspec_kv_blocks_used", ())] == 0


def test_the_shipped_grafana_dashboard_reads_only_metrics_the_server_exports(engine):
    import json
    import re
    from importlib.resources import files

    metrics = EngineMetrics(engine)  # families are declared (HELP, TYPE) before any sample exists
    families = text_string_to_metric_families(generate_latest(metrics.registry).decode())
    exported = {f.name + suffix for f in families for suffix in ("", "_total", "_bucket", "_sum", "_count")}
    dashboard = json.loads(files("orchestrator.server").joinpath("grafana/hetspec-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"([a-z_:]+_?[a-z_:]*)(?=\{|\[)", e) if ":" in m or m.startswith("hetspec")}
    assert len(exprs) >= 7 and len(used) >= 8
    assert used <= exported, used - exported


def test_a_predraft_is_its_own_phase_and_not_part_of_the_step(engine):
    """Hand-made spans of one overlapped step: the pre-draft ran beside the verify, so the step took
    the verify and the wait, not their sum with the pre-draft."""
    metrics = EngineMetrics(engine)
    drafter, target = Track("cpu", "drafter"), Track("cpu", "target")
    metrics.observe_step([Span("verify", target, 0, 40.0, 1), Span("draft", drafter, 0, 30.0, 1, args={"ahead": True}),
                          Span("wait", HOST_TRACK, 0, 2.0, 1)])
    m = scrape(metrics.registry)
    assert m[("hetspec_step_seconds_sum", ())] == pytest.approx(0.042)
    ahead = (("device", "cpu"), ("phase", "draft_ahead"), ("role", "drafter"))
    assert m[("hetspec_phase_seconds_sum", ahead)] == pytest.approx(0.030)
