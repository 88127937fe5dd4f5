"""Loss detection for one image: which parts of the stream between the rebuild position and
the high-water mark are missing, and when to NAK them
(docs/protocol.md, NAK recovery).

:class:`LossDetector` is pure bookkeeping over stream positions; the receiver tells it which
byte ranges it placed in the image log (whole frames, as the sender packs them) and which
positions heartbeats announced, and asks it at each poll for the NAKs that are due.

* The rebuild position (rcv-pos) is the end of the contiguous data from the join position; the
  high-water mark (rcv-hwm) is the end of the highest data or heartbeat position seen.
* Every gap between them is tracked, not only the first. A new gap is NAKed after
  ``nak_delay_ns`` (0 for unicast: at the next poll) and, while any part of it stays missing,
  again every ``nak_retry_ns`` (10 ms by default, Aeron's unicast retry). A gap that is filled
  in part keeps its timer, so a retransmit that arrives in several datagrams does not cause
  a burst of NAKs for the rest.
* A NAK never spans a term boundary: a gap across one is NAKed as one range per term.

Invariant (what the receiver relies on): every byte in [rebuild_position, hwm_position) that is
in no gap has been placed in the log; rebuild_position is the start of the first gap, or the
high-water mark when there is none. Gaps start and end on frame boundaries because datagrams
carry whole frames.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "NAK_RETRY_NS_DEFAULT",
    "Gap",
    "LossDetector",
    "NakRequest",
    "multicast_nak_delay",
]

#: Aeron's unicast NAK retry: delay (100 us) x 100.
NAK_RETRY_NS_DEFAULT: Final = 10_000_000
#: Aeron's multicast NAK defaults: an expected group of 10 receivers, back-off up to 10 ms.
NAK_MULTICAST_GROUP_SIZE_DEFAULT: Final = 10
NAK_MULTICAST_MAX_BACKOFF_NS_DEFAULT: Final = 10_000_000


def multicast_nak_delay(
    rng: random.Random,
    *,
    group_size: int = NAK_MULTICAST_GROUP_SIZE_DEFAULT,
    max_backoff_ns: int = NAK_MULTICAST_MAX_BACKOFF_NS_DEFAULT,
) -> Callable[[], int]:
    """A randomized NAK delay for multicast receivers (the "optimal" feedback delay of
    Nonnenmacher and Biersack that Aeron uses): a truncated exponential over [0, max backoff]
    that makes it likely one receiver NAKs first and the others hear it and stay quiet."""
    rate = math.log(group_size) + 1.0
    scale = math.exp(rate) - 1.0

    def delay() -> int:
        return int(max_backoff_ns / rate * math.log(rng.random() * scale + 1.0))

    return delay


@dataclass(slots=True)
class Gap:
    """Missing bytes [start, end) of the stream; ``nak_at_ns`` is when to NAK it next and
    ``naks`` how many times it was NAKed."""

    start: int
    end: int
    nak_at_ns: int
    naks: int = 0


@dataclass(frozen=True, slots=True)
class NakRequest:
    """A range to NAK, within one term: stream ``position`` and ``length`` in bytes; ``first``
    is True the first time this loss is reported."""

    position: int
    length: int
    first: bool


class LossDetector:
    """Tracks received ranges and gaps of one image from ``position`` (the join position)."""

    def __init__(
        self,
        position: int,
        term_length: int,
        *,
        nak_delay_ns: int = 0,
        nak_retry_ns: int = NAK_RETRY_NS_DEFAULT,
        nak_delay: Callable[[], int] | None = None,
    ) -> None:
        """``nak_delay`` (a callable giving each new gap its delay) replaces the fixed
        ``nak_delay_ns``: multicast receivers use :func:`multicast_nak_delay`."""
        if nak_retry_ns <= 0 or nak_delay_ns < 0:
            raise ValueError("nak_retry_ns must be positive and nak_delay_ns not negative")
        self.nak_delay = nak_delay
        self.rebuild_position = position
        self.hwm_position = position
        self.term_length = term_length
        self.nak_delay_ns = nak_delay_ns
        self.nak_retry_ns = nak_retry_ns
        self.gaps: list[Gap] = []
        #: gaps ever detected, and their bytes (the receiver's loss counters)
        self.gaps_detected = 0
        self.bytes_lost = 0

    @property
    def has_gaps(self) -> bool:
        return bool(self.gaps)

    def on_data(self, now_ns: int, start: int, end: int) -> bool:
        """Data [start, end) was placed in the log (``start`` >= the rebuild position, unless
        it is a duplicate). Returns True if it filled anything that was missing or extended the
        high-water mark, False for a pure duplicate."""
        if end <= self.rebuild_position:
            return False
        hwm = self.hwm_position
        if start >= hwm:
            if start > hwm:
                self._add_gap(now_ns, hwm, start)
            self.hwm_position = end
            if not self.gaps:
                self.rebuild_position = end
            return True
        filled = False
        if self.gaps:
            kept: list[Gap] = []
            for gap in self.gaps:
                if gap.end <= start or gap.start >= end:
                    kept.append(gap)
                    continue
                filled = True
                if gap.start < start:
                    kept.append(Gap(gap.start, start, gap.nak_at_ns, gap.naks))
                if gap.end > end:
                    kept.append(Gap(end, gap.end, gap.nak_at_ns, gap.naks))
            self.gaps = kept
        if end > hwm:
            self.hwm_position = end
            filled = True
        self.rebuild_position = self.gaps[0].start if self.gaps else self.hwm_position
        return filled

    def on_heartbeat(self, now_ns: int, position: int) -> None:
        """The sender announced it has sent up to ``position``: anything between the
        high-water mark and it is missing."""
        if position > self.hwm_position:
            self._add_gap(now_ns, self.hwm_position, position)
            self.hwm_position = position

    def on_nak_heard(self, now_ns: int, position: int, length: int) -> int:
        """Another receiver NAKed [position, position + length): gaps it covers wait a retry
        interval as if this receiver had NAKed them (multicast NAK suppression). Returns how
        many gaps were suppressed."""
        end = position + length
        suppressed = 0
        for gap in self.gaps:
            if gap.start < end and position < gap.end:
                gap.nak_at_ns = max(gap.nak_at_ns, now_ns + self.nak_retry_ns)
                suppressed += 1
        return suppressed

    def _add_gap(self, now_ns: int, start: int, end: int) -> None:
        delay = self.nak_delay() if self.nak_delay is not None else self.nak_delay_ns
        self.gaps.append(Gap(start, end, now_ns + delay))
        self.gaps_detected += 1
        self.bytes_lost += end - start

    def poll(self, now_ns: int) -> list[NakRequest]:
        """The NAKs due at ``now_ns`` (each within one term); reschedules each NAKed gap."""
        requests: list[NakRequest] = []
        term_length = self.term_length
        for gap in self.gaps:
            if now_ns < gap.nak_at_ns:
                continue
            first = gap.naks == 0
            gap.naks += 1
            gap.nak_at_ns = now_ns + self.nak_retry_ns
            start = gap.start
            while start < gap.end:
                term_end = (start // term_length + 1) * term_length
                end = min(gap.end, term_end)
                requests.append(NakRequest(start, end - start, first))
                start = end
        return requests

    def next_deadline(self) -> int | None:
        """When the next NAK falls due, or None without gaps."""
        if not self.gaps:
            return None
        return min(gap.nak_at_ns for gap in self.gaps)
