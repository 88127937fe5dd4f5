"""Spawn targets and the checker of the late-joiner tests: a publisher at full speed whose
messages carry a writer id, a sequence number and a crc32, and a recorder process."""

from __future__ import annotations

import os
import random
import signal
import struct
import time
import traceback
import zlib
from typing import Any

import shmbus

HEAD = struct.Struct("<IQ")   # writer id, sequence
CRC = struct.Struct("<I")
#: longest body: some messages span several frames (mtu 1408)
MAX_BODY = 3000
_BODIES = bytes(random.Random(5).randbytes(MAX_BODY + 64))


def message(writer: int, seq: int) -> bytes:
    """The message ``seq`` of ``writer``: head, a body of a length set by seq, crc32."""
    length = body_length(seq)
    start = seq % 64
    body = HEAD.pack(writer, seq) + _BODIES[start:start + length]
    return body + CRC.pack(zlib.crc32(body))


def check(payload: bytes | memoryview) -> tuple[int, int]:
    """(writer, seq) of a message; AssertionError when its crc or length is wrong."""
    data = bytes(payload)
    assert len(data) >= HEAD.size + CRC.size, f"short message {data!r}"
    assert zlib.crc32(data[:-CRC.size]) == CRC.unpack(data[-CRC.size:])[0], "bad crc32"
    writer, seq = HEAD.unpack_from(data)
    assert len(data) == HEAD.size + body_length(seq) + CRC.size, f"seq {seq}: wrong length"
    return writer, seq


def body_length(seq: int) -> int:
    return (seq * 7919) % 200 if seq % 97 else (seq * 31) % MAX_BODY


def publish(context: shmbus.Context, channel: str, stream_id: int, writer: int, stop: Any,
            reports: Any, started: Any = None, rate: float = 0) -> None:
    """Offer messages at full speed (yielding only when back-pressured), or at most ``rate``
    a second, until ``stop``."""
    try:
        with shmbus.connect(context) as bus:
            pub = bus.add_exclusive_publication(channel, stream_id)
            seq = 0
            if started is not None:
                started.set()
            begin = time.monotonic()
            while not stop.is_set():
                if rate and seq > (time.monotonic() - begin) * rate:
                    time.sleep(0.001)
                elif pub.offer(message(writer, seq)) > 0:
                    seq += 1
                else:
                    time.sleep(0)
            reports.put({"kind": "published", "writer": writer, "count": seq,
                         "session": pub.session_id})
    except BaseException:
        reports.put({"kind": "error", "name": f"publisher {writer}",
                     "exception": traceback.format_exc()})


def record(context: shmbus.Context, directory: str, channel: str, stream_id: int, stop: Any,
           ready: Any, reports: Any) -> None:
    """Record the stream until ``stop``."""
    try:
        with shmbus.connect(context) as bus, \
                bus.add_recorder(directory, channel, stream_id) as recorder:
            ready.set()
            recorder.run(stop=stop)
        reports.put({"kind": "recorded"})
    except BaseException:
        reports.put({"kind": "error", "name": "recorder", "exception": traceback.format_exc()})


def hold(context: shmbus.Context, directory: str, reports: Any) -> None:
    """Join with history and go live at once (catch_up=0): the live image joins ahead of the
    replay and holds the publisher; report where, then never read again."""
    try:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", 1001, history=shmbus.Recording(directory),
                                       from_position="start", catch_up=0.0)
            deadline = time.monotonic() + 30
            while sub.live_subscription is None or not sub.live_subscription.images:
                assert time.monotonic() < deadline, "no live image"
                sub.poll(lambda payload, info: None, 1)
            image = sub.live_subscription.images[0]
            reports.put({"kind": "holding", "join": image.join_position,
                         "replayed_to": sub.positions()[image.session_id][1]})
            time.sleep(300)  # parked, never reading again, until the test kills it
    except BaseException:
        reports.put({"kind": "error", "name": "holder", "exception": traceback.format_exc()})


def reprocess(context: shmbus.Context, stream_id: int, group: str, joined: Any, stop: Any,
              reports: Any) -> None:
    """Be a member of ``group`` on ``stream_id`` until ``stop``, reporting the (writer, seq)
    of what it takes, in the order taken, as it goes."""
    try:
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", stream_id, group=group)
            joined.set()
            while not stop.is_set():
                taken = [check(m) for m in sub.messages(timeout=0.05)]
                if taken:
                    reports.put({"kind": "taken", "pid": os.getpid(), "taken": taken})
    except BaseException:
        reports.put({"kind": "error", "name": "reprocess", "exception": traceback.format_exc()})


def stop_in_live(context: shmbus.Context, directory: str, reports: Any) -> None:
    """Join with history; in the handler of the first live message stop this process
    (SIGSTOP: the test resumes it past the client liveness timeout, the log lapped under it),
    then read that message. Reports how the poll it stopped in ended, whether the message it
    read after the stop was whole, and whether any later poll handed anything out."""
    stopped: list[bool] = []  # the message read after the stop: whole?
    later: list[str] = []     # what later polls handed out

    def handler(payload: memoryview, info: shmbus.MessageInfo) -> None:
        if stopped:
            later.append(bytes(payload).hex()[:32])
        elif not info.replayed:
            os.kill(os.getpid(), signal.SIGSTOP)
            try:
                check(payload)
                stopped.append(True)
            except AssertionError:
                stopped.append(False)

    try:
        outcome = "returned"
        with shmbus.connect(context) as bus:
            sub = bus.add_subscription("aeron:ipc", 1001, history=shmbus.Recording(directory),
                                       from_position="start", catch_up=1.0)
            deadline = time.monotonic() + 60
            try:
                while not stopped and time.monotonic() < deadline:
                    sub.poll(handler, 64)
                # resumed, the poll it stopped in returned: poll on a while
                later_until = time.monotonic() + 2
                while time.monotonic() < later_until:
                    sub.poll(handler, 64)
                    time.sleep(0.01)
            except shmbus.ClientTimeoutError:
                outcome = "ClientTimeoutError"
        reports.put({"kind": "stopped-in-live", "outcome": outcome,
                     "whole": stopped[0] if stopped else None, "later": later[:5]})
    except BaseException:
        reports.put({"kind": "error", "name": "stopped joiner",
                     "exception": traceback.format_exc()})
