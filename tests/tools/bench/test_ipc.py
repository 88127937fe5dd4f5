"""tools/bench/ipc.py runs end to end: a quick pass over shmbus and mp.Queue (untimed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tools.bench.report import fmt_rate

ROOT = Path(__file__).resolve().parents[3]


def quick_bench(out: Path, only: str, sizes: str) -> list[dict[str, Any]]:
    """The rows of a quick pass of tools/bench/ipc.py over the transports ``only`` names at
    ``sizes``, its files written to ``out``; fails the test if the bench fails."""
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.ipc", "--quick", "--only", only, "--sizes", sizes,
         "--json", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows: list[dict[str, Any]] = json.loads(done.stdout)["rows"]
    return rows


def test_quick_bench_measures_shmbus_and_a_peer_without_errors(tmp_path: Path) -> None:
    rows = quick_bench(tmp_path, "shmbus,mp.Queue", "4096")

    throughput = [r for r in rows if r["test"] == "throughput"]
    assert {(r["transport"], r["size"]) for r in throughput} == {
        (t, size) for t in ("shmbus publish()/messages()", "shmbus offer()/poll(handler)",
                            "shmbus messages() drained", "shmbus no-copy", "shmbus batch",
                            "mp.Queue")
        for size in (4096,)}
    for r in throughput:
        assert r["status"] == "ok", r
        assert r["msgs_per_s"] > 0 and r["mb_per_s"] > 0 and r["messages"] > 0
        assert r["errors"] == 0
        assert r["cores"]["writer"] > 0 and r["cores"]["reader"] > 0
        assert r["samples"]["msgs_per_s"] == [r["msgs_per_s"]]  # one run: its own spread
        if r["transport"].startswith("shmbus"):  # the embedded driver is accounted too
            assert r["cores"]["driver"] is not None

    rtt = {(r["transport"], r["rate"], r["wait"]): r for r in rows if r["test"] == "rtt"}
    for key in (("shmbus publish()/messages()", "back-to-back", "blocking wait, no spin"),
                ("shmbus publish()/messages()", "back-to-back", "blocking wait"),
                ("shmbus publish()/messages()", "1,000 msg/s", "blocking wait"),
                ("shmbus offer()/poll()", "back-to-back", "busy-spin"),
                ("mp.Queue", "back-to-back", "blocking"),
                ("shmbus offer()/poll()", "1,000 msg/s", "back-off (default)"),
                ("shmbus offer()/poll()", "1,000 msg/s", "asyncio await")):
        r = rtt[key]
        assert r["status"] == "ok", r
        assert 0 < r["p50_us"] <= r["p90_us"] <= r["p99_us"] <= r["max_us"]
        assert r["round_trips"] > 0 and r["errors"] == 0
        assert r["cores"]["ponger"] is not None

    idle = [r for r in rows if r["test"] == "idle"]
    assert {r["wait"] for r in idle} == {"back-off (default)", "blocking wait", "asyncio await"}
    for r in idle:
        assert r["status"] == "ok", r
        assert r["cores"]["subscriber"] is not None and r["cores"]["driver"] is not None

    lines = (tmp_path / "bench.md").read_text().splitlines()
    mine = next(r for r in throughput if r["transport"] == "shmbus publish()/messages()")
    queue = next(r for r in throughput if r["transport"] == "mp.Queue")
    summary = next(line for line in lines if line.startswith("| shmbus publish()/messages() |"))
    assert summary == f"| shmbus publish()/messages() | {fmt_rate(mine['msgs_per_s'])} |"
    ratio = next(line for line in lines if line.startswith("| shmbus publish()/messages() / best"))
    assert ratio.endswith(f"| {mine['msgs_per_s'] / queue['msgs_per_s']:.2f}x |")
    sleeping = rtt[("shmbus publish()/messages()", "back-to-back", "blocking wait, no spin")]
    like = next(line for line in lines if "| blocking wait, no spin |" in line)
    assert f"| {sleeping['p50_us']:.1f} |" in like and "(mp.Queue)" in like
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert json.loads((tmp_path / "bench.json").read_text())["rows"] == rows


def test_the_page_has_a_dated_head_and_its_plot(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.ipc", "--quick", "--only", "shmbus publish",
         "--sizes", "32", "--out", str(tmp_path / "out"), "--page", str(tmp_path / "page")],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    page = (tmp_path / "page" / "ipc.md").read_text()
    assert page.startswith("# One host: tools/bench/ipc.py\n\nRun 20")
    assert "python -m tools.bench.ipc --quick --only 'shmbus publish' --sizes 32 --out" in page
    assert "--page" not in page and "![" in page and "(ipc.png)" in page
    assert (tmp_path / "page" / "ipc.png").stat().st_size > 0


def test_the_zenoh_peer_carries_every_message_checked_both_ways(tmp_path: Path) -> None:
    rows = [r for r in quick_bench(tmp_path, "zenoh", "256") if r["test"] != "idle"]
    assert {(r["test"], r.get("rate")) for r in rows} == {
        ("throughput", None), ("rtt", "back-to-back"), ("rtt", "1,000 msg/s")}
    for r in rows:
        assert r["transport"] == "zenoh pub/sub tcp loopback"
        assert r["status"] == "ok" and r["errors"] == 0, r
        assert r.get("messages", r.get("round_trips", 0)) > 0
