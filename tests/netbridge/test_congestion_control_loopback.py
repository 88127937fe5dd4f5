"""CUBIC congestion control between two buses on loopback: real drivers, netbridges and
processes; loss injected by the sending netbridge for a span of time only."""

from __future__ import annotations

import multiprocessing as mp
import time

import shmbus
from netbridge.receiver import RECEIVER_WINDOW_DEFAULT
from shmbus.shm.counters import RCV_CC_WINDOW
from tests.support.drivers import stop_driver
from tests.support.networks import bus_pair, free_udp_port
from tests.support.workers import bridge_workers

MTU = 1408
RATE = 4000  # messages a second: a steady stream that a window of one MTU still carries
MESSAGES = 9 * RATE
#: the sender's bridge drops 10% of what it sends from 3 s to 5 s after its first datagram
LOSS = "drop=0.1,start=3,stop=5,seed=5"


def sample(bus: shmbus.Client) -> tuple[int | None, int]:
    """(the image's rcv-cc-window, or None before there is one; the receive channel's gaps)."""
    window, gaps = None, 0
    for counter in bus.counters.counters():
        if counter.type_id == RCV_CC_WINDOW:
            window = counter.value
        elif counter.type_id >= 100 and counter.label.startswith("gaps:"):
            gaps = counter.value
    return window, gaps


def test_cubic_backs_off_while_datagrams_are_lost_and_recovers_after(shm_dir) -> None:
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, loss=(LOSS, ""))
    channel = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|cc=cubic"
    spawn = mp.get_context("spawn")
    samples: list[tuple[float, int, int]] = []  # (time, window, gaps) once the image is there
    try:
        with spawn.Pool(2) as pool, shmbus.connect(ctx_b) as bus:
            ready = spawn.Manager().Event()
            sub = pool.apply_async(bridge_workers.receive,
                                   (ctx_b, channel, 7, MESSAGES, 90, ready))
            assert ready.wait(30)
            pub = pool.apply_async(bridge_workers.publish,
                                   (ctx_a, channel, 7, MESSAGES, 90, RATE))
            deadline = time.monotonic() + 100
            while not sub.ready():
                assert time.monotonic() < deadline, "the stream never completed"
                window, gaps = sample(bus)
                # (0 until the bridge first writes the counter it just allocated; never after)
                if window is not None and (window or samples):
                    samples.append((time.monotonic(), window, gaps))
                time.sleep(0.01)
            summary = sub.get()
            assert pub.get(30) == MESSAGES
        # the stream is exact: every message once, in order, with its checksum
        assert (summary["received"], summary["first"], summary["last"]) == (
            MESSAGES, 0, MESSAGES - 1)
        assert (summary["gaps"], summary["backwards"], summary["bad_checksum"]) == (0, 0, 0)
        assert summary["images"] == 1

        windows = [window for _, window, _ in samples]
        assert windows[0] == 10 * MTU  # cubic's first window
        assert all(MTU <= window <= RECEIVER_WINDOW_DEFAULT for window in windows)
        final_gaps = samples[-1][2]
        assert final_gaps > 0, "no loss was injected"
        loss_began = next(i for i, (_, _, gaps) in enumerate(samples) if gaps > 0)
        loss_ended = next(i for i, (_, _, gaps) in enumerate(samples) if gaps == final_gaps)
        # (one sample may show a cut window beside the gap count from before the loss: the
        # counters are read one by one)
        before = windows[:loss_began - 1]
        during = windows[loss_began:loss_ended + 1]
        after = windows[loss_ended:]
        # it grew while nothing was lost, then backed off (and never grew past that)
        assert before == sorted(before) and before[-1] > 10 * MTU
        assert min(during) < before[-1]
        # after the last loss it grew again
        assert after[-1] > after[0] and after == sorted(after)
        assert samples[loss_ended][0] - samples[loss_began][0] > 1.0  # the loss lasted
    finally:
        for process in drivers:
            stop_driver(process)
