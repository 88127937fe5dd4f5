"""tools/bench/late_join.py runs end to end in a quick pass with every message of every row
checked byte for byte, and its check finds a single wrong byte (untimed: the figures are the
benchmark's, not the test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import late_join as lj
from tools.bench.harness import BenchError

ROOT = Path(__file__).resolve().parents[3]


def test_the_check_passes_every_published_message():
    block = lj.rows(1_000, 64)
    assert [lj.check(row.tobytes()) for row in block] == list(range(1_000, 1_064))


@pytest.mark.parametrize("index", range(lj.SIZE))
def test_the_check_finds_a_wrong_byte_anywhere_in_a_message(index: int):
    message = bytearray(lj.rows(77, 1)[0].tobytes())
    message[index] ^= 0x01
    with pytest.raises(BenchError):
        lj.check(bytes(message))


def test_the_check_finds_a_short_or_zeroed_message():
    message = lj.rows(5, 1)[0].tobytes()
    with pytest.raises(BenchError):
        lj.check(message[:-1])
    with pytest.raises(BenchError):
        lj.check(message[:16] + bytes(lj.SIZE - 16))


@pytest.mark.timeout(120)
def test_a_quick_run_checks_every_message_of_every_row(tmp_path: Path):
    out = tmp_path / "late_join.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.late_join", "--quick", "--runs", "2", "--json",
         str(out), "--page", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())
    runs = summary["runs"]
    assert len(runs) == 2
    for run in runs:
        assert run["reader"]["checked"] == run["reader"]["messages"] > 0
        assert run["late_join"]["checked"] > run["late_join"]["replayed"] > 0
        assert run["late_join"]["missing"] == run["late_join"]["duplicated"] == 0
        assert run["by_hand"]["checked"] > 0 and run["live_first"]["checked"] > 0
    assert summary["catch_up_vs_reader"]["runs"] == 2
    page = (tmp_path / "late_join.md").read_text()
    assert page.startswith("# Late joiners") and "![rates](late_join.png)" in page
    assert "checks every byte" in page and (tmp_path / "late_join.png").exists()
