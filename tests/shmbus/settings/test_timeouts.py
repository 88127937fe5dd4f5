"""The one timeout rule (shmbus/settings/timeouts.py): ``None`` waits forever, ``0`` tries
once, a number is a deadline in seconds; and every ``_async`` twin takes its sync twin's
arguments and defaults.

Each "forever" is checked by a call that waits for something another thread does once the
call is asleep (a subscriber joining, a message arriving), bounded by the test's timeout.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import shmbus
from shmbus.settings.timeouts import deadline_after
from tests.support.sleepers import subscription_sleepers, writers_asleep
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(60)


def test_none_is_forever_zero_is_now_and_a_number_is_a_deadline() -> None:
    assert deadline_after(None) == math.inf
    before = time.monotonic()
    assert before <= deadline_after(0) <= time.monotonic()
    assert before + 2.5 <= deadline_after(2.5) <= time.monotonic() + 2.5


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan")])
def test_a_negative_or_nan_timeout_is_refused_by_name(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout must be None .* not"):
        deadline_after(bad)


def _async_twins() -> Iterator[tuple[type, str]]:
    for cls in (shmbus.Publication, shmbus.ExclusivePublication, shmbus.Subscription,
                shmbus.GroupSubscription, shmbus.Requester, shmbus.Responder):
        for name in dir(cls):
            if name.endswith("_async") and not name.startswith("_"):
                yield cls, name


def _parameters(method: Callable[..., object]) -> list[tuple[str, object]]:
    """(name, default) of each parameter but ``self``; a method of the native core has its
    signature on the first line of its docstring."""
    try:
        parameters = inspect.signature(method).parameters.values()
        return [(p.name, None if p.default is p.empty else p.default)
                for p in parameters if p.name != "self"]
    except ValueError:
        head = (method.__doc__ or "").split("\n")[0]
        args = ast.parse(f"def f{head[head.index('('):head.rindex(')') + 1]}: pass").body[0].args
        names = [a.arg for a in (*args.args, *([args.vararg] if args.vararg else ()),
                                  *args.kwonlyargs)]
        defaults = [None] * (len(args.args) - len(args.defaults)) + [
            ast.literal_eval(d) for d in args.defaults]
        defaults += [None] * (1 if args.vararg else 0)
        defaults += [None if d is None else ast.literal_eval(d) for d in args.kw_defaults]
        return list(zip(names, defaults, strict=True))


def test_every_async_twin_takes_its_sync_twins_arguments_and_defaults() -> None:
    twins = list(_async_twins())
    assert len(twins) >= 10
    for cls, name in twins:
        expected = _parameters(getattr(cls, name.removesuffix("_async")))
        assert _parameters(getattr(cls, name)) == expected, f"{cls.__name__}.{name}"


def _later(asleep: Callable[[], bool], action: Callable[[], object]) -> threading.Thread:
    """A thread that runs ``action`` once the waiting call is asleep (``asleep()``): what it
    waits for comes only while it waits."""
    def run() -> None:
        wait_until(asleep, 10, "the waiting call to sleep")
        action()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def bus(bus_context, driver) -> Iterator[shmbus.Client]:
    with shmbus.connect(bus_context) as client:
        yield client


def test_publish_zero_tries_once_and_none_waits_for_a_subscriber(bus: shmbus.Client) -> None:
    pub = bus.add_publication("aeron:ipc", 71)
    with pytest.raises(shmbus.PublicationError) as refused:
        pub.publish(b"x", timeout=0)
    assert refused.value.code == shmbus.codes.NOT_CONNECTED
    subscriptions = []
    joiner = _later(lambda: writers_asleep(pub.log) > 0,
                    lambda: subscriptions.append(bus.add_subscription("aeron:ipc", 71)))
    assert pub.publish(b"hello", timeout=None) > 0
    joiner.join()
    assert list(subscriptions[0].messages(timeout=5)) == [b"hello"]


def test_claim_array_tries_once_by_default_and_none_waits(bus: shmbus.Client) -> None:
    pub = bus.add_exclusive_publication("aeron:ipc", 72)
    claim = pub.claim_array((4,), np.int64)
    assert not claim and claim.result == shmbus.codes.NOT_CONNECTED
    subscriptions = []
    refused = [0]  # claim_array's retries sleep in Python: counted here, as they are refused
    try_claim = pub.try_claim

    def counted_try_claim(length: int) -> object:
        claim = try_claim(length)
        refused[0] += not claim
        return claim

    pub.try_claim = counted_try_claim  # type: ignore[method-assign]
    joiner = _later(lambda: refused[0] >= 2,
                    lambda: subscriptions.append(bus.add_subscription("aeron:ipc", 72)))
    with pub.claim_array((4,), np.int64, timeout=None) as claim:
        claim.array[:] = [1, 2, 3, 4]
    joiner.join()
    arrays = list(subscriptions[0].arrays(timeout=5, copy=True))
    assert len(arrays) == 1 and arrays[0].tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("group", [None, "workers"])
def test_poll_does_not_wait_by_default_and_none_waits_for_a_fragment(
        bus: shmbus.Client, group: str | None) -> None:
    sub = bus.add_subscription("aeron:ipc", 73, group=group)
    pub = bus.add_publication("aeron:ipc", 73)
    got: list[bytes] = []

    def handler(buffer: memoryview, header: object) -> None:
        got.append(bytes(buffer))

    assert sub.poll(handler, 10) == 0
    assert sub.poll(handler, 10, timeout=0) == 0
    writer = _later(lambda: subscription_sleepers(sub) > 0,
                    lambda: pub.publish(b"woken", timeout=5))
    assert sub.poll(handler, 10, timeout=None) == 1
    writer.join()
    assert got == [b"woken"]


def test_wait_async_and_views_async_wait_as_their_sync_twins_do(bus: shmbus.Client) -> None:
    sub = bus.add_subscription("aeron:ipc", 74)
    pub = bus.add_publication("aeron:ipc", 74)

    async def main() -> list[bytes]:
        assert await sub.wait_async(0.05) is False
        writer = _later(lambda: subscription_sleepers(sub) > 0,
                        lambda: pub.publish(b"awaited", timeout=5))
        assert await sub.wait_async(None) is True
        writer.join()
        return [bytes(view.buffer) async for view in sub.views_async(timeout=0.5)]

    assert asyncio.run(main()) == [b"awaited"]
