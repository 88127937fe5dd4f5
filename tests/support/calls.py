"""Request/reply helpers (shmbus/calls/): counters summed by stream, requesters' reports
checked, calling threads and a responder killed under them, two buses serving calls over UDP,
and requesters that learn of a departed responder only from the driver."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import shmbus
from tests.support.networks import bus_pair, free_udp_port, stop_drivers
from tests.support.sleepers import subscription_sleepers
from tests.support.waits import wait_until

#: the stream of the request/reply tests
STREAM = 5001
#: the client liveness timeout of :func:`bus_pair_serving`'s buses
LIVENESS = 2.0
#: a publication's connection times out this long after the last status message: far past
#: the liveness timeout, so a call that fails within that learned it from the responders'
#: netbridge (a status message with the EOS flag), not from this timeout
CONNECTION_TIMEOUT = 60.0


def counter_total(bus: shmbus.Client, type_id: int, stream_id: int = STREAM) -> int:
    """The sum of the live counters of ``type_id`` on ``stream_id`` (label ``... 0 0 <stream>``)."""
    total = 0
    reader = bus.counters

    def visit(counter_id: int, type_: int, key: bytes, label: str) -> None:
        nonlocal total
        if type_ == type_id and label.split()[3] == str(stream_id):
            total += reader.get_value(counter_id)

    reader.for_each(visit)
    return total


def calls_answered(reports: list[dict[str, Any]], pids: set[int]) -> int:
    """The calls the requesters' reports say were answered, each report checked: no reply
    wrong or missing, nothing left in flight, every answer from one of ``pids``."""
    answered = 0
    for report in reports:
        assert report["problem_count"] == 0, report["problems"]
        assert report["in_flight"] == 0
        assert set(report["by_pid"]) <= pids
        answered += sum(report["by_pid"].values())
    return answered


def no_backstop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits of this process's requesters look again only after 60 s: a call that fails
    sooner learned of its departed responder from the driver's wake-up, not from a timer."""
    from shmbus.calls import requester

    monkeypatch.setattr(requester, "_BACKSTOP_S", 60.0)
    monkeypatch.setattr(requester, "_IN_FLIGHT_AFTER_S", 60.0)


def calling_threads(client: shmbus.Requester, outcomes: dict[str, Any],
                    requests: dict[str, bytes], async_request: bytes | None = None
                    ) -> list[threading.Thread]:
    """A thread (not started) per named request() and, with ``async_request``, one making
    it with request_async() on its own event loop ("async"): each leaves its reply or its
    error in ``outcomes`` under its name."""

    def call(name: str, request: bytes) -> None:
        try:
            outcomes[name] = client.request(request, timeout=60)
        except BaseException as error:
            outcomes[name] = error

    def call_async(request: bytes) -> None:
        try:
            outcomes["async"] = asyncio.run(client.request_async(request, timeout=60))
        except BaseException as error:
            outcomes["async"] = error

    threads = [threading.Thread(target=call, args=item) for item in requests.items()]
    if async_request is not None:
        threads.append(threading.Thread(target=call_async, args=(async_request,)))
    return threads


@contextlib.contextmanager
def bus_pair_serving(root: Path, **settings: Any) -> Iterator[Any]:
    """(context of bus A, context of bus B, the service channel on B's endpoint, the two
    driver processes), the drivers stopped after."""
    (ctx_a, ctx_b), drivers = bus_pair(root, **{
        "client_liveness_timeout": LIVENESS, "keepalive_interval": 0.1,
        "timer_interval": 0.02, "publication_connection_timeout": CONNECTION_TIMEOUT,
        **settings})
    try:
        yield ctx_a, ctx_b, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}", drivers
    finally:
        stop_drivers(drivers)


def kill_with_every_caller_asleep(client: shmbus.Requester, callers: list[threading.Thread],
                                  in_flight: int, victim_pid: int) -> float:
    """Wait until ``in_flight`` calls are in flight on ``client`` and every caller of
    ``callers`` (started threads of :func:`calling_threads`) is asleep: following on the
    requester, or counted as a sleeper of the replies' log (the one holding the reader's turn,
    the asyncio reader); then SIGKILL the responder ``victim_pid`` and join the callers (each
    must end within 30 s). The seconds from the kill until the last caller ended."""
    wait_until(lambda: client.in_flight == in_flight, 10, f"{in_flight} calls in flight")
    wait_until(lambda: client._followers + subscription_sleepers(client._replies)
               == len(callers), 10,
               lambda: f"every caller asleep ({client._followers} following, "
                       f"{subscription_sleepers(client._replies)} on the replies' log)")
    os.kill(victim_pid, signal.SIGKILL)
    killed_at = time.monotonic()
    for caller in callers:
        caller.join(timeout=30)
        assert not caller.is_alive()
    return time.monotonic() - killed_at
