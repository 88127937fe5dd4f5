"""Subscription groups across real processes on a real bus: each task to exactly one member,
fragmented tasks, members joining and leaving, a member SIGKILLed mid-stream (at least once:
only the task in its hand is done twice), and flow control holding the publisher behind the
group's slowest unfinished claim; on aeron:udp the same across two buses, the members on bus B
sharing the network images of publishers on bus A (each bus with its own driver and netbridge,
on loopback), through many term rotations of small terms (the receiver's window and term
cleaning follow the group's claims).

Members and publishers are spawn processes (tests/support/workers/group_workers.py). Every member
checks each task's length and CRC and records (publisher, seq) in its own file as it is handed
the task, so the test counts how often every task was handed out, also for a killed member.
"""

from __future__ import annotations

import collections
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shmbus
from shmbus.settings.channel_uri import CONSUMER_GROUP
from shmbus.shm.counters import GROUP_CLAIM, GROUP_MEMBERS, GROUP_POS, GROUP_REDELIVERED
from tests.support.groups import (
    STREAM,
    all_tasks,
    assert_each_task_once_in_order,
    assert_only_the_task_in_hand_went_twice,
    collect,
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
def ipc_buses(driver: Any, bus_context: shmbus.Context) -> Any:
    """(the publishers' context, the members', the channel): one bus, on IPC."""
    return bus_context, bus_context, gw.CHANNEL


@pytest.fixture
def udp_buses(shm_dir: Path) -> Any:
    """(bus A's context, bus B's, a channel on B's endpoint); 64 KiB udp terms, so a run
    wraps the image's terms many times."""
    (ctx_a, ctx_b), drivers = bus_pair(shm_dir, client_liveness_timeout=2.0,
                                       keepalive_interval=0.1, timer_interval=0.02,
                                       udp_term_length=65536)
    try:
        yield ctx_a, ctx_b, f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}"
    finally:
        stop_drivers(drivers)


@pytest.mark.parametrize("lengths, fragment_limit, messages",
                         [((gw.HEAD.size, 200), 16, False), ((900, 6000), 2, False),
                          ((900, 6000), 8, True)],
                         ids=["small", "fragmented", "fragmented-messages"])
def test_four_members_get_each_task_of_each_publisher_exactly_once(
        driver: Any, bus_context: shmbus.Context, tmp_path: Path,
        start_process: Callable[..., Any], lengths: tuple[int, int],
        fragment_limit: int, messages: bool) -> None:
    publishers, tasks = 2, 3000 if lengths[1] < 1000 else 400
    go = CTX.Event()
    go.set()  # the first half as fast as it goes, the second paced: every member gets a turn
    stop, results, paths, members, pubs = start_group(
        start_process, (bus_context, bus_context), tmp_path, members=4, publishers=publishers,
        tasks=tasks, lengths=lengths, fragment_limit=fragment_limit,
        options={i: {"messages": messages} for i in range(4)},
        pause_at=tasks // 2, resume=go, pace_after_pause_s=0.0001)
    records = wait_for_tasks(paths, all_tasks(publishers, tasks), 120, members + pubs)
    with shmbus.connect(bus_context) as bus:
        assert counter_values(bus, GROUP_MEMBERS) == [4]
    reports = finish(stop, results, members + pubs, 4 + publishers)
    assert_each_task_once_in_order(records, reports, publishers, tasks)
    assert sum(1 for tasks_ in records.values() if tasks_) >= 2


def test_members_joining_and_leaving_mid_stream_lose_nothing_and_repeat_nothing(
        driver: Any, bus_context: shmbus.Context, tmp_path: Path,
        start_process: Callable[..., Any]) -> None:
    tasks, lengths = 6000, (gw.HEAD.size, 64)
    resume = CTX.Event()
    stop, results, paths, members, pubs = start_group(
        start_process, (bus_context, bus_context), tmp_path, members=2, publishers=1, tasks=tasks,
        lengths=lengths, options={1: {"leave_after": 300}}, pause_at=tasks // 2, resume=resume,
        pace_after_pause_s=0.001)
    wait_for_tasks(paths, all_tasks(1, tasks // 2), 60, members + pubs)
    # a member joins between the halves (when the leaver has left)
    late = tmp_path / "late.rec"
    joined = CTX.Event()
    members.append(start_process(gw.work, bus_context, STREAM, "workers", str(late), stop,
                                 lengths, results, joined=joined))
    assert joined.wait(30)
    paths.append(late)
    resume.set()
    records = wait_for_tasks(paths, all_tasks(1, tasks), 120, members + pubs)
    with shmbus.connect(bus_context) as bus:
        assert counter_values(bus, GROUP_MEMBERS) == [2]  # one left, one joined
        assert counter_values(bus, GROUP_REDELIVERED) == [0]
    finish(stop, results, members + pubs, 4)
    handed = collections.Counter(t for tasks_ in records.values() for t in tasks_)
    assert max(handed.values()) == 1 and len(handed) == tasks
    assert 300 <= len(records[paths[1]]) < tasks  # the leaver did its part, then stopped
    assert records[late], "the member that joined got no task"


#: per transport: the members, the tasks, and the seconds every task has to be done
SIGKILL_RUNS = {"ipc": (4, 4000, 120), "udp": (3, 3000, 150)}


@pytest.mark.parametrize("transport", sorted(SIGKILL_RUNS))
def test_a_member_sigkilled_mid_claim_has_only_the_task_in_its_hand_done_twice(
        request: pytest.FixtureRequest, transport: str, tmp_path: Path,
        start_process: Callable[..., Any]) -> None:
    publishing, working, channel = request.getfixturevalue(f"{transport}_buses")
    members_count, tasks, seconds = SIGKILL_RUNS[transport]
    lengths = (gw.HEAD.size, 100)
    holding, go = CTX.Event(), CTX.Event()
    go.set()  # paced from the first task: the victim gets its 50 however it is scheduled
    stop, results, paths, members, pubs = start_group(
        start_process, (publishing, working), tmp_path, channel=channel, members=members_count,
        publishers=1, tasks=tasks, lengths=lengths,
        options={0: {"hold_at": 50, "holding": holding}},
        pause_at=0, resume=go, pace_after_pause_s=0.0001)
    assert holding.wait(60), "the victim never reached its 50th task"
    victim = members[0]
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(10)
    in_hand = read_records([paths[0]])[paths[0]][-1]
    records = wait_for_tasks(paths, all_tasks(1, tasks), seconds, members + pubs)
    # the members' driver timed the victim out
    redelivered = redelivered_once_members_are(working, members_count - 1)
    finish(stop, results, members[1:] + pubs, members_count)
    assert_only_the_task_in_hand_went_twice(records, all_tasks(1, tasks), in_hand, paths[0],
                                            50, redelivered)


def test_flow_control_holds_the_publisher_behind_the_groups_oldest_unfinished_claim(
        driver: Any, bus_context: shmbus.Context, tmp_path: Path,
        start_process: Callable[..., Any]) -> None:
    lengths = (gw.HEAD.size, 64)
    with shmbus.connect(bus_context) as bus:
        publication = bus.add_publication(gw.CHANNEL, STREAM)
        stop, release, results, paths, processes = start_slow_and_fast(
            start_process, bus_context, publication, lengths, tmp_path)
        claim_start = min(counter_values(bus, GROUP_CLAIM))
        # the fast member takes everything else; the publisher must stop a window past the
        # slow member's claim, however far the group position goes
        seq = offer_until_held(publication, lengths, 1, 40)
        window = publication.log.publication_window
        assert publication.position_limit <= claim_start + window
        assert publication.position > claim_start + window - 256
        assert counter_values(bus, GROUP_POS)[0] > claim_start
        assert min(counter_values(bus, GROUP_CLAIM)) == claim_start
        # the slow member finishes: the publisher goes on
        release.set()
        total = seq + 2000
        for rest in range(seq, total):
            publication.publish(gw.make_task(0, rest, lengths), timeout=30)
        records = wait_for_tasks(paths, all_tasks(1, total), 60, processes)
    stop.set()
    collect(results, 2, 60)
    handed = collections.Counter(t for tasks_ in records.values() for t in tasks_)
    assert len(handed) == total and max(handed.values()) == 1


@pytest.mark.parametrize("lengths", [(gw.HEAD.size, 200), (900, 6000)],
                         ids=["small", "fragmented"])
def test_members_on_another_bus_get_each_task_of_each_publisher_exactly_once(
        udp_buses: Any, tmp_path: Path, start_process: Callable[..., Any],
        lengths: tuple[int, int]) -> None:
    publishers, tasks = 2, 4000 if lengths[1] < 1000 else 300
    stop, results, paths, members, pubs = start_group(
        start_process, udp_buses[:2], tmp_path, channel=udp_buses[2], members=3,
        publishers=publishers, tasks=tasks, lengths=lengths)
    records = wait_for_tasks(paths, all_tasks(publishers, tasks), 150, members + pubs)
    with shmbus.connect(udp_buses[1]) as bus:  # the publishers share one log: one image
        assert counter_values(bus, GROUP_MEMBERS) == [3]
    reports = finish(stop, results, members + pubs, 3 + publishers)
    assert_each_task_once_in_order(records, reports, publishers, tasks)


def test_the_receiver_holds_the_publisher_behind_the_groups_oldest_unfinished_claim(
        udp_buses: Any, tmp_path: Path, start_process: Callable[..., Any]) -> None:
    """A member holds a claim unfinished while another takes everything else: the publisher
    on bus A stops within a window or two of that claim (B's receiver follows the group's
    claim records, never cleaning under them), and when the claim is done every task is
    there exactly once."""
    ctx_a, ctx_b, channel = udp_buses
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


def test_bad_group_arguments_are_refused_with_the_reason(
        driver: Any, bus_context: shmbus.Context) -> None:
    with shmbus.connect(bus_context) as bus:
        with pytest.raises(ValueError, match="group name 'a b'"):
            bus.add_subscription("aeron:ipc", STREAM, group="a b")
        with pytest.raises(ValueError, match="names a consumer-group already"):
            bus.add_subscription(f"aeron:ipc?{CONSUMER_GROUP}=x", STREAM, group="y")
        with pytest.raises(shmbus.RegistrationError, match="consumer-group is for aeron:ipc "
                                                          "and aeron:udp subscriptions, not"):
            bus.add_subscription("aeron-spy:aeron:udp?endpoint=127.0.0.1:40999", STREAM,
                                 group="w")
        member = bus.add_subscription(f"aeron:ipc?{CONSUMER_GROUP}=w", STREAM)
        assert isinstance(member, shmbus.GroupSubscription) and member.group == "w"
        with pytest.raises(TypeError, match="poll"):
            member.controlled_poll(lambda b, h: None)
        with pytest.raises(TypeError, match="poll"):
            member.poll_batch(lambda batch: None)
        # nothing was left behind by the refusals: one group, one member
        bus.add_publication("aeron:ipc", STREAM)
        deadline = time.monotonic() + 5
        while not member.images:
            assert time.monotonic() < deadline
            member.poll(lambda b, h: None)
        assert counter_values(bus, GROUP_MEMBERS) == [1]
