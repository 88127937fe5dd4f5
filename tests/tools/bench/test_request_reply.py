"""tools/bench/request_reply.py measures each transport with every reply checked, compares
each row with the strongest peer that waits the same way, and writes its page (untimed: the
figures are the benchmark's, not the test's)."""

from __future__ import annotations

import multiprocessing
import shutil
from pathlib import Path
from typing import Any

import pytest

from tools.bench import pages
from tools.bench import request_reply as rr

pytestmark = pytest.mark.timeout(300)


@pytest.mark.parametrize(("case", "transport", "pool", "size"), [
    ("1->1", "shmbus blocking", 1, 32),
    ("1->1", "shmbus default", 1, 32),
    ("1->1", "zmq REQ/REP", 1, 32),
    ("1->1", "zmq DEALER/ROUTER", 1, 32),
    ("1->1", "iceoryx2", 1, 32),
    ("4->4", "shmbus busy", 4, 4096),
    ("4->4", "zmq DEALER/ROUTER", 4, 32),
    ("4->4", "Pipe", 4, 32),
    ("udp 1->1", "shmbus udp", 1, 32),
    ("udp 1->1", "zmq DEALER/ROUTER tcp", 1, 32),
    ("udp 4->4", "shmbus udp", 4, 4096),
])
def test_a_measurement_counts_checked_calls(tmp_path: Path, case, transport, pool, size):
    ctx = multiprocessing.get_context("spawn")
    root = Path("/dev/shm") / f"rr-test-{tmp_path.name}"
    root.mkdir()
    try:
        row = rr.measure(ctx, root, case, transport, pool, size, 0.3, 60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert row["errors"] == 0 and row["round_trips"] > 0
    assert row["calls_per_s"] > 0 and row["cpu_us_per_call"] > 0
    assert 0 < row["p50_us"] <= row["p99_us"]
    curve = list(row["curve_us"].values())
    assert curve == sorted(curve) and curve[0] > 0
    if transport == "shmbus udp":  # requesters, responders, each bus's driver and netbridge
        assert row["processes"] == 2 * pool + 4


def _run(transport: str, calls: list[float | None], case: str = "1->1",
         size: int = 32) -> list[dict[str, Any]]:
    """The runs of a row as run_interleaved gives them (None: a failed run)."""
    return [{"case": case, "transport": transport, "size": size, "status": "ok",
             "p50_us": 1e6 / c, "p99_us": 2e6 / c, "calls_per_s": c, "cpu_us_per_call": 9.0,
             "curve_us": {"50": 1e6 / c, "99.9": 3e6 / c}} if c is not None else
            {"case": case, "transport": transport, "size": size, "status": "failed",
             "error": "boom"} for c in calls]


def test_each_row_is_compared_with_the_strongest_peer_that_waits_the_same_way():
    rows = [rr.summarise(_run(t, calls)) for t, calls in [
        ("shmbus blocking", [60_000.0, 66_000.0, 63_000.0]),
        ("zmq REQ/REP", [18_000.0, 18_000.0, 18_000.0]),
        ("Pipe", [30_000.0, 33_000.0, 30_000.0]),
        ("shmbus busy", [100_000.0, 90_000.0, 120_000.0]),
        ("iceoryx2", [50_000.0, 45_000.0, 40_000.0]),
        ("shmbus default", [100_000.0, 100_000.0, 100_000.0])]]
    rr.add_ratios(rows)
    by = {r["transport"]: r for r in rows}
    assert by["shmbus blocking"]["base"] == "Pipe"
    assert by["shmbus blocking"]["ratio"] == pages.Spread(2.0, 2.0, 2.1, 3)
    assert by["shmbus busy"]["base"] == "iceoryx2"
    assert by["shmbus busy"]["ratio"] == pages.Spread(2.0, 2.0, 3.0, 3)
    assert "ratio" not in by["shmbus default"]  # no peer spins, then blocks
    assert by["shmbus blocking"]["spread"]["calls_per_s"] == pages.Spread(63_000.0, 60_000.0,
                                                                          66_000.0, 3)
    line = next(x for x in rr.table(rows).splitlines() if x.startswith("1->1  shmbus busy"))
    assert "2.00 (2.00-3.00) x iceoryx2" in line and "busy-polls" in line


def test_a_failed_run_fails_its_row_and_gives_no_ratio():
    rows = [rr.summarise(_run("shmbus blocking", [60_000.0, None])),
            rr.summarise(_run("Pipe", [30_000.0, 30_000.0]))]
    rr.add_ratios(rows)
    assert rows[0]["status"] == "failed" and "ratio" not in rows[0]
    assert "failed: boom" in rr.table(rows)


def test_the_plan_pairs_every_shmbus_row_with_a_peer_that_waits_the_same_way():
    plan = rr.plan((32, 4096))
    alone = {("4->4", "shmbus busy")}  # no peer busy-polls with four pairs on 2 cores
    for case, transport, _, size in plan:
        waits = rr.WAITING[transport]
        if (transport.startswith("shmbus") and waits != rr.SPIN_THEN_BLOCK
                and (case, transport) not in alone):
            assert any(rr.WAITING[t] == waits and not t.startswith("shmbus")
                       for c, t, _, s in plan if (c, s) == (case, size)), (case, transport)
    assert {c for c, *_ in rr.plan((32,), only="1->1")} == {"1->1"}
    assert {c for c, *_ in rr.plan((32,), only="udp")} == {"udp 1->1", "udp 4->4"}


def test_the_page_holds_the_table_and_its_percentile_plot(tmp_path: Path):
    rows = [rr.summarise(_run("shmbus blocking", [60_000.0, 66_000.0])),
            rr.summarise(_run("Pipe", [30_000.0, 33_000.0])),
            rr.summarise(_run("shmbus udp", [20_000.0, 21_000.0], "udp 1->1")),
            rr.summarise(_run("zmq DEALER/ROUTER tcp", [10_000.0, 10_500.0], "udp 1->1"))]
    rr.add_ratios(rows)
    page = rr.write_report_page(tmp_path, pages.started(["--page", str(tmp_path)]), rows, 2,
                                1.5)
    text = page.read_text()
    assert page == tmp_path / "request_reply.md"
    assert text.startswith("# Request/reply")
    assert "![round trips](request_reply.png)" in text
    assert (tmp_path / "request_reply.png").stat().st_size > 0
    assert "| 1->1 | shmbus blocking | blocks |" in text
    assert "2.00 (2.00-2.00) x Pipe" in text


def test_main_writes_the_page_of_a_quick_run(tmp_path: Path):
    assert rr.main(["--quick", "--only", "1->1", "--runs", "1", "--page", str(tmp_path)]) == 0
    text = (tmp_path / "request_reply.md").read_text()
    assert "shmbus busy" in text and "x strongest peer" in text
    assert (tmp_path / "request_reply.png").exists()
