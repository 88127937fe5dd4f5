"""Loss injection for tests, in the manner of Aeron's debug channel endpoints (off by default).

A :class:`LossFilter` sits in the socket layer between a state machine and ``sendto``: given a
datagram it returns the datagrams to send and when. A seeded random rule drops, duplicates,
reorders (holds a datagram back until after the next one) and delays datagrams, optionally only
for a span of time (so a test can show what happens when loss starts and when it stops).
Sans-IO: the time is an argument.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from dataclasses import dataclass


class LossSpecError(ValueError):
    """A loss specification that does not parse; the message names the bad part."""


@dataclass(frozen=True)
class LossSpec:
    """Rates are probabilities per datagram (0..1); ``delay`` is seconds added to delayed ones;
    ``direction`` says which datagrams pass the filter: ``out`` (sent), ``in`` (received) or
    ``both``. The rates apply from ``start`` seconds until ``stop`` seconds after the first
    datagram a filter sees (each channel has its own filter, so its own first datagram);
    outside that span datagrams pass untouched."""

    drop: float = 0.0
    dup: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    seed: int = 0
    direction: str = "out"
    start: float = 0.0
    stop: float = math.inf

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.stop:
            raise LossSpecError(f"loss spec: start={self.start} and stop={self.stop} must "
                                f"satisfy 0 <= start <= stop")

    @property
    def outgoing(self) -> bool:
        return self.direction in ("out", "both")

    @property
    def incoming(self) -> bool:
        return self.direction in ("in", "both")

    @classmethod
    def parse(cls, text: str) -> LossSpec | None:
        """``"drop=0.05,dup=0.05,reorder=0.05,delay=0.001,seed=7,direction=in,start=2,stop=4"``;
        empty text: None (off)."""
        if not text.strip():
            return None
        values: dict[str, float | int | str] = {}
        for item in text.split(","):
            key, sep, value = item.strip().partition("=")
            if key == "direction" and value in ("in", "out", "both"):
                values[key] = value
                continue
            if not sep or key not in ("drop", "dup", "reorder", "delay", "seed", "start",
                                      "stop"):
                raise LossSpecError(f"loss spec {text!r}: {item!r} is not drop=, dup=, "
                                    f"reorder=, delay=, seed=, start=, stop= or "
                                    f"direction=in|out|both")
            try:
                values[key] = int(value) if key == "seed" else float(value)
            except ValueError:
                raise LossSpecError(f"loss spec {text!r}: {key}={value!r} is not a number") \
                    from None
            if key in ("drop", "dup", "reorder") and not 0 <= float(values[key]) <= 1:
                raise LossSpecError(f"loss spec {text!r}: {key} must be between 0 and 1")
        return cls(**values)  # type: ignore[arg-type]


class LossFilter:
    """Applies a :class:`LossSpec` to outgoing datagrams; counts what it did."""

    def __init__(self, spec: LossSpec) -> None:
        self.spec = spec
        self._random = random.Random(spec.seed)
        self._held: tuple[bytes, object] | None = None
        self._delayed: list[tuple[int, int, bytes, object]] = []
        self._order = itertools.count()
        self._first_ns: int | None = None
        self.dropped = 0
        self.duplicated = 0
        self.reordered = 0
        self.delayed = 0

    def send(self, now_ns: int, datagram: bytes | memoryview, destination: object
             ) -> list[tuple[bytes, object]]:
        """What to send now for this datagram (maybe nothing; later ones come from due())."""
        spec = self.spec
        rnd = self._random.random
        data = bytes(datagram)  # the log may be cleaned before a held datagram goes out
        if self._first_ns is None:
            self._first_ns = now_ns
        if not spec.start <= (now_ns - self._first_ns) / 1e9 < spec.stop:
            out = [(data, destination)]
            if self._held is not None:
                out.append(self._held)
                self._held = None
            return out
        if rnd() < spec.drop:
            self.dropped += 1
            return []
        out = [(data, destination)]
        if rnd() < spec.dup:
            self.duplicated += 1
            out.append((data, destination))
        if spec.delay and rnd() < spec.reorder:
            self.delayed += 1
            heapq.heappush(self._delayed, (now_ns + int(spec.delay * 1e9), next(self._order),
                                           data, destination))
            return []
        if rnd() < spec.reorder and self._held is None:
            self.reordered += 1
            self._held = out.pop(0)
            return out
        if self._held is not None:
            out.append(self._held)
            self._held = None
        return out

    def due(self, now_ns: int) -> list[tuple[bytes, object]]:
        """Delayed datagrams whose time has come; a held one goes out too (nothing waits)."""
        out = []
        while self._delayed and self._delayed[0][0] <= now_ns:
            _, _, data, destination = heapq.heappop(self._delayed)
            out.append((data, destination))
        if self._held is not None:
            out.append(self._held)
            self._held = None
        return out

    def next_deadline(self) -> int | None:
        return self._delayed[0][0] if self._delayed else None
