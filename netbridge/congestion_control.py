"""Congestion control of one receive image: the receiver window its status messages advertise
(docs/protocol.md, Congestion control).

In Aeron, congestion control belongs to the receiver: the sender may only run a window ahead
of the consumption position each status message reports, so a receiver that shrinks that
window slows its sender down, as a TCP sender shrinking its congestion window would. The
channel's ``cc`` parameter chooses the strategy for every image of a receive channel:

* ``static`` (the default): the window never changes; congestion control is off.
* ``cubic``: CUBIC's window function (RFC 8312), counted in MTUs. The window starts at 10 MTUs
  and never leaves [1 MTU, the static window]. A loss (a new gap the receiver NAKs) is a
  congestion event unless one was taken within the last update interval (losses that close
  together come from the same flight of data): the window before it becomes ``w_max`` and the
  window drops by ``BETA`` (to 80 %). From then on, once per update interval, the window is
  ``w_max + C * (t - K)**3`` (t: seconds since the event, ``K = cbrt(w_max * BETA / C)``):
  quick growth back towards ``w_max``, a plateau there, then faster and faster probing above
  it, up to the static window. Before any loss it grows the same way from 10 MTUs (K = 0).
  The update interval is the round-trip time (100 us until the first measurement), but at
  least :data:`MIN_UPDATE_INTERVAL_NS`, so that an image below its window does not wake its
  process more than a thousand times a second. Aeron's optional "TCP mode" (never growing
  slower than an estimated Reno window) is not implemented.

Sans-IO: every method takes the time in nanoseconds of one monotonic clock; nothing here reads
a clock. The receiver image calls :meth:`CongestionControl.on_rtt` for each round-trip
measurement, :meth:`CongestionControl.on_loss` for each new gap, and
:meth:`CongestionControl.on_tick` on every poll; a changed window is advertised at once.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Final

__all__ = [
    "CongestionControl",
    "CubicCongestionControl",
    "StaticWindowCongestionControl",
    "congestion_control_for",
]

#: CUBIC's scaling constant, in MTUs per second cubed (RFC 8312's C)
CUBIC_C: Final = 0.4
#: the fraction of the window a congestion event takes away (RFC 8312's 1 - beta_cubic)
CUBIC_BETA: Final = 0.2
CUBIC_INITIAL_WINDOW_MTUS: Final = 10
CUBIC_INITIAL_RTT_NS: Final = 100_000
#: the window is updated, and losses count as new congestion events, at most this often
MIN_UPDATE_INTERVAL_NS: Final = 1_000_000


class CongestionControl(ABC):
    """The receiver window of one image, in bytes (:attr:`window`), moved by events.

    Contract: ``mtu <= window <= max_window`` at all times; times passed to the methods never
    go backwards. Only the image's owner (the netbridge's receiver) calls these.
    """

    name: str
    window: int

    def __init__(self, *, mtu: int, max_window: int) -> None:
        if mtu <= 0:
            raise ValueError(f"mtu {mtu} must be positive")
        if max_window < mtu:
            raise ValueError(f"max_window {max_window} is below the mtu {mtu}")
        self.mtu = mtu
        self.max_window = max_window

    def on_rtt(self, now_ns: int, rtt_ns: int) -> None:  # noqa: B027 - optional hook
        """A round-trip time measurement, in ns."""

    def on_loss(self, now_ns: int) -> None:  # noqa: B027 - optional hook
        """The receiver found a new gap in the stream (and NAKs it)."""

    @abstractmethod
    def on_tick(self, now_ns: int) -> int:
        """Bring the window up to ``now_ns`` and return it (bytes)."""

    def next_deadline(self) -> int | None:
        """When :meth:`on_tick` may change the window next (None: only after an event)."""
        return None


class StaticWindowCongestionControl(CongestionControl):
    """``cc=static``: the window is ``max_window``, whatever happens."""

    name = "static"

    def __init__(self, *, mtu: int, max_window: int) -> None:
        super().__init__(mtu=mtu, max_window=max_window)
        self.window = max_window

    def on_tick(self, now_ns: int) -> int:
        return self.window


class CubicCongestionControl(CongestionControl):
    """``cc=cubic`` (see the module docstring). State for counters and tests: ``cwnd`` (the
    window in MTUs), ``w_max`` (MTUs, the window at the last congestion event), ``k``
    (seconds), ``rtt_ns``, ``congestion_events``."""

    name = "cubic"

    def __init__(self, *, mtu: int, max_window: int, now_ns: int) -> None:
        super().__init__(mtu=mtu, max_window=max_window)
        self.max_cwnd = max_window // mtu
        self.cwnd = min(CUBIC_INITIAL_WINDOW_MTUS, self.max_cwnd)
        self.w_max = self.cwnd
        self.k = 0.0
        self.rtt_ns = CUBIC_INITIAL_RTT_NS
        self.congestion_events = 0
        self._epoch_ns = now_ns  # the last congestion event (or the start)
        self._last_update_ns = now_ns
        self.window = self.cwnd * mtu

    @property
    def update_interval_ns(self) -> int:
        return max(self.rtt_ns, MIN_UPDATE_INTERVAL_NS)

    def on_rtt(self, now_ns: int, rtt_ns: int) -> None:
        if rtt_ns > 0:
            self.rtt_ns = rtt_ns

    def on_loss(self, now_ns: int) -> None:
        if self.congestion_events and now_ns - self._epoch_ns < self.update_interval_ns:
            return  # the same congestion event
        self.congestion_events += 1
        self.w_max = self.cwnd
        self.k = math.cbrt(self.w_max * CUBIC_BETA / CUBIC_C)
        self.cwnd = max(1, int(self.cwnd * (1.0 - CUBIC_BETA)))
        self.window = self.cwnd * self.mtu
        self._epoch_ns = self._last_update_ns = now_ns

    def on_tick(self, now_ns: int) -> int:
        if self.cwnd < self.max_cwnd and now_ns - self._last_update_ns >= self.update_interval_ns:
            self._last_update_ns = now_ns
            t = (now_ns - self._epoch_ns) / 1e9 - self.k
            target = int(self.w_max + CUBIC_C * t * t * t)
            if target > self.cwnd:
                self.cwnd = min(target, self.max_cwnd)
                self.window = self.cwnd * self.mtu
        return self.window

    def next_deadline(self) -> int | None:
        if self.cwnd >= self.max_cwnd:
            return None
        return self._last_update_ns + self.update_interval_ns


def congestion_control_for(name: str, *, mtu: int, max_window: int,
                           now_ns: int) -> CongestionControl:
    """The strategy a channel's ``cc`` value names, for an image with this ``mtu`` whose
    window may reach ``max_window`` bytes. ValueError names an unknown value."""
    if name == "static":
        return StaticWindowCongestionControl(mtu=mtu, max_window=max_window)
    if name == "cubic":
        return CubicCongestionControl(mtu=mtu, max_window=max_window, now_ns=now_ns)
    raise ValueError(f"cc={name!r}: unknown congestion control (static or cubic)")
