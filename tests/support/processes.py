"""Spawned client processes and the reports they send back.

Every client process of a test is started with the "spawn" context (a fresh interpreter: no
state inherited from the test process) and gets its arguments pickled; its target is a
function of a module under tests/support/workers/, which the child imports by its module path
(``tests.support.workers...``). It reports on a queue: dicts whose ``kind`` says which
report, or ``exception`` when it failed. The ``procs`` fixture (tests/conftest.py) gives a
test a :class:`Processes`, every process killed after the test.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from collections.abc import Callable
from typing import Any

import pytest

CTX = mp.get_context("spawn")


class Reports:
    """Reports that spawned processes put on one queue (dicts; ``kind`` says which report)."""

    def __init__(self, started: list[Any]) -> None:
        self.queue: Any = CTX.Queue()
        self._started = started
        self._pending: list[dict[str, Any]] = []

    def _exit_codes(self) -> list[tuple[str, int | None]]:
        return [(p.name, p.exitcode) for p in self._started]

    def _receive(self, timeout: float) -> bool:
        try:
            report = self.queue.get(timeout=timeout) if timeout > 0 else self.queue.get_nowait()
        except queue.Empty:
            return False
        if "exception" in report:
            pytest.fail(f"{report['name']} failed: {report['exception']}")
        self._pending.append(report)
        return True

    def _take(self, kind: str, n: int) -> list[dict[str, Any]] | None:
        matching = [r for r in self._pending if r["kind"] == kind]
        if len(matching) < n:
            return None
        taken = matching[:n]
        self._pending = [r for r in self._pending if not any(r is t for t in taken)]
        return taken

    def poll(self, kind: str) -> dict[str, Any] | None:
        """A report of ``kind`` if one has arrived, without waiting."""
        while self._receive(0):
            pass
        taken = self._take(kind, 1)
        return taken[0] if taken else None

    def wait(self, kind: str, n: int = 1, timeout: float = 30.0,
             between: Callable[[], Any] | None = None) -> list[dict[str, Any]]:
        """``n`` reports of ``kind`` within ``timeout`` s; ``between()`` runs every ~2 ms."""
        deadline = time.monotonic() + timeout
        while True:
            taken = self._take(kind, n)
            if taken is not None:
                return taken
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                pytest.fail(f"{kind!r}: fewer than {n} reports within {timeout} s; exit codes "
                            f"{self._exit_codes()}")
            if not self._receive(min(remaining, 0.002 if between else 0.2)):
                if between is not None:
                    between()
                elif all(not p.is_alive() for p in self._started) and not self._receive(1.0):
                    pytest.fail(f"{kind!r}: every process exited; exit codes "
                                f"{self._exit_codes()}")


class Processes(Reports):
    """Spawned client processes, reporting on ``queue``.

    A process the test kills gets a queue of its own (``private()``): a process killed while
    its queue's feeder thread holds the queue's shared write lock would block every other
    writer of that queue for good.
    """

    def __init__(self) -> None:
        self.started: list[Any] = []
        super().__init__(self.started)

    def private(self) -> Reports:
        return Reports(self.started)

    def start(self, target: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        process = CTX.Process(target=target, args=args, kwargs=kwargs, daemon=True)
        process.start()
        self.started.append(process)
        return process

    def close(self) -> None:
        for process in self.started:
            if process.is_alive():
                process.kill()
            process.join(10)


def assert_clean(report: dict[str, Any]) -> None:
    """A reading process's report (``driver_workers.Checker``'s summary) found every message
    whole and in order, and the process did not run out of time."""
    assert report["error_count"] == 0, report["errors"]
    assert not report.get("timed_out"), f"{report.get('name')} timed out: {report['count']}"


def subscribe_then_publish(subscriber: Callable[..., Any], subscriber_args: tuple[Any, ...],
                           publisher: Callable[..., Any], publisher_args: tuple[Any, ...],
                           publishers: int = 1, timeout: float = 170.0
                           ) -> tuple[Any, list[Any]]:
    """Run ``subscriber(*subscriber_args, ready)`` in a spawned process of a pool and, once it
    set the Event ``ready`` (30 s at most), ``publishers`` processes running
    ``publisher(*publisher_args)``: (what the subscriber returned, what each publisher
    returned), each waited for ``timeout`` seconds at most."""
    with CTX.Pool(publishers + 1) as pool:
        ready = CTX.Manager().Event()
        subscribing = pool.apply_async(subscriber, (*subscriber_args, ready))
        assert ready.wait(30), "the subscriber was not ready in 30 s"
        publishing = [pool.apply_async(publisher, publisher_args) for _ in range(publishers)]
        return (subscribing.get(timeout),
                [publication.get(timeout) for publication in publishing])
