"""The driver against a client process of the same user that writes garbage commands and
scribbles on cnc.dat (tests/support/workers/fuzz_workers.py), while a publisher and a subscriber
on the same bus stream: the driver neither dies nor hangs, counts and logs every bad command,
and the stream arrives exact (sequence numbers and checksums checked by the subscriber).
"""

from __future__ import annotations

import os
import re

import pytest

import shmbus
from shmbus.driver.system_counters import SystemCounter
from shmbus.shm.counters import CLIENT_HEARTBEAT
from shmbus.shm.error_log import read_error_log
from tests.support.drivers import system_counter
from tests.support.processes import CTX, assert_clean
from tests.support.waits import wait_until
from tests.support.workers import driver_workers as dw
from tests.support.workers import fuzz_workers as fw

#: Commands the fuzzer writes (about 10 s here; raise it to fuzz longer).
FUZZ_COMMANDS = int(os.environ.get("SHMBUS_FUZZ_COMMANDS", 20_000))

pytestmark = pytest.mark.timeout(300)


def test_driver_survives_a_client_writing_garbage_commands(bus_context, driver, procs):
    stream, writer = 41, 1
    procs.start(dw.subscriber, bus_context, "aeron:ipc", stream, "sub", None, procs.queue,
                240.0, writers={writer})
    procs.wait("sub-ready")
    start, stop = CTX.Event(), CTX.Event()
    procs.start(dw.publisher, bus_context, "aeron:ipc", stream, writer, None, start,
                procs.queue, 240.0, stop=stop)
    procs.wait("pub-ready")
    with shmbus.connect(bus_context) as bus:
        protected = {c.registration_id for c in bus.counters.counters()
                     if c.type_id == CLIENT_HEARTBEAT}
        errors_before = system_counter(bus, SystemCounter.ERRORS)
    assert len(protected) == 3

    start.set()
    procs.start(fw.command_fuzzer, bus_context, 20250611, FUZZ_COMMANDS, protected, stream,
                procs.queue, 200.0)
    (fuzz,) = procs.wait("fuzz", timeout=210)
    stop.set()
    (published,) = procs.wait("pub", timeout=30)
    (received,) = procs.wait("sub", timeout=30)

    assert driver.poll() is None, "the driver died"
    assert_clean(received)
    assert received["counts"] == {writer: published["sent"]}
    assert received["finished"] == [writer] and received["gaps"] == []
    assert published["sent"] > 1000, "the stream ran during the fuzzing"
    stats = fuzz["stats"]
    assert sum(stats.values()) == FUZZ_COMMANDS
    assert set(stats) >= {*fw.KINDS, "scribbled-length"}, stats

    # every command that cannot be right was refused and counted; none tripped a bug
    def served() -> bool:  # a new client works once the fuzzer's last commands are read
        try:
            with shmbus.connect(bus_context) as bus:
                sub = bus.add_subscription("aeron:ipc", 42)
                pub = bus.add_exclusive_publication("aeron:ipc", 42)
                pub.publish(b"after the fuzzing", timeout=5)
                return list(sub.messages(timeout=2)) == [b"after the fuzzing"]
        except shmbus.ShmbusError:
            return False

    wait_until(served, 30, "a new client to be served")
    with shmbus.connect(bus_context) as bus:
        errors = system_counter(bus, SystemCounter.ERRORS) - errors_before
        observations = read_error_log(bus.cnc.section(4))
    certain = stats["garbage"] + stats["unknown-type"] + stats["huge"]
    assert errors >= certain // 2, (errors, stats)
    texts = [o.text for o in observations]
    for expected in (r"unknown message type", r"unknown client", r"overruns|unpack",
                     r"stream_id 0 is reserved|unknown media|must start with"):
        assert any(re.search(expected, t) for t in texts), (expected, texts[:20])
    assert not [t for t in texts if "Traceback" in t or "\n  File " in t], \
        "an error reached the conductor's last-resort handler (a bug)"
