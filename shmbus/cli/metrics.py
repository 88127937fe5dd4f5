"""A bus's counters as Prometheus / OpenMetrics metrics (``shmbus export``, ``stat
--openmetrics``), built with ``prometheus_client``.

:class:`BusCollector` takes one snapshot (:func:`shmbus.cli.snapshot.read_snapshot`) per
scrape, so a scrape shows the same positions ``shmbus streams`` would at that moment, and
:func:`metric_families` turns it into metric families (a pure function). The families:

* ``shmbus_position_bytes`` (gauge): every position counter (pub-pos, which is the log's
  tail read live, pub-lmt, sub-pos, snd-pos, snd-lmt, rcv-hwm, rcv-pos, fc-rcv-pos, grp-pos
  and the group claim records that are not idle);
* ``shmbus_value`` (gauge): other counters that go up and down (client-heartbeat, an epoch
  ms; fc-receivers, grp-members, rcv-cc-window, rr-in-flight);
* ``shmbus_events_total`` (counter): totals: the system counters, snd-bpe, grp-redelivered,
  and the netbridge's channel statistics (any counter type not named above counts as a total);
* ``shmbus_subscriber_lag_bytes`` (gauge): pub-pos (an image: rcv-pos) - each subscriber's
  position, from the same snapshot;
* ``shmbus_publication_held`` (gauge): 1 while a publication is held by its slowest reader;
* ``shmbus_up`` (gauge): 1 when the bus is running, 0 when it is stale or missing;
  ``shmbus_driver_heartbeat_age_seconds`` (gauge).

Counter labels: ``type`` (pub-pos, ...), ``id`` (counter id), ``name`` (a total's name, e.g.
"bytes published"; empty for others), ``stream``, ``session``, ``channel``, ``client_pid``
and ``client_name`` (the owning client; empty when none).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from shmbus.cli.bus_status import RUNNING, BusStatus, check_bus
from shmbus.cli.counter_labels import IDLE_CLAIM
from shmbus.cli.counter_views import CounterView, describe_counters
from shmbus.cli.snapshot import BusNotFoundError, BusSnapshot, read_snapshot
from shmbus.cli.stream_analysis import analyse_streams
from shmbus.cli.stream_views import HELD
from shmbus.shm.counters import (
    CLIENT_HEARTBEAT,
    FC_RCV_POS,
    FC_RECEIVERS,
    GROUP_CLAIM,
    GROUP_MEMBERS,
    GROUP_ORPHAN,
    GROUP_POS,
    PUB_LIMIT,
    PUB_POS,
    RCV_CC_WINDOW,
    RCV_HWM,
    RCV_POS,
    RR_IN_FLIGHT,
    SND_LMT,
    SND_POS,
    SUB_POS,
    SYSTEM,
    TYPE_NAMES,
)

POSITION_TYPES = frozenset({PUB_LIMIT, PUB_POS, SUB_POS, SND_POS, SND_LMT, RCV_HWM, RCV_POS,
                            FC_RCV_POS, GROUP_POS, GROUP_CLAIM, GROUP_ORPHAN})
GAUGE_TYPES = frozenset({CLIENT_HEARTBEAT, FC_RECEIVERS, GROUP_MEMBERS, RCV_CC_WINDOW,
                         RR_IN_FLIGHT})
COUNTER_LABELS = ("type", "id", "name", "stream", "session", "channel", "client_pid",
                  "client_name")
STREAM_LABELS = ("stream", "session", "channel")


def _text(value: object) -> str:
    return "" if value is None else str(value)


def _name(view: CounterView) -> str:
    """A total's name: a system counter's label, else the label's text before its colon."""
    c = view.counter
    if c.type_id == SYSTEM:
        return c.label
    return c.label.partition(":")[0] if c.type_id not in TYPE_NAMES else ""


def metric_families(snapshot: BusSnapshot, status: BusStatus) -> list[Metric]:
    """The metric families of one snapshot (see the module docstring)."""
    positions = GaugeMetricFamily("shmbus_position_bytes", "A stream position (bytes); "
                                  "pub-pos is the log's tail, read live",
                                  labels=COUNTER_LABELS)
    values = GaugeMetricFamily("shmbus_value", "A counter that goes up and down",
                               labels=COUNTER_LABELS)
    events = CounterMetricFamily("shmbus_events", "A total: system counters, back-pressure "
                                 "events, redeliveries, channel statistics",
                                 labels=COUNTER_LABELS)
    for view in describe_counters(snapshot):
        c = view.counter
        labels = [c.type_name, str(c.counter_id), _name(view), _text(view.stream_id),
                  _text(view.session_id), _text(view.channel), _text(view.client_pid),
                  _text(view.client_name)]
        if c.type_id in POSITION_TYPES:
            if c.value != IDLE_CLAIM:  # an idle claim record holds no position
                positions.add_metric(labels, c.value)
        elif c.type_id in GAUGE_TYPES:
            values.add_metric(labels, c.value)
        else:
            events.add_metric(labels, max(c.value, 0))
    lag = GaugeMetricFamily("shmbus_subscriber_lag_bytes", "pub-pos (an image: rcv-pos) "
                            "minus the subscriber's position",
                            labels=(*STREAM_LABELS, "id", "client_pid", "client_name", "group"))
    held = GaugeMetricFamily("shmbus_publication_held", "1 while the publication is held by "
                             "its slowest reader", labels=(*STREAM_LABELS, "client_pid",
                                                           "client_name"))
    for stream in analyse_streams(snapshot):
        where = [_text(stream.stream_id), str(stream.session_id), _text(stream.channel)]
        for s in stream.subscribers:
            lag.add_metric([*where, str(s.counter_id), _text(s.pid), _text(s.name),
                            _text(s.group)], s.lag)
        if stream.kind == "publication":
            held.add_metric([*where, _text(stream.publisher_pid),
                             _text(stream.publisher_name)],
                            1 if stream.state == HELD else 0)
    return [positions, values, events, lag, held, *_bus_families(status)]


def _bus_families(status: BusStatus | None) -> list[Metric]:
    up = GaugeMetricFamily("shmbus_up", "1 when the bus is running (driver alive and "
                           "heartbeating), else 0",
                           value=1 if status is not None and status.state == RUNNING else 0)
    if status is None:
        return [up]
    age = GaugeMetricFamily("shmbus_driver_heartbeat_age_seconds",
                            "Age of the driver's last heartbeat",
                            value=status.heartbeat_age_ms / 1000)
    return [up, age]


class SnapshotCollector(Collector):
    """The metrics of one snapshot already taken (``shmbus stat --openmetrics``)."""

    def __init__(self, snapshot: BusSnapshot, status: BusStatus) -> None:
        self.snapshot = snapshot
        self.status = status

    def collect(self) -> Iterable[Metric]:
        return metric_families(self.snapshot, self.status)


class BusCollector(Collector):
    """Reads the bus in ``directory`` at each scrape; a missing bus gives ``shmbus_up 0``.

    ``driver_timeout_ms``: a heartbeat older than this makes the bus stale.
    """

    def __init__(self, directory: str, driver_timeout_ms: int) -> None:
        self.directory = directory
        self.driver_timeout_ms = driver_timeout_ms

    def collect(self) -> Iterable[Metric]:
        try:
            snapshot = read_snapshot(self.directory)
        except BusNotFoundError:
            return _bus_families(None)
        return metric_families(snapshot, check_bus(snapshot, self.driver_timeout_ms))


def bus_registry(directory: str, driver_timeout_ms: int) -> CollectorRegistry:
    """A registry holding only a :class:`BusCollector` (no process or platform metrics)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BusCollector(directory, driver_timeout_ms))
    return registry
