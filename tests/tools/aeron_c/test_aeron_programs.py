"""The C test programs (tools/aeron_c/c/) against Aeron's own C media driver (aeronmd,
built by tools/aeron_c/build.sh): what they report is what happened, so they can judge another
driver. Each test has its own driver on a fresh directory; every program is a real process on
``aeron:ipc``.

A subscriber is started first and waited for (its READY line: subscription added), then the
publishers; each program's closing JSON line is checked, counts per publisher and zero errors.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.aeron_c import (
    AeronC,
    AeronCNotBuilt,
    Finished,
    Program,
    Programs,
    build_programs,
)
from tests.support.waits import wait_until

STREAM = 1001


def _published(finished: Finished, publisher_id: int, count: int) -> dict[str, Any]:
    """The summary of a publisher that sent all its messages."""
    assert finished.returncode == 0, finished.stderr
    summary = finished.summary
    assert summary["ok"] is True
    assert (summary["publisher_id"], summary["sent"], summary["count"]) == (
        publisher_id, count, count)
    return summary


def _received(finished: Finished, expected: dict[int, int]) -> dict[str, Any]:
    """The summary of a subscriber that got every expected message intact."""
    assert finished.returncode == 0, finished.stderr
    summary = finished.summary
    assert summary["ok"] is True and summary["errors"] == 0 and summary["error"] is None
    assert summary["received"] == {str(p): count for p, count in expected.items()}
    assert summary["messages"] == sum(expected.values())
    return summary


def _refused(finished: Finished, *fragments: str) -> dict[str, Any]:
    """The summary of a subscriber that stopped at a broken rule, its stderr naming it."""
    assert finished.returncode == 1, (finished.stdout, finished.stderr)
    summary = finished.summary
    assert summary["ok"] is False and summary["errors"] == 1
    for fragment in fragments:
        assert fragment in finished.stderr, finished.stderr
        assert fragment in summary["error"]
    return summary


def test_one_publisher_to_one_subscriber(programs: Programs) -> None:
    subscriber = programs.subscribe(stream=STREAM, expect={1: 10_000})
    subscriber.wait_ready()
    publisher = programs.publish(stream=STREAM, count=10_000, length=32, publisher_id=1)

    _published(publisher.finish(), 1, 10_000)
    summary = _received(subscriber.finish(), {1: 10_000})
    assert summary["bytes"] == 10_000 * 32


def test_a_publisher_awaiting_go_offers_after_the_go_line_and_both_say_when(
        programs: Programs) -> None:
    """--await-go: READY once connected, the first offer only after the go line; the
    CLOCK_MONOTONIC times both programs report bracket the run, in order."""
    subscriber = programs.subscribe(stream=STREAM, expect={1: 5_000})
    subscriber.wait_ready()
    publisher = programs.publish(stream=STREAM, count=5_000, length=32, publisher_id=1,
                                 await_go=True)
    publisher.wait_ready()
    go_at = time.monotonic()
    publisher.send_line("go")

    sent = _published(publisher.finish(), 1, 5_000)
    got = _received(subscriber.finish(), {1: 5_000})
    assert go_at <= sent["first_offer_at"] <= got["first_message_at"]
    assert sent["first_offer_at"] <= sent["last_sent_at"] <= got["last_message_at"]
    assert got["first_message_at"] <= got["last_message_at"] <= time.monotonic()


def test_a_publisher_awaiting_go_stops_at_the_end_of_its_input(programs: Programs) -> None:
    """No go line: a setup error before any offer (no summary, so nothing was sent)."""
    subscriber = programs.subscribe(stream=STREAM, expect={1: 10})
    subscriber.wait_ready()  # the publication connects once there is a subscriber
    publisher = programs.publish(stream=STREAM, count=10, length=32, publisher_id=1,
                                 await_go=True)
    publisher.wait_ready()
    publisher.close_stdin()

    finished = publisher.finish()
    assert finished.returncode == 2
    assert "--await-go: end of input before the go line" in finished.stderr
    assert finished.stdout == "READY\n"


def test_two_publishers_share_one_stream(programs: Programs) -> None:
    """Two processes offer concurrently on one concurrent publication (one log, one session):
    each one's messages arrive in its own order, interleaved with the other's."""
    subscriber = programs.subscribe(stream=STREAM, expect={1: 10_000, 2: 10_000})
    subscriber.wait_ready()
    publishers = [programs.publish(stream=STREAM, count=10_000, length=48, publisher_id=p)
                  for p in (1, 2)]

    for publisher_id, publisher in zip((1, 2), publishers, strict=True):
        _published(publisher.finish(), publisher_id, 10_000)
    _received(subscriber.finish(), {1: 10_000, 2: 10_000})


def test_exclusive_publication(programs: Programs) -> None:
    subscriber = programs.subscribe(stream=STREAM, expect={7: 10_000})
    subscriber.wait_ready()
    publisher = programs.publish(stream=STREAM, count=10_000, length=100, publisher_id=7,
                                 exclusive=True)

    assert _published(publisher.finish(), 7, 10_000)["exclusive"] is True
    _received(subscriber.finish(), {7: 10_000})


def test_messages_longer_than_the_mtu_are_reassembled(programs: Programs) -> None:
    """20,000 B is about 15 fragments at Aeron's default MTU (1,408 B); the subscriber's
    fragment assembler gives each message back whole (its CRC and length checked)."""
    subscriber = programs.subscribe(stream=STREAM, expect={3: 300})
    subscriber.wait_ready()
    publisher = programs.publish(stream=STREAM, count=300, length=20_000, publisher_id=3)

    _published(publisher.finish(), 3, 300)
    assert _received(subscriber.finish(), {3: 300})["bytes"] == 300 * 20_000


def test_a_slow_subscriber_gets_everything(programs: Programs) -> None:
    """The subscriber sleeps 100 us a message: 5,000 frames of 288 B are more than the IPC
    publication window (half of the driver's 1 MiB term), so the publisher is held back and
    retries, and still every message arrives."""
    subscriber = programs.subscribe(stream=STREAM, expect={4: 5_000}, delay_us=100)
    subscriber.wait_ready()
    publisher = programs.publish(stream=STREAM, count=5_000, length=256, publisher_id=4)

    assert _published(publisher.finish(), 4, 5_000)["back_pressured"] > 0
    _received(subscriber.finish(), {4: 5_000})


def test_aeron_stat_lists_the_drivers_counters(programs: Programs,
                                               aeronmd: subprocess.Popen[bytes]) -> None:
    """While a client runs, aeron_stat shows the driver's CnC file (its pid) and counters:
    the system counters (type 0) and the client's heartbeat (type 11, owned by the client, a
    timestamp in ms). No sub-pos yet: Aeron makes one per image, and no publisher runs."""
    subscriber = programs.subscribe(stream=STREAM, expect={1: 1})
    subscriber.wait_ready()

    stat = programs.stat()
    assert stat.returncode == 0, stat.stderr
    cnc, *counters = stat.json_lines()
    assert cnc["pid"] == aeronmd.pid and cnc["cnc_version_text"].startswith("0.")
    by_type: dict[int, list[dict[str, Any]]] = {}
    for counter in counters:
        by_type.setdefault(counter["type_id"], []).append(counter)
    assert any(c["label"] == "Bytes sent" for c in by_type[0])
    [heartbeat] = by_type[11]
    client_id = heartbeat["owner_id"]
    assert heartbeat["label"] == f"client-heartbeat: id={client_id}"
    assert heartbeat["registration_id"] == client_id
    assert heartbeat["value"] > cnc["start_timestamp_ms"] - 1  # ms since the epoch
    assert 4 not in by_type

    publisher = programs.publish(stream=STREAM, count=1, length=20, publisher_id=1)
    _published(publisher.finish(), 1, 1)
    _received(subscriber.finish(), {1: 1})


def test_the_subscriber_names_a_corrupt_message(programs: Programs) -> None:
    subscriber = programs.subscribe(stream=STREAM, expect={1: 1_000})
    subscriber.wait_ready()
    publisher = programs.publish(stream=STREAM, count=1_000, length=64, publisher_id=1,
                                 corrupt_sequence=123)

    publisher.finish()
    summary = _refused(subscriber.finish(), "publisher 1: message of 64 bytes with sequence 123",
                       "CRC-32")
    assert summary["received"] == {"1": 123}


def test_the_subscriber_names_a_repeated_sequence(programs: Programs) -> None:
    """Two publishers with one publisher id, one after the other (two images): the second
    one's sequence 0 comes where 1 to 5 was due, depending on how far the subscriber had read
    the first image when the second one came."""
    subscriber = programs.subscribe(stream=STREAM, expect={1: 10})
    subscriber.wait_ready()
    for _ in range(2):
        _published(programs.publish(stream=STREAM, count=5, length=32, publisher_id=1).finish(),
                   1, 5)

    finished = subscriber.finish()
    summary = _refused(finished, "publisher 1: expected sequence ")
    due = summary["received"]["1"]
    assert 1 <= due <= 5
    assert (f"publisher 1: expected sequence {due}, got sequence 0 (duplicated or reordered)"
            == summary["error"])


def test_the_subscriber_names_an_unexpected_publisher(programs: Programs) -> None:
    subscriber = programs.subscribe(stream=STREAM, expect={1: 5})
    subscriber.wait_ready()
    _published(programs.publish(stream=STREAM, count=5, length=32, publisher_id=2).finish(), 2, 5)

    _refused(subscriber.finish(), "publisher 2: not expected, got its sequence 0")


def test_the_subscriber_names_what_never_came(programs: Programs) -> None:
    """Fewer messages than expected: at its timeout (3 s) the subscriber names the publisher
    and the sequence it was waiting for."""
    subscriber = programs.subscribe(stream=STREAM, expect={1: 60}, timeout_s=3)
    subscriber.wait_ready()
    _published(programs.publish(stream=STREAM, count=50, length=32, publisher_id=1).finish(),
               1, 50)

    summary = _refused(subscriber.finish(), "publisher 1: timed out after 3 s expecting sequence "
                                            "50 (got 50 of 60 messages)")
    assert summary["received"] == {"1": 50}


# -- the long-running modes (--until-stopped) ----------------------------------------------------

#: the progress file's fields the tests give the programs: a publisher's record (acked,
#: attempted) and phase, a subscriber's record (checked) and phase
PUBLISHER_RECORD, PUBLISHER_PHASE, SUBSCRIBER_RECORD, SUBSCRIBER_PHASE = 0, 16, 32, 40


def _progress_file(tmp_path: Path) -> Path:
    path = tmp_path / "progress"
    path.write_bytes(bytes(64))
    return path


def _field(path: Path, offset: int) -> int:
    return struct.unpack_from("<q", path.read_bytes(), offset)[0]


def _set_field(path: Path, offset: int, value: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(struct.pack("<q", value))


def _stopped(program: Program, *, status: int = 0, ended: str = "stopped") -> dict[str, Any]:
    finished = program.finish()
    assert finished.returncode == status, (finished.stdout, finished.stderr)
    summary = finished.summary
    assert summary["mode"] == "until-stopped" and summary["ended"] == ended, summary
    return summary


def test_until_stopped_the_programs_run_until_sigterm_and_report(programs: Programs,
                                                                 tmp_path: Path) -> None:
    """Two publishers, one paced (lengths 20 to 3,000 B: some fragmented) and one not, and a
    subscriber, until SIGTERM: a publisher reports how many it sent and its last acked
    sequence, holds its publication open until the second SIGTERM, and the subscriber got each
    one's messages from 0 to the last, one image each; the progress file says the same."""
    progress = _progress_file(tmp_path)
    subscriber = programs.subscribe_until_stopped(
        stream=STREAM, progress=(progress, SUBSCRIBER_RECORD, SUBSCRIBER_PHASE))
    subscriber.wait_ready()
    paced = programs.publish_until_stopped(
        stream=STREAM, publisher_id=1, length=20, max_length=3_000, rate=5_000, hold_s=60,
        progress=(progress, PUBLISHER_RECORD, PUBLISHER_PHASE))
    unpaced = programs.publish_until_stopped(stream=STREAM, publisher_id=2, length=64, hold_s=60)
    wait_until(lambda: _field(progress, PUBLISHER_RECORD) >= 2_000, 30,
               "the paced publisher to have 2,000 messages accepted")

    sent = {}
    for publisher_id, publisher in ((1, paced), (2, unpaced)):
        publisher.stop()
        wait_until(publisher.summary_printed, 30, f"publisher {publisher_id}'s summary")
        sent[publisher_id] = json.loads(publisher.stdout().splitlines()[-1])
        assert sent[publisher_id]["ended"] == "stopped"
        assert publisher.process.poll() is None, "it holds its publication until a second signal"
    assert _field(progress, PUBLISHER_RECORD) == _field(progress, PUBLISHER_RECORD + 8) \
        == sent[1]["sent"] and _field(progress, PUBLISHER_PHASE) == 0
    wait_until(lambda: _field(progress, SUBSCRIBER_RECORD) == sent[1]["sent"] + sent[2]["sent"],
               30, "the subscriber to check every message sent")
    subscriber.stop()
    summary = _stopped(subscriber)
    for publisher_id, publisher in ((1, paced), (2, unpaced)):
        assert sent[publisher_id]["last_acked"] == sent[publisher_id]["sent"] - 1
        assert summary["publishers"][str(publisher_id)] == {
            "session": summary["publishers"][str(publisher_id)]["session"],
            "received": sent[publisher_id]["sent"], "first": 0,
            "last": sent[publisher_id]["last_acked"], "skipped": 0, "images": 1}
        publisher.stop()
        _stopped(publisher)
    assert summary["errors"] == 0 and summary["error"] is None and summary["ok"] is True
    assert sent[1]["max_length"] == 3_000 and sent[1]["rate"] == 5_000


def test_until_stopped_a_publisher_awaiting_go_runs_from_the_go_line_or_stops_before_it(
        programs: Programs, tmp_path: Path) -> None:
    """--until-stopped --await-go: one publisher offers from its go line on (its first offer
    after it, its last accepted message's time before its summary); another, stopped before
    its go line, ends stopped with nothing sent and nothing offered."""
    progress = _progress_file(tmp_path)
    subscriber = programs.subscribe_until_stopped(
        stream=STREAM, progress=(progress, SUBSCRIBER_RECORD, SUBSCRIBER_PHASE))
    subscriber.wait_ready()
    started = programs.publish_until_stopped(
        stream=STREAM, publisher_id=1, length=32, rate=5_000, await_go=True,
        progress=(progress, PUBLISHER_RECORD, PUBLISHER_PHASE))
    never = programs.publish_until_stopped(stream=STREAM, publisher_id=2, length=32,
                                           await_go=True)
    started.wait_ready()
    never.wait_ready()
    assert _field(progress, PUBLISHER_RECORD + 8) == 0, "nothing offered before the go line"
    go_at = time.monotonic()
    started.send_line("go")
    wait_until(lambda: _field(progress, SUBSCRIBER_RECORD) >= 500, 30,
               "the subscriber to check 500 messages")

    never.stop()
    stopped_early = _stopped(never)
    assert (stopped_early["sent"], stopped_early["first_offer_at"],
            stopped_early["last_sent_at"]) == (0, 0, 0)
    started.stop()
    sent = _stopped(started)
    assert go_at <= sent["first_offer_at"] <= sent["last_sent_at"] <= time.monotonic()
    wait_until(lambda: _field(progress, SUBSCRIBER_RECORD) == sent["sent"], 30,
               "the subscriber to check every message sent")
    subscriber.stop()
    got = _stopped(subscriber)
    assert got["publishers"]["1"]["received"] == sent["sent"] and "2" not in got["publishers"]
    assert sent["first_offer_at"] <= got["first_message_at"] <= got["last_message_at"]
    assert sent["last_sent_at"] <= got["last_message_at"]


def test_until_stopped_a_publisher_holds_a_claim_when_asked(programs: Programs,
                                                           tmp_path: Path) -> None:
    """--progress-hold: asked through the progress file, the publisher claims its next
    message and holds it half written (phase 2, attempted one past acked, nothing sent
    meanwhile); asked no more, it aborts the claim (a padding frame) and goes on with the same
    sequence: the subscriber sees no gap."""
    progress = _progress_file(tmp_path)
    hold = 24
    subscriber = programs.subscribe_until_stopped(
        stream=STREAM, progress=(progress, SUBSCRIBER_RECORD, SUBSCRIBER_PHASE))
    subscriber.wait_ready()
    publisher = programs.publish_until_stopped(
        stream=STREAM, publisher_id=5, length=20, max_length=3_000, rate=2_000,
        progress=(progress, PUBLISHER_RECORD, PUBLISHER_PHASE), hold_at=hold)
    wait_until(lambda: _field(progress, PUBLISHER_RECORD) >= 200, 30,
               "the publisher to have 200 messages accepted")

    _set_field(progress, hold, 1)
    wait_until(lambda: _field(progress, PUBLISHER_PHASE) == 2, 30, "the claim to be held")
    acked = _field(progress, PUBLISHER_RECORD)
    assert _field(progress, PUBLISHER_RECORD + 8) == acked + 1
    wait_until(lambda: _field(progress, SUBSCRIBER_RECORD) == acked, 30,
               "the subscriber to check every message before the held claim")
    _set_field(progress, hold, 0)
    wait_until(lambda: _field(progress, PUBLISHER_RECORD) >= acked + 200, 30,
               "the publisher to go on")

    publisher.stop()
    sent = _stopped(publisher)["sent"]
    wait_until(lambda: _field(progress, SUBSCRIBER_RECORD) == sent, 30,
               "the subscriber to check every message")
    subscriber.stop()
    seen = _stopped(subscriber)["publishers"]["5"]
    assert (seen["first"], seen["last"], seen["received"], seen["images"]) == (
        0, sent - 1, sent, 1)


def test_until_stopped_a_late_subscriber_starts_where_the_stream_is(programs: Programs,
                                                                    tmp_path: Path) -> None:
    """A subscriber that joins after 500 messages (an Aeron publication needs a subscriber to
    accept any: a first one reads from the start) checks from the first one it sees on: no
    gap from there, nothing skipped."""
    progress = _progress_file(tmp_path)
    programs.subscribe_until_stopped(stream=STREAM).wait_ready()
    publisher = programs.publish_until_stopped(
        stream=STREAM, publisher_id=3, length=32, rate=2_000,
        progress=(progress, PUBLISHER_RECORD, PUBLISHER_PHASE))
    wait_until(lambda: _field(progress, PUBLISHER_RECORD) >= 500, 30,
               "the publisher to have 500 messages accepted")
    subscriber = programs.subscribe_until_stopped(stream=STREAM, progress=(progress, 48, 56))
    subscriber.wait_ready()
    wait_until(lambda: _field(progress, 48) >= 500, 30, "the late subscriber to check 500 messages")

    subscriber.stop()
    seen = _stopped(subscriber)["publishers"]["3"]
    publisher.stop()
    sent = _stopped(publisher)["sent"]
    assert 500 <= seen["first"] and seen["last"] < sent
    assert seen["received"] == seen["last"] - seen["first"] + 1 >= 500
    assert (seen["skipped"], seen["images"]) == (0, 1)


def test_until_stopped_the_subscriber_names_a_corrupt_message(programs: Programs) -> None:
    subscriber = programs.subscribe_until_stopped(stream=STREAM)
    subscriber.wait_ready()
    publisher = programs.publish_until_stopped(stream=STREAM, publisher_id=9, length=48,
                                               corrupt_sequence=77)

    summary = _stopped(subscriber, status=1, ended="broken rule")
    assert "publisher 9: message of 48 bytes with sequence 77" in summary["error"]
    assert "CRC-32" in summary["error"] and summary["publishers"]["9"]["last"] == 76
    publisher.stop()
    _stopped(publisher)


def test_until_stopped_the_programs_end_with_status_3_when_the_driver_dies(
        programs: Programs, aeronmd: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """Aeron's client ends once the driver's heartbeat is older than the driver timeout (1 s
    here): each program reports the client's end (Aeron's error) and exits 3, its counts kept."""
    progress = _progress_file(tmp_path)
    subscriber = programs.subscribe_until_stopped(
        stream=STREAM, driver_timeout_ms=1_000,
        progress=(progress, SUBSCRIBER_RECORD, SUBSCRIBER_PHASE))
    subscriber.wait_ready()
    publisher = programs.publish_until_stopped(stream=STREAM, publisher_id=4, length=32,
                                               rate=1_000, driver_timeout_ms=1_000)
    wait_until(lambda: _field(progress, SUBSCRIBER_RECORD) >= 100, 30,
               "the subscriber to check 100 messages")

    aeronmd.kill()
    aeronmd.wait()
    sent = _stopped(publisher, status=3, ended="client ended")
    received = _stopped(subscriber, status=3, ended="client ended")
    for summary in (sent, received):
        assert "Aeron client error 1000: MediaDriver" in summary["error"], summary
    assert 100 <= received["publishers"]["4"]["received"] <= sent["sent"]


def test_without_the_aeron_build_the_error_says_make_aeron_c(tmp_path: Path) -> None:
    with pytest.raises(AeronCNotBuilt, match="run `make aeron-c`"):
        build_programs(tmp_path)


def test_a_program_is_compiled_when_missing_or_older_than_its_sources(aeron_c: AeronC,
                                                                      tmp_path: Path) -> None:
    """Against a build folder of links to the real one: compiled at first, left alone while
    newer than its sources, compiled again once older."""
    real = aeron_c.aeronmd.parent.parent
    (tmp_path / "bin").mkdir()
    for name in ("lib", "include", "bin/aeronmd"):
        (tmp_path / name).symlink_to((real / name).resolve())
    first = build_programs(tmp_path)
    assert first.publish == tmp_path / "bin" / "aeron_publish"
    built = {path: path.stat().st_mtime_ns for path in (first.publish, first.subscribe, first.stat)}
    assert build_programs(tmp_path) == first
    assert {path: path.stat().st_mtime_ns for path in built} == built

    os.utime(first.stat, (0, 0))
    build_programs(tmp_path)
    assert first.stat.stat().st_mtime_ns > built[first.stat]
    assert first.publish.stat().st_mtime_ns == built[first.publish]
    finished = subprocess.run([str(first.stat), "--bogus"], capture_output=True, text=True,
                              timeout=30)
    assert finished.returncode == 2 and "unknown option --bogus" in finished.stderr
