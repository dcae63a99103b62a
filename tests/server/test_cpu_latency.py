"""The CPU latency QoS request servers may hold (`server.cpu_latency_us`, `--cpu-latency-us`)."""

import os

import pytest

from orchestrator.errors import HetspecError
from orchestrator.server.cpu_latency import DEVICE, CpuLatencyRequest, current_cpu_latency_us

from servers import Server

needs_device = pytest.mark.skipif(not os.access(DEVICE, os.W_OK),
                                  reason=f"needs write access to {DEVICE} (Linux, root or a udev rule)")


def _baseline() -> int:
    before = current_cpu_latency_us()
    if not before:  # another process holds 0 already: a request would change nothing to see
        pytest.skip(f"{DEVICE} already reads {before}")
    return before


@needs_device
def test_a_request_holds_the_bound_while_open_and_releases_it_on_close():
    before = _baseline()
    with CpuLatencyRequest(0) as request:
        assert request.microseconds == 0
        assert current_cpu_latency_us() == 0
    assert current_cpu_latency_us() == before
    with CpuLatencyRequest(before - 1):  # a looser request than 0 but tighter than the default
        assert current_cpu_latency_us() == before - 1
    assert current_cpu_latency_us() == before


def test_a_device_that_cannot_be_opened_is_one_clear_error(tmp_path):
    missing = tmp_path / "no-such-device"
    with pytest.raises(HetspecError, match=f"cpu_latency_us: cannot open {missing} .*root or a udev rule"):
        CpuLatencyRequest(0, device=str(missing))
    with pytest.raises(HetspecError, match="must be >= 0, got -5"):
        CpuLatencyRequest(-5, device=str(missing))


@needs_device
@pytest.mark.parametrize("verb", [("drafter", "serve"), ("serve",)], ids=["drafter-serve", "serve"])
def test_a_server_holds_the_request_while_it_serves(verb):
    before = _baseline()
    server = Server(*verb, "--profile", "cpu", "--port", "0", "--cpu-latency-us", "0")
    try:
        assert "CPU latency request 0 us" in server.log()
        assert current_cpu_latency_us() == 0
    finally:
        assert server.stop() == 0
    assert current_cpu_latency_us() == before
