"""Spawn target for tests/shmbus/driver/test_hostile_clients.py: a client process of the same
user gone wrong, writing random and mutated commands into the driver's command ring buffer and
garbage into the parts of cnc.dat it can reach.

It talks to the ring directly (not through shmbus.Client) so that it can write what no client
would. What it writes (``kind`` in its report counts each):

* ``well-formed``: a command of every type the driver takes from clients, with random fields
  (ids of its own client or random ones; channels valid, odd or garbage);
* ``garbage``: a client command type with a random payload;
* ``truncated`` / ``extended``: a well-formed command cut short or with bytes after it;
* ``mutated``: a well-formed command with bits flipped, bytes replaced or a string's length
  prefix set to an absurd value;
* ``unknown-type``: a type id no message has, random payload;
* ``huge``: a payload of the ring's largest message length;
* ``scribbled-length``: a command written, then its record's length overwritten;
* ``scribbled-counters``: garbage in its own heartbeat counter's value and metadata;
* ``scribbled-header``: garbage in cnc.dat's header (section lengths, version), which the
  driver wrote and never reads again; put back when the fuzzer ends, for new clients.

It never names the ids of the clients in ``protected`` (a same-user process that closes another
client on purpose is not a bug the driver can tell from a request), and never subscribes to or
publishes on ``protected_stream``.
"""

from __future__ import annotations

import os
import random
import struct
import time
from collections import Counter
from dataclasses import fields
from pathlib import Path
from typing import Any

import shmbus
from shmbus.shm import control_protocol as cp
from shmbus.shm.cnc import COUNTERS_METADATA, COUNTERS_VALUES, TO_DRIVER, CncFile
from shmbus.shm.counters import METADATA_LENGTH, CountersReader
from shmbus.shm.ring_buffer import ManyToOneRingBuffer

#: Commands a client sends (the netbridge's own commands are for a trusted peer).
CLIENT_COMMANDS = [cp.AddPublication, cp.AddExclusivePublication, cp.AddSubscription,
                   cp.RemovePublication, cp.RemoveSubscription, cp.AddDestination,
                   cp.RemoveDestination, cp.ClientClose, cp.AddLinkedCounter, cp.FreeCounter,
                   cp.ClientConnect]
GARBAGE_TYPES = [*CLIENT_COMMANDS, cp.RegisterBridge, cp.CreateImage, cp.CloseImage]
KINDS = ["well-formed"] * 6 + ["garbage"] * 4 + ["truncated", "extended"] + ["mutated"] * 4 + [
    "unknown-type", "huge", "scribbled-counters", "scribbled-header"]
#: Every this many commands, one is ``scribbled-length``: the driver may then wait for the
#: client liveness timeout before it passes a gap it cannot frame, so these are rarer.
SCRIBBLE_LENGTH_EVERY = 1000
#: How many commands one fuzzer client sends before it closes and connects anew.
SESSION = 250
HEADER_SCRIBBLE = 48  # bytes: version, section lengths, liveness, start time, pid


def _channel(rng: random.Random, stream_hint: int) -> str:
    return rng.choice([
        "aeron:ipc", "aeron:ipc?tether=false", f"aeron:ipc?session-id={rng.getrandbits(31)}",
        "aeron:ipc?term-length=64k", "aeron:ipc?term-length=3", "aeron:ipcx", "aeron:",
        "aeron:udp?endpoint=nosuchhost.invalid:1", "aeron:udp?endpoint=1.2.3.4:99999",
        "aeron:udp", f"aeron:ipc?{stream_hint}", "", "\x00" * 5, "é" * 40,
        "aeron:ipc?" + "|".join(f"tags={i}" for i in range(200)),
        rng.randbytes(rng.randrange(60)).decode("latin-1"),
        # join positions: gone, past the end, inside a frame, and values no int64 holds
        "aeron:ipc?join-position=" + rng.choice(
            ["earliest", "0", "32", "33", "-32", "²", "٣٢", "9" * 4400, str(2**63),
             str(2**64 - 32), str(32 * rng.getrandbits(20))]),
    ])


def _int_field(rng: random.Random, name: str, client_id: int, protected_stream: int) -> int:
    if name == "client_id":
        return client_id if rng.random() < 0.9 else rng.getrandbits(63) | 1 << 40
    if name == "stream_id":
        while (stream := rng.choice([1, 2, 3, -1, 2**31 - 1, rng.getrandbits(31)])) == \
                protected_stream:
            pass
        return stream
    return rng.choice([0, -1, 1, rng.randrange(200), rng.getrandbits(31), -rng.getrandbits(63),
                       2**31 - 1, 2**63 - 1])


def well_formed(rng: random.Random, client_id: int, protected_stream: int,
                types: list[type[cp.Message]] = CLIENT_COMMANDS) -> cp.Message:
    cls = rng.choice(types)
    codes = cls.FORMAT.format.lstrip("<")
    values: list[Any] = []
    for i, f in enumerate(fields(cls)):
        if f.type == "str":
            values.append(_channel(rng, protected_stream))
            continue
        value = _int_field(rng, f.name, client_id, protected_stream)
        if codes[i] == "i":  # wrapped into the field's width
            value = (value + 2**31) % 2**32 - 2**31
        values.append(value)
    return cls(*values)


def _mutate(rng: random.Random, data: bytes, string_offset: int | None) -> bytes:
    out = bytearray(data)
    if string_offset is not None and rng.random() < 0.3:
        struct.pack_into("<i", out, string_offset,
                         rng.choice([-1, -(2**31), 2**31 - 1, len(out), len(out) + 1]))
        return bytes(out)
    for _ in range(rng.randrange(1, 9)):
        if not out:
            break
        i = rng.randrange(len(out))
        if rng.random() < 0.5:
            out[i] ^= 1 << rng.randrange(8)
        else:
            out[i] = rng.randrange(256)
    return bytes(out)


def _harmless(msg_type: int, payload: bytes, protected: set[int],
              protected_stream: int) -> bool:
    """False when the bytes decode to a command naming a protected client or stream."""
    try:
        message = cp.decode(msg_type, payload)
    except cp.MalformedMessage:
        return True
    return (getattr(message, "client_id", None) not in protected
            and getattr(message, "stream_id", None) != protected_stream)


class Fuzzer:
    """One fuzzing session over a bus directory (see the module docstring)."""

    def __init__(self, context: shmbus.Context, seed: int, protected: set[int],
                 protected_stream: int) -> None:
        self.rng = random.Random(seed)
        self.protected = protected
        self.protected_stream = protected_stream
        self.cnc = CncFile.open(Path(context.dir))
        assert self.cnc.buffer is not None
        self.header = self.cnc.buffer.get_bytes(0, HEADER_SCRIBBLE)
        self.to_driver = self.cnc.section(TO_DRIVER)
        self.ring = ManyToOneRingBuffer(self.to_driver)
        self.counters = CountersReader(self.cnc.section(COUNTERS_METADATA),
                                       self.cnc.section(COUNTERS_VALUES))
        self.stats: Counter[str] = Counter()
        self.client_id = 0
        self.written = 0

    def _write(self, msg_type: int, payload: bytes, deadline: float) -> None:
        idle = shmbus.idle_strategies.BackoffIdleStrategy()
        while not self.ring.write(msg_type, payload):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the driver stopped reading commands ({self.ring})")
            idle.idle(0)
        self.written += 1

    def connect(self, deadline: float) -> None:
        if self.client_id:
            self._write(cp.ClientClose.TYPE_ID,
                        cp.ClientClose(self.client_id, self.ring.next_correlation_id()).encode(),
                        deadline)
        self.client_id = self.ring.next_correlation_id()
        hello = cp.ClientConnect(self.client_id, self.ring.next_correlation_id(), os.getpid(),
                                 "fuzzer")
        self._write(hello.TYPE_ID, hello.encode(), deadline)

    def one(self, deadline: float, kind: str | None = None) -> None:
        rng = self.rng
        kind = kind or rng.choice(KINDS)
        if kind == "scribbled-counters":
            self._scribble_counters()
        elif kind == "scribbled-header":
            assert self.cnc.buffer is not None
            self.cnc.buffer.put_bytes(rng.randrange(HEADER_SCRIBBLE - 8), rng.randbytes(8))
        elif kind == "scribbled-length":
            position = self.ring.producer_position()
            self._write(cp.ClientClose.TYPE_ID, rng.randbytes(16), deadline)
            # the record's index in the ring (it never straddles the end of the region)
            index = position & (self.ring.capacity - 1)
            if index + 24 > self.ring.capacity:
                index = 0
            self.to_driver.put_int32(index, rng.choice([rng.getrandbits(31), -rng.getrandbits(31),
                                                   3, 9, 17, 2**31 - 1, -(2**31)]))
        else:
            msg_type, payload = self._command(kind)
            if not _harmless(msg_type, payload, self.protected, self.protected_stream):
                kind = "skipped"
            else:
                self._write(msg_type, payload, deadline)
        self.stats[kind] += 1

    def _command(self, kind: str) -> tuple[int, bytes]:
        rng = self.rng
        if kind == "unknown-type":
            while (msg_type := rng.randrange(1, 2**31)) in cp.MESSAGES:
                pass
            return msg_type, rng.randbytes(rng.randrange(64))
        if kind == "garbage":
            return rng.choice(GARBAGE_TYPES).TYPE_ID, rng.randbytes(rng.randrange(120))
        if kind == "huge":
            return rng.choice(GARBAGE_TYPES).TYPE_ID, rng.randbytes(self.ring.max_msg_length)
        message = well_formed(rng, self.client_id, self.protected_stream)
        data = message.encode()
        if kind == "truncated":
            data = data[:rng.randrange(len(data))]
        elif kind == "extended":
            data += rng.randbytes(rng.randrange(1, 40))
        elif kind == "mutated":
            has_string = any(f.type == "str" for f in fields(message))
            data = _mutate(rng, data, message.FORMAT.size if has_string else None)
        return message.TYPE_ID, data

    def _scribble_counters(self) -> None:
        """Garbage in the value and metadata of a counter this fuzzer's client owns."""
        rng = self.rng
        mine = [c for c in self.counters.counters() if c.owner_id == self.client_id]
        if not mine:
            return
        counter = rng.choice(mine)
        values = self.counters.values
        metadata = self.counters.metadata
        values.put_int64(self.counters.counter_offset(counter.counter_id),
                         rng.choice([-(2**63), 2**63 - 1, rng.getrandbits(63), 0]))
        at = self.counters.metadata_offset(counter.counter_id)
        metadata.put_bytes(at + rng.randrange(0, METADATA_LENGTH - 8, 4), rng.randbytes(8))

    def close(self) -> None:
        assert self.cnc.buffer is not None
        self.cnc.buffer.put_bytes(0, self.header)
        self.cnc.close()


def command_fuzzer(context: shmbus.Context, seed: int, count: int, protected: set[int],
                   protected_stream: int, results: Any, timeout: float) -> None:
    """Writes ``count`` hostile commands and scribbles (see the module docstring), then
    reports ``fuzz`` with how many of each kind it wrote."""
    deadline = time.monotonic() + timeout
    try:
        fuzzer = Fuzzer(context, seed, protected, protected_stream)
        began = time.monotonic()
        try:
            for i in range(count):
                if i % SESSION == 0:
                    fuzzer.connect(deadline)
                fuzzer.one(deadline, "scribbled-length" if i % SCRIBBLE_LENGTH_EVERY
                           == SCRIBBLE_LENGTH_EVERY - 1 else None)
            fuzzer.connect(deadline)  # closes the last session
        finally:
            fuzzer.close()
        results.put({"kind": "fuzz", "name": "fuzzer", "stats": dict(fuzzer.stats),
                     "written": fuzzer.written, "elapsed": time.monotonic() - began})
    except BaseException as e:
        results.put({"kind": "fuzz", "name": "fuzzer", "exception": f"{type(e).__name__}: {e}"})
        raise
