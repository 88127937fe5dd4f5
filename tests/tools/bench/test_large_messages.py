"""tools/bench/large_messages.py: a short run of every method, checked arrays, one JSON row
per method and reader count (a peer that fails is a row with its error)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tools.bench import large_messages

ROOT = Path(__file__).resolve().parents[3]


def test_a_short_run_measures_every_method(tmp_path: Path) -> None:
    out = tmp_path / "large.json"
    result = subprocess.run(
        [sys.executable, "-m", "tools.bench.large_messages", "--sizes", "0.5", "2",
         "--readers", "1", "2", "--count", "4", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    methods = {(r["method"], r["copy"], r["readers"], r["mib"]) for r in rows}
    for mib in (0.5, 2):
        for readers in (1, 2):
            for method in large_messages.METHODS:
                assert any(m == method and n == readers and s == mib
                           for m, _, n, s in methods), (method, readers, mib)
    for row in rows:
        if "error" in row:  # a peer may be n/a, with the reason; shmbus never
            assert not row["method"].startswith("shmbus") and row["error"], row
            continue
        assert row["count"] == 4 and row["gb_s"] > 0 and row["p50_us"] == row["p50_us"]
        assert row["first_ms"] == row["first_ms"] and row["peak_shm_mib"] >= 0
