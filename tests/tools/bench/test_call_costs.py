"""tools/bench/call_costs.py runs end to end and gives a cost for every per-message path."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PATHS = {"publish() 32 B", "messages() 32 B", "offer() 32 B", "poll(handler) + bytes 32 B",
         "publish_many([m]) 32 B", "poll(handler) reading Header 32 B",
         "poll_batch 32 B (per message)", "publish() 4 KiB",
         "poll(FragmentAssembler) + bytes 4 KiB", "group messages() 32 B",
         "group poll(handler) + bytes 32 B", "request() 32 B, reply there (requester alone)",
         "submit() 32 B", "responder poll() 32 B per request (echo)",
         "Call.result() 32 B, reply there"}


def test_every_path_has_a_cost_per_call() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.call_costs", "--messages", "256", "--rounds", "2",
         "--runs", "1", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout)
    assert set(figures) == PATHS
    assert all(ns > 0 for ns in figures.values()), figures
