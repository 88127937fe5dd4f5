"""The client and the driver together, in one test process plus the driver process."""

from __future__ import annotations

import os
import time

import pytest

import shmbus
from shmbus.shm import control_protocol as cp
from shmbus.shm.counters import FC_RCV_POS
from tests.support.waits import wait_until


def test_publish_and_subscribe_through_the_driver(bus_context, driver) -> None:
    events = []
    with shmbus.connect(bus_context) as bus:
        sub = bus.add_subscription("aeron:ipc", 7, on_available_image=lambda i: events.append(
            ("available", i.session_id)))
        pub = bus.add_publication("aeron:ipc", 7)
        wait_until(lambda: sub.images, 5.0, "the publication's image",
                   poll=lambda: sub.poll(lambda b, h: None, 1))
        assert pub.is_connected
        assert events == [("available", pub.session_id)]
        got = []
        assembler = shmbus.FragmentAssembler(lambda b, h: got.append(bytes(b)))
        for i in range(1000):  # 450 KB through a 32 KB window: publish and read in turn
            message = i.to_bytes(4, "little") * 100
            wait_until(lambda m=message: pub.offer(m) > 0, 10, f"room for message {i}",
                       poll=lambda: sub.poll(assembler, 100))
        wait_until(lambda: len(got) == 1000, 5.0, "a thousand messages",
                   poll=lambda: sub.poll(assembler, 100))
        assert [int.from_bytes(m[:4], "little") for m in got] == list(range(1000))


def test_no_subscriber_is_not_connected(bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 8)
        assert not pub.is_connected
        assert pub.offer(b"x") == shmbus.codes.NOT_CONNECTED


def test_late_subscriber_starts_at_the_current_position(bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus:
        early = bus.add_subscription("aeron:ipc", 9)
        pub = bus.add_publication("aeron:ipc", 9)
        for i in range(10):
            pub.publish(bytes([i]))
        late = bus.add_subscription("aeron:ipc", 9)
        wait_until(lambda: late.images, 5.0, "the late subscriber's image",
                   poll=lambda: late.poll(lambda b, h: None, 1))
        assert late.images[0].position == pub.position
        pub.publish(b"after")
        assert list(late.messages(timeout=0.3)) == [b"after"]
        assert len(list(early.messages(timeout=0.3))) == 11


@pytest.mark.parametrize(("channel", "stream_id", "fragment"), [
    ("aeron:ipc?tether=maybe", 1, "tether='maybe'"),
    ("aeron:ipc?term-length=1000", 1, "term length 1000"),
    ("aeron:ipcx", 1, "unknown media 'ipcx'"),
    ("aeron:ipc?endpoint=a:1", 1, "endpoint is not a parameter of ipc"),
    ("aeron:ipc", 0, "stream_id 0 is reserved"),
    ("aeron:udp?endpoint=127.0.0.1:40999|cc=reno", 1, "cc='reno' is not a congestion control"),
    ("nonsense", 1, "must start with 'aeron:'"),
])
def test_bad_channels_are_refused_with_the_reason(bus_context, driver, channel, stream_id,
                                                  fragment) -> None:
    with shmbus.connect(bus_context) as bus:
        with pytest.raises(shmbus.RegistrationError, match=fragment) as info:
            bus.add_publication(channel, stream_id)
        assert info.value.code in (cp.INVALID_CHANNEL,)
        with pytest.raises(shmbus.RegistrationError, match=fragment):
            bus.add_subscription(channel, stream_id)
        # the client still works after a refusal
        bus.add_publication("aeron:ipc", 3).close()


INT32_RANGE = "-2147483648..2147483647"


def test_ids_outside_int32_are_refused_naming_the_parameter_and_range(bus_context,
                                                                       driver) -> None:
    with shmbus.connect(bus_context) as bus:
        adds = (bus.add_publication, bus.add_exclusive_publication, bus.add_subscription)
        for add in adds:
            for stream_id in (2**31, -(2**31) - 1, 2**63):
                with pytest.raises(ValueError, match=f"stream_id={stream_id} is outside "
                                                     f"{INT32_RANGE}"):
                    add("aeron:ipc", stream_id)
            for session_id in (2**31, -(2**31) - 1):
                with pytest.raises(shmbus.RegistrationError,
                                   match=f"session-id={session_id} is outside {INT32_RANGE}"):
                    add(f"aeron:ipc?session-id={session_id}", 11)
        assert not bus._subscriptions  # a refused subscription leaves nothing behind
        # the edges of the range are stream and session ids like any other
        for stream_id in (2**31 - 1, -(2**31)):
            sub = bus.add_subscription("aeron:ipc?session-id=-2147483648", stream_id)
            pub = bus.add_exclusive_publication("aeron:ipc?session-id=-2147483648", stream_id)
            assert pub.session_id == -(2**31)
            pub.publish(b"edge", timeout=5)
            assert list(sub.messages(timeout=1)) == [b"edge"]
            pub.close()
            sub.close()


@pytest.mark.parametrize(("channel", "parameter"), [
    ("aeron:udp?endpoint=nosuchhost.invalid:40611", "endpoint"),
    ("aeron:udp?endpoint=127.0.0.1:40612|control=nosuchhost.invalid:40613", "control"),
    ("aeron:udp?control=nosuchhost.invalid:40614|control-mode=manual", "control"),
    ("aeron:udp?endpoint=127.0.0.1:40615|interface=nosuchhost.invalid", "interface"),
    ("aeron:udp?endpoint=127.0.0.1:40616|interface=nosuchhost.invalid:0", "interface"),
])
def test_unresolvable_hosts_are_refused_when_added(bus_context, driver, channel,
                                                   parameter) -> None:
    """As Aeron's driver does: a channel whose host does not resolve is refused when it is
    added, naming the parameter and the host, instead of never connecting."""
    fragment = f"{parameter} host 'nosuchhost.invalid' does not resolve"
    with shmbus.connect(bus_context) as bus:
        for add in (bus.add_publication, bus.add_exclusive_publication, bus.add_subscription):
            with pytest.raises(shmbus.RegistrationError, match=fragment) as info:
                add(channel, 12)
            assert info.value.code == cp.INVALID_CHANNEL
        assert not os.path.exists(os.path.join(bus_context.dir, "logs")) or not os.listdir(
            os.path.join(bus_context.dir, "logs"))


def test_destinations_and_names_that_resolve(bus_context, driver) -> None:
    """A resolvable name is as good as an address; a destination that does not resolve is
    refused like a channel."""
    with shmbus.connect(bus_context) as bus:
        sub = bus.add_subscription("aeron:udp?endpoint=localhost:40621", 13)
        pub = bus.add_exclusive_publication(
            "aeron:udp?endpoint=localhost:40621|interface=localhost", 13)
        wait_until(lambda: pub.is_connected, 20, "the publication by name to connect")
        pub.publish(b"by name", timeout=5)
        assert list(sub.messages(timeout=2)) == [b"by name"]
        mdc = bus.add_exclusive_publication(
            "aeron:udp?control=localhost:40622|control-mode=manual", 13)
        with pytest.raises(shmbus.RegistrationError,
                           match="endpoint host 'nosuchhost.invalid' does not resolve"):
            mdc.add_destination("aeron:udp?endpoint=nosuchhost.invalid:40623")


def test_second_driver_on_a_live_directory_is_refused(bus_context, driver) -> None:
    from shmbus.driver.media_driver import Driver, DriverAlreadyRunningError

    with pytest.raises(DriverAlreadyRunningError, match=f"pid {driver.pid}"):
        Driver(bus_context).start()


def test_no_driver_and_no_embedding_says_how_to_start_one(bus_context) -> None:
    with pytest.raises(shmbus.DriverUnavailableError, match="shmbus driver --dir"):
        shmbus.connect(bus_context)


def test_directory_of_another_user_is_refused(bus_context) -> None:
    os.makedirs(bus_context.dir)
    os.chown(bus_context.dir, 12345, 12345)
    with pytest.raises(PermissionError, match="owned by uid 12345"):
        shmbus.connect(bus_context)


def test_driver_pid_names_the_driver_process(bus_context, driver) -> None:
    bus = shmbus.connect(bus_context)
    assert bus.driver_pid == driver.pid
    bus.close()
    assert bus.driver_pid == driver.pid  # still readable after close


def test_embedded_driver_starts_and_exits_when_idle(bus_context) -> None:
    context = bus_context.with_(embedded_driver=True, driver_idle_timeout=0.5)
    with shmbus.connect(context) as bus:
        pid = bus.cnc.pid
        assert pid != os.getpid()
        assert oct(os.stat(context.dir).st_mode & 0o777) == "0o700"
        assert os.stat(os.path.join(context.dir, "cnc.dat")).st_mode & 0o777 == 0o600
        second = shmbus.connect(context)  # finds the running driver
        assert second.cnc.pid == pid
        second.close()
    wait_until(lambda: not os.path.exists(os.path.join(context.dir, "cnc.dat")), 10,
               "the idle embedded driver to exit")


def test_client_is_not_usable_after_fork(bus_context, driver) -> None:
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 5)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child reports what it sees, then leaves without cleanup
            try:
                bus.add_publication("aeron:ipc", 5)
                message = b"no error"
            except shmbus.ShmbusError as e:
                message = str(e).encode()
            message += b"|" + str(pub.offer(b"x")).encode()
            os.write(write, message)
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        text, offer_result = os.read(read, 1000).decode().split("|")
        os.close(read)
        assert "after fork, call shmbus.connect() again in the child" in text
        assert int(offer_result) == shmbus.codes.CLOSED


def test_context_pickles_and_reads_the_environment(monkeypatch, bus_context) -> None:
    import pickle

    monkeypatch.setenv("SHMBUS_DRIVER_TIMEOUT", "3.5")
    monkeypatch.setenv("SHMBUS_IPC_TERM_LENGTH", "131072")
    context = shmbus.Context.resolve(dir="/tmp/x", ipc_term_length=65536)
    assert context.driver_timeout == 3.5  # environment
    assert context.ipc_term_length == 65536  # keyword wins over the environment
    assert pickle.loads(pickle.dumps(context)) == context
    monkeypatch.setenv("SHMBUS_MTU", "big")
    with pytest.raises(ValueError, match="SHMBUS_MTU='big'"):
        shmbus.Context.resolve()
    with pytest.raises(TypeError, match="unknown setting 'bogus'"):
        shmbus.Context.resolve(bogus=1)
    with pytest.raises(ValueError, match="driver_timeout must be a positive number"):
        shmbus.Context(driver_timeout=0)
    assert shmbus.Context(netbridge_busy_window=0).netbridge_busy_window == 0  # sleep at once
    with pytest.raises(ValueError, match="netbridge_busy_window must be a positive number"):
        shmbus.Context(netbridge_busy_window=-1e-6)


def test_a_client_adds_and_removes_its_own_counters_only(bus_context, driver) -> None:
    """AddLinkedCounter / FreeCounter (what the netbridge uses for its per-receiver counters): the
    counter carries the registration and reference ids asked for, only its owner may remove
    it, and a removed one is gone from the counters."""
    with shmbus.connect(bus_context) as owner, shmbus.connect(bus_context) as other:
        ready = owner._request(cp.AddLinkedCounter(owner.client_id, owner._correlation(),
                                                   FC_RCV_POS, 77, -5,
                                                   "fc-rcv-pos: 77 -5 9 aeron:udp?endpoint=h:1"))
        assert isinstance(ready, cp.OnCounterReady)
        counter = owner.counters.counter(ready.counter_id)
        assert (counter.type_id, counter.registration_id, counter.reference_id) == (
            FC_RCV_POS, 77, -5)
        assert counter.owner_id == owner.client_id
        with pytest.raises(shmbus.RegistrationError, match=f"counter {ready.counter_id}"):
            other._request(cp.FreeCounter(other.client_id, other._correlation(),
                                          ready.counter_id))
        owner._request(cp.FreeCounter(owner.client_id, owner._correlation(), ready.counter_id))
        assert ready.counter_id not in {c.counter_id for c in owner.counters.counters()}


def test_a_client_whose_driver_died_lets_go_of_its_files_without_the_garbage_collector(
        bus_context) -> None:
    """A long-lived process that outlives many drivers must not keep each dead driver's
    cnc.dat and logs mapped (deleted files on /dev/shm hold their memory): dropping the failed
    client frees them by reference counting alone, with no cycle left for the collector."""
    import gc
    import signal

    from tests.support.drivers import start_driver, stop_driver

    def mapped_deleted_files() -> list[str]:
        with open("/proc/self/maps") as maps:
            return [line.split()[-2] for line in maps
                    if line.rstrip().endswith("(deleted)") and bus_context.dir in line]

    gc.disable()
    try:
        for _ in range(2):
            driver = start_driver(bus_context)
            try:
                client = shmbus.connect(bus_context)
                subscription = client.add_subscription("aeron:ipc", 1)
                publication = client.add_exclusive_publication("aeron:ipc", 1)
                wait_until(lambda s=subscription: s.images, 10, "the subscription's image")
                deadline = time.monotonic() + 10
                driver.send_signal(signal.SIGKILL)
                driver.wait()
                with pytest.raises(shmbus.DriverTimeoutError):
                    while time.monotonic() < deadline + 20:
                        subscription.poll(lambda buffer, header: None, 10, timeout=0.1)
                client.close()
                client = subscription = publication = None  # noqa: F841
            finally:
                stop_driver(driver)
        replacement = start_driver(bus_context)  # removes the last dead driver's files
        try:
            assert mapped_deleted_files() == []
        finally:
            stop_driver(replacement)
    finally:
        gc.enable()
