"""A loop over a stream's messages never ends as if the stream had when the client failed:
the driver timed the reader out (it was stopped past client_liveness_timeout), and the loop
raises ClientTimeoutError once the reader runs again."""

from __future__ import annotations

import os
import signal

import numpy as np
import psutil
import pytest

import shmbus
from shmbus.shm.counters import CLIENT_HEARTBEAT
from tests.support.waits import wait_until
from tests.support.workers import failure_workers as fw


@pytest.mark.parametrize("kind", ["views", "arrays", "views_async", "group"])
def test_a_loop_of_a_timed_out_reader_raises(bus_context, driver, procs, kind: str) -> None:
    reader = procs.start(fw.stopped_mid_loop, bus_context, kind, procs.queue)
    procs.wait("ready")
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_exclusive_publication("aeron:ipc", fw.STREAM)
        wait_until(lambda: publication.is_connected, 30, "the reader's image")
        publication.publish_array(np.arange(4))
        wait_until(lambda: psutil.Process(reader.pid).status() == psutil.STATUS_STOPPED, 30,
                   "the reader to stop itself")
        wait_until(lambda: not any(c.type_id == CLIENT_HEARTBEAT and f"pid={reader.pid}" in c.label
                                   for c in bus.counters.counters()),
                   30, "the driver to time the stopped reader out")
        os.kill(reader.pid, signal.SIGCONT)
        assert procs.wait("outcome", timeout=30)[0]["outcome"] == "ClientTimeoutError"
