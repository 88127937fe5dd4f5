"""tools/bench/netbridge.py runs end to end: a quick pass over shmbus through two netbridges,
plaintext and authenticated (key=), and pyzmq without and with CURVE on loopback (functional,
untimed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SIDES = ("bridge A", "bridge B", "driver A", "driver B")
SHM, SHM_BATCH = "shmbus offer/messages()", "shmbus offer_many/poll_batch"
ZMQ, ZMQ_CURVE = "zmq PUSH/PULL tcp://", "zmq PUSH/PULL tcp:// CURVE"
ZMQ_PP, ZMQ_PP_CURVE = "zmq PAIR tcp://", "zmq PAIR tcp:// CURVE"
PLAIN, KEYED = "default", "default, key=bench"


def test_quick_netbridge_bench_measures_both_buses_and_zmq(tmp_path: Path) -> None:
    report = tmp_path / "netbridge.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.netbridge", "--quick",
         "--channels", "default,keyed", "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads(report.read_text())
    rows = results["rows"]
    assert results["settings"]["channels"] == {PLAIN: "", KEYED: "key=bench"}

    throughput = {(r["transport"], r["channel"], r["size"]): r for r in rows
                  if r["test"] == "throughput"}
    assert set(throughput) == {
        (t, c, size) for size in (32, 4096)
        for t, c in ((SHM, PLAIN), (SHM_BATCH, PLAIN), (SHM, KEYED), (SHM_BATCH, KEYED),
                     (ZMQ, "-"), (ZMQ_CURVE, "-"))}
    for (transport, channel, _), r in throughput.items():
        assert r["status"] == "ok", r
        assert r["messages"] > 0 and r["msgs_per_s"] > 0 and r["mb_per_s"] > 0
        assert r["cpu_us_per_msg"] > 0  # every process's CPU over the messages
        # every message arrived, in order, its sequence number (and CRC) checked
        assert r["received"] == r["messages"] and r["errors"] == 0, r
        assert r["checks"] == "every byte", r  # batch rows too: head, tail and zeros between
        if transport.startswith("shmbus"):  # each side's bridge and driver accounted
            assert all(r["cores"][side] is not None for side in SIDES), r["cores"]
            # the netbridges sealed the keyed channel's datagrams (its Sealer's counters were
            # there) and refused none; the plaintext channel had no Sealer
            assert r["sealed"] is (channel == KEYED) and r["seal_drops"] == 0, r
        if channel == KEYED:  # against the plaintext twin and zmq CURVE at the same size
            plain = throughput[(transport, PLAIN, r["size"])]
            curve = throughput[(ZMQ_CURVE, "-", r["size"])]
            assert r["x_plain"] == r["msgs_per_s"] / plain["msgs_per_s"]
            assert r["x_curve"] == r["msgs_per_s"] / curve["msgs_per_s"]
        if transport == ZMQ_CURVE:
            assert r["x_plain"] == r["msgs_per_s"] / throughput[(ZMQ, "-", r["size"])][
                "msgs_per_s"]

    pings = {(r["transport"], r["channel"]): r for r in rows if r["test"] == "ping-pong"}
    assert set(pings) == {(SHM, PLAIN), (SHM, KEYED), (ZMQ_PP, "-"), (ZMQ_PP_CURVE, "-")}
    for (transport, channel), r in pings.items():
        assert r["status"] == "ok", r
        assert r["pace"] == "10,000/s" and 0 < r["pings_per_s"] <= 10_000 * 1.05
        assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"] and r["round_trips"] > 0
        assert r["echoed"] == r["pings"] > 0 and r["errors"] == 0, r  # every echo checked
        assert r["checks"] == "every byte", r
        if transport == SHM:
            assert r["sealed"] is (channel == KEYED) and r["seal_drops"] == 0, r
    keyed_pp = pings[(SHM, KEYED)]
    assert keyed_pp["x_plain"] == keyed_pp["p50_us"] / pings[(SHM, PLAIN)]["p50_us"]
    assert keyed_pp["x_curve"] == pings[(ZMQ_PP_CURVE, "-")]["p50_us"] / keyed_pp["p50_us"]

    # the authenticated targets were measured (pass or fail: the figures are not the test's)
    targets = {t["target"]: t for t in results["targets"]}
    for name in ("32 B shmbus offer/messages() >= 0.7x plaintext [default, key=bench]",
                 "4 KiB shmbus offer_many/poll_batch >= 0.7x plaintext [default, key=bench]",
                 "32 B shmbus offer/messages() >= 3x zmq CURVE [default, key=bench]",
                 "4 KiB shmbus offer/messages() >= 3x zmq CURVE [default, key=bench]",
                 "ping-pong p50 <= 1.2x plaintext [default, key=bench]"):
        assert targets[name]["status"] in ("PASS", "FAIL"), targets[name]

    # the summary table, each figure from the rows above
    shm = throughput[(SHM, PLAIN, 32)]
    line = next(x for x in done.stdout.splitlines()
                if x.startswith("| shmbus over two netbridges: offer/messages() [default] |"))
    assert f"| {pings[(SHM, PLAIN)]['p50_us']:,.1f} at 10,000/s |" in line
    assert line.endswith(" / ".join(f"{shm['cores'][side]:.0%}" for side in SIDES) + " |")
    # the authenticated channels' table: plaintext, keyed, their ratio, keyed over CURVE
    # and the CPU per message of each
    keyed = throughput[(SHM, KEYED, 32)]
    line = next(x for x in done.stdout.splitlines()
                if x.startswith("| 32 B msg/s: shmbus offer/messages() |"))
    assert line.endswith(f" | {keyed['x_plain']:.2f} | {keyed['x_curve']:.2f} | "
                         f"{shm['cpu_us_per_msg']:.2f} / {keyed['cpu_us_per_msg']:.2f} |"), line
    line = next(x for x in done.stdout.splitlines()
                if x.startswith("| RTT p50 us (32 B at 10,000/s): shmbus offer/messages() |"))
    assert line.endswith(f" | {keyed_pp['p50_us']:,.1f} | {keyed_pp['x_plain']:.2f} | "
                         f"{keyed_pp['x_curve']:.2f} | - |"), line
