"""tools/bench/netbridge.py runs end to end: a quick pass over shmbus through two netbridges and
pyzmq on loopback (functional, untimed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SIDES = ("bridge A", "bridge B", "driver A", "driver B")


def test_quick_netbridge_bench_measures_both_buses_and_zmq(tmp_path: Path) -> None:
    report = tmp_path / "netbridge.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.netbridge", "--quick",
         "--channels", "default", "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = json.loads(report.read_text())["rows"]

    throughput = {(r["transport"], r["size"]): r for r in rows if r["test"] == "throughput"}
    assert set(throughput) == {(t, size) for size in (32, 4096) for t in (
        "shmbus offer/messages()", "shmbus offer_many/poll_batch", "zmq PUSH/PULL tcp://")}
    for (transport, _), r in throughput.items():
        assert r["status"] == "ok", r
        assert r["messages"] > 0 and r["msgs_per_s"] > 0 and r["mb_per_s"] > 0
        if transport.startswith("shmbus"):  # each side's bridge and driver accounted
            assert all(r["cores"][side] is not None for side in SIDES), r["cores"]

    pings = {r["transport"]: r for r in rows if r["test"] == "ping-pong"}
    assert set(pings) == {"shmbus offer/messages()", "zmq PAIR tcp://"}
    for r in pings.values():
        assert r["status"] == "ok", r
        assert r["pace"] == "10,000/s" and 0 < r["pings_per_s"] <= 10_000 * 1.05
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"] and r["round_trips"] > 0

    # the summary table, each figure from the rows above
    shm = throughput[("shmbus offer/messages()", 32)]
    line = next(x for x in done.stdout.splitlines()
                if x.startswith("| shmbus over two netbridges: offer/messages() [default] |"))
    assert f"| {pings['shmbus offer/messages()']['p50_us']:,.1f} at 10,000/s |" in line
    assert line.endswith(" / ".join(f"{shm['cores'][side]:.0%}" for side in SIDES) + " |")
