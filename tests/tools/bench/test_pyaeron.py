"""tools/bench/pyaeron.py runs end to end on the project's Python: shmbus measured, pyaeron
n/a when this Python cannot run it (untimed)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PYAERON_RUNS = sys.version_info >= (3, 12) and subprocess.run(
    [sys.executable, "-c", "import pyaeron"], capture_output=True).returncode == 0


def test_quick_bench_measures_shmbus_and_says_whether_pyaeron_ran(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "tools.bench.pyaeron", "--quick", "--page",
                           str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split(" | ")[0].lstrip("| "): [c.strip(" |") for c in line.split(" | ")[1:]]
            for line in done.stdout.splitlines() if line.startswith("| ")}
    assert rows["figure"] == ["shmbus publish()/messages()", "pyaeron offer()/poll()",
                              "pyaeron offer()/poll(), term 1 MiB", "shmbus / faster pyaeron"]
    for size in ("32 B", "256 B", "4 KiB"):
        shmbus, pyaeron, pyaeron_1m, ratio = rows[f"{size} msg/s (lowest-highest)"]
        assert re.fullmatch(r"[\d.]+( [kM])?", shmbus), shmbus  # one run: no spread
        cpu = rows[f"{size} CPU us per message, all processes"]
        assert float(cpu[0]) > 0
        if PYAERON_RUNS:
            assert float(ratio) > 0 and float(cpu[1]) > 0 and float(cpu[2]) > 0
        else:
            assert (pyaeron, pyaeron_1m, ratio) == ("n/a", "n/a", "-")
    p50 = float(rows["RTT p50 us (lowest-highest), 32 B, back to back"][0])
    p99 = float(rows["RTT p99 us, 32 B, back to back"][0])
    assert 0 < p50 <= p99
    # the driver of each bus is accounted in every measurement that ran
    cores = [line for line in done.stdout.splitlines()
             if re.match(r"\| (32 B|256 B|4 KiB|RTT 32 B) \| shmbus ", line)]
    assert len(cores) == 4
    for line in cores:
        assert re.search(r" \| [\d.]+ / [\d.]+ / [\d.]+ \|$", line), line
    if not PYAERON_RUNS:
        assert "pyaeron offer()/poll(): n/a (" in done.stdout
    page = (tmp_path / "pyaeron.md").read_text()
    assert page.startswith("# Beside Aeron's C client") and "(pyaeron.png)" in page
    assert (tmp_path / "pyaeron.png").stat().st_size > 0
