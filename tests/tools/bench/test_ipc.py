"""tools/bench/ipc.py runs end to end: a quick pass over shmbus and mp.Queue (untimed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
        (t, size) for t in ("shmbus publish()", "shmbus offer()", "shmbus poll(handler)",
                            "shmbus no-copy", "shmbus batch", "mp.Queue")
        for size in (4096,)}
    for r in throughput:
        assert r["status"] == "ok", r
        assert r["msgs_per_s"] > 0 and r["mb_per_s"] > 0 and r["messages"] > 0
        assert r["errors"] == 0
        assert r["cores"]["writer"] > 0 and r["cores"]["reader"] > 0
        if r["transport"].startswith("shmbus"):  # the embedded driver is accounted too
            assert r["cores"]["driver"] is not None

    rtt = {(r["transport"], r["rate"], r["wait"]): r for r in rows if r["test"] == "rtt"}
    for key in (("shmbus publish()", "back-to-back", "blocking wait"),
                ("shmbus publish()", "1,000 msg/s", "blocking wait"),
                ("shmbus offer()", "back-to-back", "busy-spin"),
                ("mp.Queue", "back-to-back", "blocking"),
                ("shmbus offer()", "1,000 msg/s", "back-off (default)"),
                ("shmbus offer()", "1,000 msg/s", "asyncio await")):
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

    markdown = (tmp_path / "bench.md").read_text()
    blocking = rtt[("shmbus publish()", "1,000 msg/s", "blocking wait")]
    back_to_back = rtt[("shmbus publish()", "back-to-back", "blocking wait")]
    lines = markdown.splitlines()
    summary = next(line for line in lines if line.startswith("| shmbus "))
    assert summary.startswith("| shmbus publish()/messages(), copied + checked |")
    assert f"| {back_to_back['p50_us']:.1f} / {back_to_back['p99_us']:.1f} |" in summary
    assert f"| {blocking['p50_us']:.1f} / {blocking['cores']['ponger']:.1%} |" in summary
    assert (tmp_path / "bench.png").stat().st_size > 0
    assert json.loads((tmp_path / "bench.json").read_text())["rows"] == rows


def test_the_zenoh_peer_carries_every_message_checked_both_ways(tmp_path: Path) -> None:
    rows = [r for r in quick_bench(tmp_path, "zenoh", "256") if r["test"] != "idle"]
    assert {(r["test"], r.get("rate")) for r in rows} == {
        ("throughput", None), ("rtt", "back-to-back"), ("rtt", "1,000 msg/s")}
    for r in rows:
        assert r["transport"] == "zenoh pub/sub tcp loopback"
        assert r["status"] == "ok" and r["errors"] == 0, r
        assert r.get("messages", r.get("round_trips", 0)) > 0
