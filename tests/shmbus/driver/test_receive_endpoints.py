"""The driver's side of receive endpoints: a subscription that needs a new endpoint waits for
the netbridge's answer. A stand-in netbridge (a client registered as the bridge, answering
from a thread) plays the other side, against a real driver process."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import shmbus
from shmbus.shm import control_protocol as cp
from shmbus.shm.cnc import ERROR_LOG
from shmbus.shm.error_log import read_error_log
from tests.support.drivers import running_driver
from tests.support.waits import wait_until

CHANNEL = "aeron:udp?endpoint=127.0.0.1:40555"
HELD = "udp endpoint 127.0.0.1:40555 is already bound by pid 4242 (other: netbridge)"


class StandInBridge:
    """Registers as the netbridge and answers each OnReceiveChannel with ``answer(event)``:
    an error text, "" (taken) or None (no answer). Every driver event lands in ``events``."""

    def __init__(self, context: shmbus.Context,
                 answer: Callable[[cp.OnReceiveChannel], str | None]) -> None:
        self.answer = answer
        self.events: queue.Queue[cp.Message] = queue.Queue()
        self.client = shmbus.connect(context)
        self.client.on_driver_event = self._on_event
        self.client._request(cp.RegisterBridge(self.client.client_id,
                                               self.client._correlation()))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_event(self, event: cp.Message) -> None:
        self.events.put(event)
        if isinstance(event, cp.OnReceiveChannel):
            error = self.answer(event)
            if error is not None:
                self.status(event.subscription_id, event.stream_id, error)

    def status(self, subscription_id: int, stream_id: int, error: str) -> None:
        self.client._request(cp.ReceiveChannelStatus(
            self.client.client_id, self.client._correlation(), subscription_id, stream_id,
            CHANNEL, error))

    def _run(self) -> None:
        while not self._stop.is_set():
            self.client._service()
            time.sleep(0.001)

    def next_event(self, kind: type, timeout: float = 5.0,
                   skipped: list[cp.Message] | None = None) -> cp.Message:
        """The next event of ``kind``; the events before it go to ``skipped``."""
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            if isinstance(event, kind):
                return event
            if skipped is not None:
                skipped.append(event)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.close()


@pytest.fixture
def context(bus_context: shmbus.Context) -> Iterator[shmbus.Context]:
    """A driver that starts no netbridge of its own (the test plays it)."""
    context = bus_context.with_(netbridge_auto_start=False)
    with running_driver(context):
        yield context


def errors(bus: shmbus.Client) -> list[str]:
    return [o.text for o in read_error_log(bus.cnc.section(ERROR_LOG))]


def test_a_subscription_waits_for_the_netbridge_and_hears_its_refusal(context) -> None:
    bridge = StandInBridge(context, lambda event: HELD if event.stream_id == 5 else "")
    try:
        with shmbus.connect(context) as bus:
            with pytest.raises(shmbus.RegistrationError) as refused:
                bus.add_subscription(CHANNEL, 5)
            assert refused.value.code == cp.CHANNEL_ENDPOINT_ERROR
            assert str(refused.value) == f"channel {CHANNEL!r}: {HELD}"
            asked = bridge.next_event(cp.OnReceiveChannel)
            assert (asked.subscription_id, asked.stream_id) != (0, 5)  # someone waits
            assert any(HELD in text for text in errors(bus))

            taken = bus.add_subscription(CHANNEL, 6)  # ready once the bridge said so
            asked = bridge.next_event(cp.OnReceiveChannel)
            assert (asked.subscription_id, asked.stream_id) == (taken.registration_id, 6)
            # a second subscription to a stream already taken neither waits nor asks again
            bus.add_subscription(CHANNEL, 6).close()
            taken.close()  # the last one: the netbridge may let the stream go
            before: list[cp.Message] = []
            closed = bridge.next_event(cp.OnReceiveChannelClosed, skipped=before)
            assert closed.stream_id == 6
            assert not any(isinstance(event, cp.OnReceiveChannel) for event in before)
    finally:
        bridge.close()


def test_a_netbridge_that_never_answers_gets_the_subscription_refused_in_time(
        context) -> None:
    bridge = StandInBridge(context, lambda event: None)
    try:
        with shmbus.connect(context) as bus:
            with pytest.raises(shmbus.RegistrationError,
                               match="no netbridge took the endpoint within 4 s"):
                bus.add_subscription(CHANNEL, 5)
            asked = bridge.next_event(cp.OnReceiveChannel)
            # the late answer finds nobody waiting: the driver lets the endpoint go again
            bridge.status(asked.subscription_id, 5, "")
            closed = bridge.next_event(cp.OnReceiveChannelClosed)
            assert closed.stream_id == 5
    finally:
        bridge.close()


def test_without_a_netbridge_the_subscription_is_ready_and_a_later_failure_is_logged(
        context) -> None:
    with shmbus.connect(context) as bus:
        bus.add_subscription(CHANNEL, 5)  # auto-start is off: nothing to wait for
        bridge = StandInBridge(context, lambda event: HELD)
        try:
            asked = bridge.next_event(cp.OnReceiveChannel)  # told on registration
            assert (asked.subscription_id, asked.stream_id) == (0, 5)
            wait_until(lambda: any(f"netbridge: channel {CHANNEL!r}: {HELD}" in text
                                   for text in errors(bus)), 5,
                       lambda: f"the refusal in the error log: {errors(bus)}")
        finally:
            bridge.close()
