"""Spans: timed with the device timer, flows recorded, nothing recorded when disabled."""

import time

import pytest

from orchestrator.tracing import Span, Tracer, Track

CPU_HOST = Track("cpu", "host")


def test_span_times_its_body_and_keeps_ids():
    tracer = Tracer()
    with tracer.span("verify", CPU_HOST, step=3, request=7, num_tokens=5):
        time.sleep(0.02)
    assert tracer.spans == []  # device timers are read at flush, not in the hot path
    tracer.flush()
    (span,) = tracer.spans
    assert span.name == "verify" and span.step == 3 and span.request == 7
    assert span.args == {"num_tokens": 5}
    assert 19.0 <= span.dur_ms < 200.0


def test_flows_link_send_and_receive_and_round_trip():
    tracer = Tracer()
    flow = tracer.new_flow()
    with tracer.span("d2h", Track("cpu", "target"), flow_out=flow):
        pass
    with tracer.span("h2d", Track("cpu", "drafter"), flow_in=(flow,)):
        pass
    send, recv = tracer.clear()
    assert send.flow_out == flow and recv.flow_in == (flow,) and tracer.spans == []
    assert Span.from_dict(recv.to_dict()) == recv


def test_disabled_tracer_records_nothing_and_listeners_see_spans():
    off = Tracer(enabled=False)
    with off.span("draft", CPU_HOST):
        pass
    off.add(Span("wire", CPU_HOST, 0, 1.0))
    off.flush()
    assert off.spans == []
    seen = []
    on = Tracer()
    on.listeners.append(seen.append)
    on.add(Span("wire", CPU_HOST, 0, 1.0))
    assert [s.name for s in seen] == ["wire"]
    batches = []
    on.flush_listeners.append(batches.append)
    for name in ("draft", "verify"):
        with on.span(name, CPU_HOST, step=1):
            pass
    on.flush()
    on.flush()  # nothing pending: no empty batch
    assert [[s.name for s in batch] for batch in batches] == [["draft", "verify"]]


def test_unknown_device_is_refused():
    from devices import DeviceUnavailable

    with pytest.raises(DeviceUnavailable):
        Tracer().span("draft", Track("tpu:0", "drafter"))
