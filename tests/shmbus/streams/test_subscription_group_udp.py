"""Subscription groups on aeron:udp: the members on bus B share the network images of
publishers on bus A (each bus with its own driver and netbridge, on loopback). Each task of
each publisher goes to exactly one member, checked by length and CRC, through many term
rotations of small terms (the receiver's window and term cleaning follow the group's claims);
a member SIGKILLed mid-claim has only the task in its hand done twice.

Processes and records as in tests/shmbus/streams/test_subscription_group.py (group_workers.py).
"""

from __future__ import annotations

import collections
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shmbus
from shmbus.shm.counters import GROUP_CLAIM, GROUP_MEMBERS, GROUP_POS
from tests.support.groups import (
    STREAM,
    all_tasks,
    assert_each_task_once_in_order,
    assert_only_the_task_in_hand_went_twice,
    counter_values,
    finish,
    offer_until_held,
    read_records,
    redelivered_once_members_are,
    start_group,
    start_slow_and_fast,
    wait_for_tasks,
)
from tests.support.networks import bus_pair, free_udp_port, stop_drivers
from tests.support.processes import CTX
from tests.support.workers import group_workers as gw

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def buses(shm_dir: Path) -> Any:
    """(bus A's context, bus B's, a channel on B's endpoint); 64 KiB udp terms, so a run
    wraps the image's terms many times."""
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, client_liveness_timeout=2.0,
                                       keepalive_interval=0.1, timer_interval=0.02,
                                       udp_term_length=65536)
    try:
        yield ctx_a, ctx_b, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    finally:
        stop_drivers(drivers)


@pytest.mark.parametrize("lengths", [(gw.HEAD.size, 200), (900, 6000)],
                         ids=["small", "fragmented"])
def test_members_on_another_bus_get_each_task_of_each_publisher_exactly_once(
        buses: Any, tmp_path: Path, start_process: Callable[..., Any],
        lengths: tuple[int, int]) -> None:
    publishers, tasks = 2, 4000 if lengths[1] < 1000 else 300
    stop, results, paths, members, pubs = start_group(
        start_process, buses[:2], tmp_path, channel=buses[2], members=3, publishers=publishers,
        tasks=tasks, lengths=lengths)
    records = wait_for_tasks(paths, all_tasks(publishers, tasks), 150, members + pubs)
    with shmbus.connect(buses[1]) as bus:  # the publishers share one log: one image
        assert counter_values(bus, GROUP_MEMBERS) == [3]
    reports = finish(stop, results, members + pubs, 3 + publishers)
    assert_each_task_once_in_order(records, reports, publishers, tasks)


def test_a_member_sigkilled_mid_claim_has_only_the_task_in_its_hand_done_twice(
        buses: Any, tmp_path: Path, start_process: Callable[..., Any]) -> None:
    tasks, lengths = 3000, (gw.HEAD.size, 100)
    holding = CTX.Event()
    stop, results, paths, members, pubs = start_group(
        start_process, buses[:2], tmp_path, channel=buses[2], members=3, publishers=1,
        tasks=tasks, lengths=lengths, options={0: {"hold_at": 50, "holding": holding}})
    assert holding.wait(60), "the victim never reached its 50th task"
    os.kill(members[0].pid, signal.SIGKILL)
    members[0].join(10)
    in_hand = read_records([paths[0]])[paths[0]][-1]
    records = wait_for_tasks(paths, all_tasks(1, tasks), 150, members + pubs)
    redelivered = redelivered_once_members_are(buses[1], 2)  # B's driver timed it out
    finish(stop, results, members[1:] + pubs, 2 + 1)
    assert_only_the_task_in_hand_went_twice(records, all_tasks(1, tasks), in_hand, paths[0],
                                            50, redelivered)


def test_the_receiver_holds_the_publisher_behind_the_groups_oldest_unfinished_claim(
        buses: Any, tmp_path: Path, start_process: Callable[..., Any]) -> None:
    """A member holds a claim unfinished while another takes everything else: the publisher
    on bus A stops within a window or two of that claim (B's receiver follows the group's
    claim records, never cleaning under them), and when the claim is done every task is
    there exactly once."""
    ctx_a, ctx_b, channel = buses
    lengths = (gw.HEAD.size, 64)
    term_length = ctx_a.udp_term_length
    with shmbus.connect(ctx_a) as bus_a, shmbus.connect(ctx_b) as bus_b:
        publication = bus_a.add_publication(channel, STREAM)
        stop, release, results, paths, processes = start_slow_and_fast(
            start_process, ctx_b, publication, lengths, tmp_path, channel)
        claim_start = min(counter_values(bus_b, GROUP_CLAIM))
        seq = offer_until_held(publication, lengths, 1, 60)
        # held within the receiver's window (half a term) and the publication's own
        assert publication.position - claim_start <= term_length
        assert min(counter_values(bus_b, GROUP_CLAIM)) == claim_start
        assert counter_values(bus_b, GROUP_POS)[0] > claim_start
        release.set()
        total = seq + 2000
        for rest in range(seq, total):
            publication.publish(gw.make_task(0, rest, lengths), timeout=30)
        records = wait_for_tasks(paths, all_tasks(1, total), 90, processes)
    finish(stop, results, processes, 2)
    handed = collections.Counter(t for tasks_ in records.values() for t in tasks_)
    assert len(handed) == total and max(handed.values()) == 1
