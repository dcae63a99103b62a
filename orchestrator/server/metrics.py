"""Prometheus metrics of an engine, fed by its spans; the services layer serves the registry.

    metrics = EngineMetrics(engine)            # the engine's tracer must be enabled
    prometheus_client.generate_latest(metrics.registry)

Counters and histograms are updated once per engine step from that step's spans (the verify
step's counts ride on its `commit` spans); queue depth and KV pool usage are gauges read from
the engine when scraped. The speculative-decoding counters and scheduler gauges are also exported
under vLLM's names and meanings (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos` with a 0-based `position`,
`vllm:num_requests_running`, `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`; labels
`model_name` and `engine`), so dashboards built for vLLM read a hetspec server as they are.
"""

from collections import defaultdict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from orchestrator.engine import Engine
from orchestrator.tracing import Span, is_ahead, phase_of

# 0.1 ms .. ~13 s, doubling: covers a schedule call and a long CPU prefill alike
_BUCKETS = tuple(1e-4 * 2 ** i for i in range(18))


class EngineMetrics:
    """Collectors for one engine in `registry` (a fresh registry by default)."""

    def __init__(self, engine: Engine, registry: CollectorRegistry | None = None, model_name: str = "hetspec"):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self._vllm(engine, model_name)
        self.draft_tokens = Counter("hetspec_draft_tokens", "Draft tokens proposed", registry=r)
        self.accepted_tokens = Counter("hetspec_accepted_tokens", "Draft tokens accepted", registry=r)
        self.draft_by_position = Counter("hetspec_draft_tokens_by_position",
                                         "Draft tokens proposed at each draft position (1-based)",
                                         ["position"], registry=r)
        self.accepted_by_position = Counter("hetspec_accepted_tokens_by_position",
                                            "Draft tokens accepted at each draft position (1-based)",
                                            ["position"], registry=r)
        self.verify_steps = Counter("hetspec_verify_steps", "Verify steps (one per sequence)", registry=r)
        self.step_seconds = Histogram("hetspec_step_seconds", "Engine step latency (sum of its phases)",
                                      buckets=_BUCKETS, registry=r)
        self.phase_seconds = Histogram("hetspec_phase_seconds", "Latency of one phase within one step",
                                       ["phase", "device", "role"], buckets=_BUCKETS, registry=r)
        self._gauges(engine)
        if not engine.tracer.enabled:
            raise ValueError("EngineMetrics reads the engine's spans: build the engine with an enabled tracer")
        engine.tracer.flush_listeners.append(self.observe_step)

    def _gauges(self, engine) -> None:
        r, pool = self.registry, engine.target.pool
        Gauge("hetspec_queue_depth", "Requests waiting to be scheduled", registry=r).set_function(
            lambda: len(engine.scheduler.waiting))
        Gauge("hetspec_running_sequences", "Sequences in the running batch", registry=r).set_function(
            lambda: len(engine.scheduler.running))
        Gauge("hetspec_kv_blocks_used", "KV pool blocks in use", registry=r).set_function(
            lambda: pool.num_blocks - pool.num_free_blocks)
        Gauge("hetspec_kv_blocks_total", "KV pool capacity in blocks", registry=r).set_function(
            lambda: pool.num_blocks)

    def _vllm(self, engine, model_name: str) -> None:
        r, pool, labels = self.registry, engine.target.pool, ("model_name", "engine")
        ids = (model_name, "0")
        self.vllm_drafts = Counter("vllm:spec_decode_num_drafts", "Verify steps that had draft tokens",
                                   labels, registry=r).labels(*ids)
        self.vllm_draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed",
                                         labels, registry=r).labels(*ids)
        self.vllm_accepted = Counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                     labels, registry=r).labels(*ids)
        self._vllm_per_pos = Counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                     "Draft tokens accepted at each draft position (0-based)",
                                     [*labels, "position"], registry=r)
        self._ids = ids
        for name, doc, read in (
                ("vllm:num_requests_running", "Requests in the running batch", lambda: len(engine.scheduler.running)),
                ("vllm:num_requests_waiting", "Requests waiting to be scheduled", lambda: len(engine.scheduler.waiting)),
                ("vllm:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = 100%)",
                 lambda: 1.0 - pool.num_free_blocks / pool.num_blocks)):
            Gauge(name, doc, labels, registry=r).labels(*ids).set_function(read)

    def observe_step(self, spans: list[Span]) -> None:
        """One flush = one engine step's spans."""
        per_phase: dict[tuple[str, str, str], float] = defaultdict(float)
        for s in spans:
            per_phase[(phase_of(s.name, s.args), s.track.device, s.track.role)] += s.dur_ms
            if s.name == "commit" and "num_draft" in s.args:
                self._count(s.args["num_draft"], s.args["num_accepted"])
        for (phase, device, role), ms in per_phase.items():
            self.phase_seconds.labels(phase, device, role).observe(ms / 1e3)
        self.step_seconds.observe(sum(ms for (phase, _, _), ms in per_phase.items() if not is_ahead(phase)) / 1e3)

    def _count(self, num_draft: int, num_accepted: int) -> None:
        self.verify_steps.inc()
        self.draft_tokens.inc(num_draft)
        self.accepted_tokens.inc(num_accepted)
        if num_draft:  # vLLM counts only the verify steps that had drafts
            self.vllm_drafts.inc()
            self.vllm_draft_tokens.inc(num_draft)
            self.vllm_accepted.inc(num_accepted)
        for j in range(num_draft):
            self.draft_by_position.labels(str(j + 1)).inc()
            if j < num_accepted:
                self.accepted_by_position.labels(str(j + 1)).inc()
                self._vllm_per_pos.labels(*self._ids, str(j)).inc()  # vLLM's positions count from 0
