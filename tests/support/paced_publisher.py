"""A publisher process that publishes in bursts: between them a reader catches up and goes to
sleep, so each burst must wake it (the tests of sleeping readers)."""

from __future__ import annotations

from typing import Any

import shmbus
from tests.support.processes import CTX, Processes
from tests.support.workers import driver_workers as dw


def publish_in_bursts(procs: Processes, context: shmbus.Context, stream: int, count: int,
                      burst: int) -> dict[str, Any]:
    """Publish ``count`` messages of publisher 1 on IPC stream ``stream`` from a process of
    its own, ``burst`` at a time with 2 ms between bursts (it starts once ready); its report."""
    start = CTX.Event()
    procs.start(dw.publisher, context, "aeron:ipc", stream, 1, count, start, procs.queue,
                60.0, pace_every=burst, pace_sleep=0.002)
    procs.wait("pub-ready")
    start.set()
    (report,) = procs.wait("pub", timeout=60)
    return report
