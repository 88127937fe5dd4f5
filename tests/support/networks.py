"""Buses joined by their netbridges: free ports, two buses on this host with their drivers,
the netbridge a driver started, and channel counters.

Hosts as Linux network namespaces (``ip netns``) are tools/bench/network.py's, the one copy
(tools/ import nothing from tests/): :func:`hosts` and :func:`host_buses` are re-exported here
so that a test finds every network helper in one place.
"""

from __future__ import annotations

import subprocess
import zlib
from pathlib import Path
from typing import Any

import psutil

import shmbus
from tests.support.drivers import start_driver, stop_driver
from tests.support.waits import wait_until
from tests.support.workers.bridge_workers import message
from tools.bench.network import Host, free_udp_ports, host_buses, hosts

__all__ = ["Host", "Reader", "bridge_pid", "bus_pair", "channel_counters", "free_udp_port",
           "free_udp_ports", "host_buses", "hosts", "stop_drivers"]


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 now."""
    return free_udp_ports(1)[0]


def bus_pair(root: Path, loss: str | tuple[str, str] = "", **settings: Any
             ) -> tuple[list[shmbus.Context], list[subprocess.Popen[bytes]]]:
    """Buses "a" and "b" under ``root`` (1 MiB IPC terms, ``settings`` on both), each with a
    driver process serving it: ([context a, context b], [driver a, driver b]). ``loss`` is the
    netbridges' loss filter, one for both or (a's, b's). The caller stops the drivers
    (:func:`stop_drivers`)."""
    losses = (loss, loss) if isinstance(loss, str) else loss
    contexts = [shmbus.Context(**{"dir": str(root / name), "embedded_driver": False,
                                  "driver_idle_timeout": 600, "netbridge_loss": lost,
                                  "ipc_term_length": 1 << 20, **settings})
                for name, lost in zip(("a", "b"), losses, strict=True)]
    drivers = []
    try:
        for context in contexts:
            drivers.append(start_driver(context))
    except BaseException:
        stop_drivers(drivers)
        raise
    return contexts, drivers


def stop_drivers(drivers: list[subprocess.Popen[bytes]]) -> None:
    """Stop every driver of ``drivers`` (each stops its netbridge)."""
    for process in drivers:
        stop_driver(process)


def channel_counters(context: shmbus.Context) -> dict[str, int]:
    """The netbridge's channel counters on the bus of ``context`` by name ("datagrams sent",
    "naks received", ...), through a client of its own."""
    with shmbus.connect(context) as bus:
        return {c.label.split(":")[0]: c.value for c in bus.counters.counters()
                if c.type_id >= 100}


def bridge_pid(driver: Any, timeout: float = 30.0) -> int:
    """The pid of the netbridge the driver process ``driver`` started (its only python
    child), once it runs."""
    def netbridge() -> int | None:
        for child in psutil.Process(driver.pid).children():
            if "netbridge" in " ".join(child.cmdline()):
                return child.pid
        return None

    return wait_until(netbridge, timeout, "the driver to start its netbridge")


class Reader:
    """Polls a subscription and checks each message's sequence and crc32 (the messages of
    ``bridge_workers.message``)."""

    def __init__(self, subscription: shmbus.Subscription) -> None:
        self.subscription = subscription
        self.sequences: list[int] = []
        self.bad = 0
        self.assembler = shmbus.FragmentAssembler(self._on_message)

    def _on_message(self, buffer: memoryview, header: shmbus.Header) -> None:
        data = bytes(buffer)
        sequence = int.from_bytes(data[:8], "little")
        if zlib.crc32(data[12:]) != int.from_bytes(data[8:12], "little") or (
                data != message(sequence)):
            self.bad += 1
        self.sequences.append(sequence)

    def poll(self) -> int:
        return self.subscription.poll(self.assembler, 256)
