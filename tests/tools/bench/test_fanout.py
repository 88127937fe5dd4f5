"""tools/bench/fanout.py runs end to end: a quick pass of unicast and multicast to network
namespaces (needs root, as the netbridge namespace tests do; functional, untimed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_quick_fanout_bench_delivers_everything_to_every_receiver(tmp_path: Path) -> None:
    report = tmp_path / "fanout.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.fanout", "--quick", "--sizes", "32",
         "--configs", "unicast,multicast", "--subnet", "232", "--json", str(report)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    rows = {r["config"]: r for r in json.loads(report.read_text())["rows"]}
    assert set(rows) == {"unicast", "multicast"}
    for r in rows.values():
        assert r["status"] == "ok", r
        assert r["messages"] > 0 and r["msgs_per_s"] > 0
        assert len(r["bridge_cpu_s"]) == 3
        assert r["checks"] == "every byte"
    assert rows["unicast"]["receivers"] == 1 and rows["multicast"]["receivers"] == 2
    assert rows["unicast"]["x_unicast"] == 1.0
    assert rows["multicast"]["delivered_mb_per_s"] == 2 * rows["multicast"]["mb_per_s"]
    line = next(x for x in done.stdout.splitlines() if x.startswith("multicast "))
    assert line.split()[:3] == ["multicast", "2", "32"] and line.endswith("ok, every byte")
