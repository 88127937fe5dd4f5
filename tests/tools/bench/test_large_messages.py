"""tools/bench/large_messages.py: a quick run of every row end to end (every array written
whole and summed by every reader), its page and plot; the check that catches one wrong
element; hand-overs that cannot be negative."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tools.bench import large_messages
from tools.bench.harness import BenchError

ROOT = Path(__file__).resolve().parents[3]


def test_a_quick_run_measures_every_row_and_writes_its_page(tmp_path: Path) -> None:
    out, page = tmp_path / "large.json", tmp_path / "page"
    result = subprocess.run(
        [sys.executable, "-m", "tools.bench.large_messages", "--quick", "--sizes", "1",
         "--out", str(out), "--page", str(page)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert {r["method"] for r in rows} == {r.key for r in large_messages.ROWS}
    for row in rows:
        assert row["mib"] == 1 and row["readers"] == 2 and row["runs"] == 2, row
        if row["errors"]:  # a peer may be n/a, with the reason; shmbus never
            assert not row["method"].startswith("shmbus"), row
        ran = [v for v in row["gb_s_runs"] if v is not None]
        assert len(ran) + len(row["errors"]) == 2, row
        if row["method"].startswith("shmbus"):
            assert len(ran) == 2, row
        assert all(v > 0 for v in ran), row
        for figure in ("p50_us", "max_us", "first_ms"):
            assert all(v >= 0 for v in row[f"{figure}_runs"] if v is not None), (figure, row)
    text = (page / "large_messages.md").read_text()
    assert text.startswith("# Large messages: tools/bench/large_messages.py\n")
    assert "python -m tools.bench.large_messages --quick --sizes 1 --out" in text
    assert "## Targets" in text and "](large_messages.png)" in text
    for row in large_messages.ROWS:
        assert f"| {row.name}" in text, row.name
    assert (page / "large_messages.png").stat().st_size > 0


def test_the_check_fails_on_one_wrong_element() -> None:
    n, seq = 1 << 16, 7
    array = np.empty(n, large_messages.DTYPE)
    large_messages.fill(array, large_messages.ramp(n), seq)
    large_messages.check(array, n, seq)
    for index, flipped in ((0, 1), (n // 2, 1 << 63), (n - 1, (1 << 64) - 1)):
        corrupt = array.copy()
        corrupt[index] ^= large_messages.DTYPE(flipped)  # one element, some of its bits
        with pytest.raises(BenchError, match=f"array {seq}: sum"):
            large_messages.check(corrupt, n, seq)
    with pytest.raises(BenchError, match="array 8: sum"):  # the previous array, stale
        large_messages.check(array, n, seq + 1)


def test_a_reader_holding_an_array_before_its_stamp_is_a_measurement_error() -> None:
    assert large_messages.latencies_us([1_000, 5_000], [3_000, 5_000]) == [2.0, 0.0]
    with pytest.raises(BenchError, match="array 1: held 1.0 us before"):
        large_messages.latencies_us([1_000, 5_000], [3_000, 4_000])
