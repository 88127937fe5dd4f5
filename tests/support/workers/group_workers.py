"""Spawn targets for tests/shmbus/streams/test_subscription_group.py: publishers and group members.

Every function runs in a process of its own (multiprocessing "spawn"), connects to the test
bus with the Context it is given and reports through a multiprocessing queue. Loops are
bounded by deadlines and idle with back-off (two cores: no busy-spinning).

A task is ``HEAD = (publisher u16, seq u32, crc32(body) u32)`` then a body cut from a random
block; its length follows from (publisher, seq, lengths), so a member can check every byte.
A member records each task it is handed, before it does anything else with it, by appending
``RECORD = (publisher u16, seq u32)`` to its record file with one write(2): what a SIGKILLed
member had been handed survives it.
"""

from __future__ import annotations

import os
import random
import struct
import time
import zlib
from typing import Any

import shmbus

CHANNEL = "aeron:ipc"
HEAD = struct.Struct("<HII")
RECORD = struct.Struct("<HI")
_BLOCK = random.Random(20261124).randbytes(1 << 16)


def task_length(publisher: int, seq: int, lengths: tuple[int, int]) -> int:
    """The payload length of a publisher's task ``seq`` (at least HEAD.size)."""
    low, high = lengths
    return low + (seq * 7919 + publisher * 104729) % (high - low + 1)


def make_task(publisher: int, seq: int, lengths: tuple[int, int]) -> bytes:
    body_length = task_length(publisher, seq, lengths) - HEAD.size
    start = (seq * 31 + publisher * 977) % (len(_BLOCK) - body_length)
    body = _BLOCK[start:start + body_length]
    return HEAD.pack(publisher, seq, zlib.crc32(body)) + body


def check_task(buffer: memoryview, lengths: tuple[int, int]) -> tuple[int, int, str | None]:
    """(publisher, seq, problem or None) of a task as delivered."""
    publisher, seq, crc = HEAD.unpack_from(buffer)
    if len(buffer) != task_length(publisher, seq, lengths):
        return publisher, seq, f"length {len(buffer)}"
    if zlib.crc32(buffer[HEAD.size:]) != crc:
        return publisher, seq, "crc"
    return publisher, seq, None


def publish(context: shmbus.Context, stream_id: int, publisher: int, count: int,
            lengths: tuple[int, int], results: Any, stop: Any, *, pause_at: int = -1,
            resume: Any = None, pace_after_pause_s: float = 0.0,
            channel: str = CHANNEL) -> None:
    """Publish tasks 0..count-1 of ``publisher``, waiting out back-pressure (120 s at most),
    then keep the publication until ``stop`` is set (its group counters stay to be read).
    With ``pause_at``, wait for ``resume`` before publishing task ``pause_at``, then sleep
    ``pace_after_pause_s`` after each task (members that just joined get a share, however
    the machine schedules them)."""
    pace = 0.0
    with shmbus.connect(context) as bus:
        publication = bus.add_publication(channel, stream_id)
        for seq in range(count):
            if seq == pause_at:
                resume.wait(120)
                pace = pace_after_pause_s
            publication.publish(make_task(publisher, seq, lengths), timeout=120.0)
            if pace:
                time.sleep(pace)
        stop.wait(120)
        results.put({"publisher": publisher, "sent": count})


def work(context: shmbus.Context, stream_id: int, group: str, record_path: str, stop: Any,
         lengths: tuple[int, int], results: Any, *, fragment_limit: int = 16,
         hold_at: int | None = None, holding: Any = None, release: Any = None,
         leave_after: int | None = None, joined: Any = None, messages: bool = False,
         channel: str = CHANNEL) -> None:
    """Be a member of ``group`` until ``stop`` is set (or 120 s pass), recording each task.
    Reads with ``poll`` (a FragmentAssembler), or with ``messages()`` when ``messages``.

    ``hold_at=n``: at the n-th task, after recording it, set ``holding`` and wait for
    ``release`` (without one, sleep: the test kills this process there; a process killed
    while waiting on an Event would leave that Event unusable). ``leave_after=n``: close the
    subscription after n tasks and stay connected until ``stop``. Reports {"errors",
    "tasks"}.
    """
    fd = os.open(record_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    errors: list[str] = []
    tasks = 0

    def on_task(buffer: memoryview, header: shmbus.Header | None) -> None:
        nonlocal tasks
        publisher, seq, problem = check_task(buffer, lengths)
        os.write(fd, RECORD.pack(publisher, seq))
        tasks += 1
        if problem is not None and len(errors) < 20:
            errors.append(f"publisher {publisher} task {seq}: {problem}")
        if tasks == hold_at:
            holding.set()
            if release is not None:
                release.wait(60)
            else:
                time.sleep(60)  # parked with the task in hand, until the test kills it

    with shmbus.connect(context) as bus:
        subscription = bus.add_subscription(channel, stream_id, group=group)
        if joined is not None:
            joined.set()
        assembler = shmbus.FragmentAssembler(on_task)

        def read_some() -> int:
            if not messages:
                return subscription.poll(assembler, fragment_limit)
            taken = 0
            for message in subscription.messages(timeout=0):
                on_task(memoryview(message), None)
                taken += 1
                if taken >= fragment_limit:
                    break
            return taken

        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        deadline = time.monotonic() + 120
        while not stop.is_set() and time.monotonic() < deadline:
            if leave_after is not None and tasks >= leave_after and not subscription.is_closed:
                subscription.close()
            if subscription.is_closed or read_some() == 0:
                idle.idle(0)
            else:
                idle.reset()
        os.close(fd)
        results.put({"errors": errors, "tasks": tasks, "record": record_path})
