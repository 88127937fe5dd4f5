"""tools/bench/request_reply.py measures each transport with every reply checked (untimed:
the figures are the benchmark's, not the test's)."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from tools.bench import request_reply as rr

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(("case", "transport", "pool", "size"), [
    ("1->1", "shmbus default", 1, 32),
    ("1->1", "zmq REQ/REP", 1, 32),
    ("4->4", "shmbus busy", 4, 4096),
    ("4->4", "Pipe", 4, 32),
    ("udp 1->1", "shmbus udp", 1, 32),
    ("udp 1->1", "zmq REQ/REP tcp", 1, 32),
    ("udp 4->4", "shmbus udp", 4, 4096),
    ("udp 4->4", "zmq DEALER/ROUTER tcp", 4, 32),
])
def test_a_measurement_counts_checked_calls(tmp_path: Path, case, transport, pool, size):
    ctx = multiprocessing.get_context("spawn")
    root = Path("/dev/shm") / f"rr-test-{tmp_path.name}"
    root.mkdir()
    try:
        row = rr.measure(ctx, root, case, transport, pool, size, 0.3, 60)
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    assert row["errors"] == 0 and row["round_trips"] > 0
    assert row["calls_per_s"] > 0 and row["cpu_us_per_call"] > 0
    assert 0 < row["p50_us"] <= row["p99_us"]
    if transport == "shmbus udp":  # requesters, responders, each bus's driver and netbridge
        assert row["processes"] == 2 * pool + 4


def test_the_table_gives_ratios_against_the_zmq_row_of_the_same_case():
    rows = [{"case": "1->1", "transport": "zmq REQ/REP", "size": 32, "status": "ok",
             "p50_us": 60.0, "p99_us": 90.0, "calls_per_s": 10_000.0, "cpu_us_per_call": 90.0},
            {"case": "1->1", "transport": "shmbus busy", "size": 32, "status": "ok",
             "p50_us": 5.0, "p99_us": 9.0, "calls_per_s": 150_000.0, "cpu_us_per_call": 12.0},
            {"case": "4->4", "transport": "Pipe", "size": 32, "status": "failed",
             "error": "boom"}]
    text = rr.table(rows)
    assert "15.0" in text.splitlines()[2] and "failed: boom" in text


def test_the_udp_pool_is_measured_against_dealer_router_over_tcp():
    plan = rr.plan((32, 4096), only="udp")
    assert ("udp 4->4", "shmbus udp", 4, 4096) in plan
    assert ("udp 4->4", "zmq DEALER/ROUTER tcp", 4, 32) in plan
    rows = [{"case": "udp 4->4", "transport": t, "size": 32, "status": "ok", "p50_us": 1.0,
             "p99_us": 2.0, "calls_per_s": calls, "cpu_us_per_call": 1.0}
            for t, calls in (("zmq REQ/REP tcp", 1_000.0), ("zmq DEALER/ROUTER tcp", 8_000.0),
                             ("shmbus udp", 20_000.0))]
    assert "2.5" in rr.table(rows).splitlines()[3]


def test_only_the_one_host_one_to_one_rows():
    plan = rr.plan((32, 4096), only="1->1")
    assert {case for case, *_ in plan} == {"1->1"}
    assert {transport for _, transport, *_ in plan} >= {
        "shmbus busy", "shmbus default", "shmbus blocking", "zmq REQ/REP"}
