"""tools/nemesis: its checker on made-up sequences, a 60-second run of the real thing, and short
runs of its Aeron pair (Aeron's C client beside shmbus's on one stream)."""

from __future__ import annotations

import multiprocessing
import re
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

from tests.support.workers.flag_workers import spin_on_flag
from tools.aeron_c.message import encode_message
from tools.nemesis import calls, check, run
from tools.nemesis.flags import Flag

ROOT = Path(__file__).resolve().parents[3]

BLOCK = check.payload_block(7)


def message(sequence: int, writer: int = 1, incarnation: int = 0, length: int = 40) -> bytes:
    return check.encode(BLOCK, writer, incarnation, sequence, length)


def fed(sequences: list[int], *, new_image_before: int | None = None) -> check.Track:
    """The track of writer 1 incarnation 0 after a subscriber got these sequences (a new
    image of its session starting before index ``new_image_before``)."""
    subscriber = check.SubscriberCheck()
    for i, sequence in enumerate(sequences):
        if i == new_image_before:
            subscriber.on_new_image(5)
        subscriber.on_message(5, message(sequence))
    return subscriber.tracks[(1, 0)]


def counts(track: check.Track) -> tuple[int, int, int, int, int]:
    return track.received, track.lost, track.duplicated, track.reordered, track.skipped


def test_messages_round_trip_and_a_bad_crc_or_short_message_is_corrupt() -> None:
    assert check.decode(message(12345, writer=3, incarnation=2, length=300)) == (3, 2, 12345)
    bad = bytearray(message(9))
    bad[-1] ^= 1
    subscriber = check.SubscriberCheck()
    for data in (bytes(bad), message(9)[:10], message(0)):
        subscriber.on_message(5, data)
    subscriber.finish()
    assert subscriber.corrupt == 2 and counts(subscriber.tracks[(1, 0)]) == (1, 0, 0, 0, 0)


def test_corrupt_messages_of_a_poll_that_raised_client_timeout_are_torn_others_corrupt(
        ) -> None:
    """A reader paused past its liveness inside a poll is dropped and may be handed memory the
    writer reused; that poll raises ClientTimeoutError when it resumes. Corrupt messages of
    that poll are torn; of any poll that returned, corrupt."""
    subscriber = check.SubscriberCheck()
    subscriber.on_message(5, message(0))
    subscriber.on_message(5, b"x" * 40)  # poll 1: corrupt, paused, then it raised
    subscriber.on_rebuild("ClientTimeoutError")
    assert (subscriber.corrupt, subscriber.torn) == (0, 1)
    assert subscriber.tracks[(1, 0)].dropped
    subscriber.on_message(5, b"y" * 40)  # poll 2: corrupt, and it returned
    subscriber.on_poll_done()
    subscriber.on_poll_done()
    subscriber.on_message(5, b"z" * 40)  # poll 4: corrupt, then a driver timeout
    subscriber.on_poll_done()
    subscriber.on_rebuild("DriverTimeoutError")
    assert (subscriber.corrupt, subscriber.torn) == (2, 1)


def test_gaps_opened_by_a_poll_that_raised_client_timeout_are_torn_not_lost() -> None:
    """A reader paused past its liveness inside a poll may, once resumed, read on into a log
    that has lapped it: valid messages of a later lap, after a gap. That poll raises
    ClientTimeoutError, so its gaps are torn; a gap of a poll that returned stays lost."""
    subscriber = check.SubscriberCheck()
    for sequence in (0, 1, 2):
        subscriber.on_message(5, message(sequence))
    subscriber.on_poll_done()
    subscriber.on_message(5, message(5))  # poll 2 returned: 3 and 4 lost
    subscriber.on_poll_done()
    subscriber.on_message(5, message(6))
    subscriber.on_message(5, message(113))  # poll 3: a lap later, then it raised
    subscriber.on_rebuild("ClientTimeoutError")
    track = subscriber.tracks[(1, 0)]
    assert (track.lost, subscriber.torn) == (2, 106)
    subscriber.on_message(5, message(200))  # a new image after the rebuild: skipped
    subscriber.on_message(5, message(202))
    subscriber.on_rebuild("DriverTimeoutError")  # a gap of a poll a driver timeout ended
    assert (track.lost, subscriber.torn) == (3, 106)


def test_the_checker_reports_a_gap_a_dup_and_a_reorder() -> None:
    assert counts(fed([0, 1, 2, 3])) == (4, 0, 0, 0, 0)
    assert counts(fed([0, 1, 4, 5])) == (4, 2, 0, 0, 0)  # 2 and 3 lost
    assert counts(fed([0, 1, 1, 2])) == (4, 0, 1, 0, 0)
    assert counts(fed([0, 2, 1, 3])) == (4, 0, 0, 1, 0)  # 1 came late: reordered, not lost
    assert counts(fed([0, 3, 1, 1])) == (4, 1, 1, 1, 0)  # 2 still lost, 1 once late, then dup


def test_a_jump_between_images_is_skipped_and_going_back_is_a_duplicate() -> None:
    assert counts(fed([0, 1, 7, 8], new_image_before=2)) == (4, 0, 0, 0, 5)
    assert counts(fed([0, 1, 1, 2], new_image_before=2)) == (4, 0, 1, 0, 0)
    track = fed([0, 1, 7], new_image_before=2)
    assert track.interrupted == 1 and (track.first, track.last) == (0, 7)


def report(name: str, kind: str, sequences: list[int], writer: int = 1) -> check.SubscriberReport:
    subscriber = check.SubscriberCheck()
    for sequence in sequences:
        subscriber.on_message(5, message(sequence, writer=writer))
    return check.SubscriberReport(name, kind, frozenset({writer}), subscriber)


def test_each_rule_is_named_when_broken() -> None:
    finished = {(1, 0): check.Sent(acked=5, attempted=5, ending=check.FINISHED)}
    assert check.breaches(finished, [report("t", "tethered", [0, 1, 2, 3, 4])], 10) == []
    [line] = check.breaches(finished, [report("t", "tethered", [0, 1, 2])], 10)
    assert "t from writer 1 incarnation 0 (finished): the last 2 of 5 acked" in line
    assert check.breaches(finished, [report("u", "untethered", [0, 1, 2])], 10) == []
    [line] = check.breaches(finished, [report("s", "spy", [0, 1, 3, 4])], 10)
    assert "1 lost within an image" in line
    [line] = check.breaches(finished, [report("n", "network", [0, 2, 1, 3, 4])], 10)
    assert "1 reordered" in line
    [line] = check.breaches(finished, [report("n", "network", [0, 1, 2, 3, 4, 4])], 10)
    assert "1 duplicated" in line
    [line] = check.breaches(finished, [report("t", "tethered", [0, 1, 2, 3, 4, 5])], 10)
    assert "sequence 5 received, only 5 attempted" in line
    [line] = check.breaches(finished, [report("t", "tethered", [0, 1, 2, 3, 4], writer=2)],
                            10)
    assert "no writer sent" in line
    killed = {(1, 0): check.Sent(acked=5, attempted=6, ending=check.KILLED_MID_CLAIM)}
    assert check.breaches(killed, [report("t", "tethered", [0, 1, 2, 3, 4])], 10) == []
    [line] = check.breaches(killed, [report("t", "tethered", [0, 1, 2])], 10)
    assert "2 messages acked before the kill never arrived" in line
    lost_driver = {(1, 0): check.Sent(acked=50, attempted=50, ending=check.DRIVER_LOST)}
    assert check.breaches(lost_driver, [report("t", "tethered", list(range(40)))], 10) == []
    [line] = check.breaches(lost_driver, [report("t", "tethered", list(range(39)))], 10)
    assert "11 acked messages lost when the writer's client was rebuilt, more than the " \
           "bound 10" in line
    dropped = report("t", "tethered", [0, 1, 2])
    dropped.check.on_rebuild("ClientTimeoutError")
    assert check.breaches(killed, [dropped], 10) == []  # it was not following the writer
    corrupt = report("t", "tethered", [0, 1, 2, 3, 4])
    corrupt.check.on_message(5, b"garbage that is long enough")
    corrupt.check.finish()
    [line] = check.breaches(finished, [corrupt], 10)
    assert "t: 1 corrupt messages" in line


#: how a service's failures may end (the summary's failure kinds): documented errors, or the
#: calls open when the caller's client failed (rebuild)
CALL_FAILURES = {"NoResponderError", "ResponderLostError", "RequestTimeoutError", "rebuild"}
SERVICE_LINE = re.compile(
    r"^request/reply \((?P<name>[a-z-]+)\): calls (?P<calls>\d+), answered (?P<answered>\d+) "
    r"\((?P<share>\d+)%: (?P<replies>\d+) replies, (?P<raised>\d+) RemoteError as asked; mean "
    r"[\d.]+ ms\), failed (?P<failed>\d+) \((?P<kinds>[^)]*)\)", re.M)


def services(out: str) -> dict[str, dict[str, Any]]:
    """Each service's summary line: counts, and its failures by kind."""
    found = {}
    for m in SERVICE_LINE.finditer(out):
        numbers = {k: int(v) for k, v in m.groupdict().items() if k not in ("name", "kinds")}
        kinds = dict((k, int(n)) for k, n in re.findall(r"(\w+) (\d+)", m["kinds"]))
        found[m["name"]] = {**numbers, "kinds": kinds}
    return found


def test_a_service_summary_counts_answers_and_failures_by_kind() -> None:
    tally = {"calls": 20, "answered": 12, "failed RemoteError": 3,
             "failed NoResponderError": 4, "failed rebuild": 1,
             "rebuilt after DriverTimeoutError": 1, calls.LATENCY_US: 15 * 2000}
    line = calls.summary_line(tally, "caller-udp")
    assert line == ("request/reply (caller-udp): calls 20, answered 15 (75%: 12 replies, 3 "
                    "RemoteError as asked; mean 2.0 ms), failed 5 (NoResponderError 4, "
                    "rebuild 1), rebuilt after DriverTimeoutError 1")
    assert calls.call_breaches(tally, "caller-udp") == []
    assert services(line)["caller-udp"] == {
        "calls": 20, "answered": 15, "share": 75, "replies": 12, "raised": 3, "failed": 5,
        "kinds": {"NoResponderError": 4, "rebuild": 1}}


def test_a_minute_of_faults_breaches_nothing() -> None:
    """The 60-second run: every fault fired, every writer sent and was received, no breach;
    the summary's rate, services and resources lines are there and add up."""
    result = subprocess.run([sys.executable, "-m", "tools.nemesis.run", "--seconds", "60",
                             "--seed", "16"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    assert out.rstrip().endswith("no breach")
    fired = dict(re.findall(r"([a-z-]+)=(\d+)", re.search(r"faults fired: (.*)", out)[1]))
    assert sorted(fired) == sorted(run.FAULTS)
    assert all(int(n) >= 1 for n in fired.values()), fired
    rows = re.findall(r"^ ?(\d+) (\S+) +(\d+) +(\d+) +(\d+) ", out, re.M)
    sent = {int(w): 0 for w in range(7 + len(run.aeron_writer_specs()))}
    received = dict(sent)
    for writer, _, _, s, r in rows:
        sent[int(writer)] += int(s)
        received[int(writer)] += int(r)
    assert all(n > 0 for n in sent.values()), sent
    assert all(n > 0 for n in received.values()), received
    readers = re.findall(
        r"^(tethered|untethered|udp|spy|recorder|large|late-joiner|recorder-large) +\S+ +(\d+)",
        out, re.M)
    assert len(readers) == 8 and all(int(n) > 0 for _, n in readers), readers
    total, seconds, per_minute, flowing, sampled = re.search(
        r"^messages sent: (\d+) in (\d+) s: ([\d.]+) M a minute; they flowed in (\d+) of "
        r"(\d+) seconds$", out, re.M).groups()
    assert int(total) == sum(sent.values()) and int(seconds) >= 50
    assert int(flowing) > int(sampled) // 2, "the faults' windows took most of the run"
    assert abs(float(per_minute) - int(total) / int(seconds) * 60 / 1e6) < 0.02 + 0.02 * float(
        per_minute)
    found = services(out)
    assert sorted(found) == ["caller", "caller-udp"], out[-3000:]
    for name, service in found.items():
        assert service["answered"] > 0, (name, service)
        assert service["answered"] == service["replies"] + service["raised"]
        assert service["answered"] + service["failed"] == service["calls"], (name, service)
        assert set(service["kinds"]) <= CALL_FAILURES, (name, service)
        assert sum(service["kinds"].values()) == service["failed"]
    assert re.search(r"^bus tmpfs: \d+ MiB, at most \d+ MiB used between faults$", out, re.M)
    cpu = dict(re.findall(r"([a-z0-9-]+) (\d+)", re.search(r"^cpu s \(.*\): (.*)$", out,
                                                           re.M)[1]))
    assert {"driver", "late-joiner", "writer-0", "caller-udp"} <= set(cpu), cpu


def test_a_worker_killed_while_reading_the_stop_flag_wedges_nothing() -> None:
    """multiprocessing.Event hung the whole run when a worker was SIGKILLed inside is_set()
    (it held the Event's lock); the nemesis's flag has no lock to hold."""
    context = multiprocessing.get_context("spawn")
    flag = Flag(context)
    workers = [context.Process(target=spin_on_flag, args=(flag,)) for _ in range(2)]
    for worker in workers:
        worker.start()
    workers[0].kill()  # (it is inside is_set() as often as anywhere)
    workers[0].join(10)
    flag.set()
    workers[1].join(10)
    assert workers[1].exitcode == 0
    assert flag.is_set() and flag.wait(0)


# -- the Aeron pair -----------------------------------------------------------------------------

def aeron_message(sequence: int, writer: int = 8, incarnation: int = 0,
                  length: int = 60) -> bytes:
    return encode_message(check.aeron_publisher_id(writer, incarnation), sequence, length)


def test_the_aeron_stream_check_tracks_each_writer_incarnation_by_publisher_id() -> None:
    subscriber = check.AeronFormatCheck()
    for sequence in (0, 1, 2, 4):
        subscriber.on_message(5, aeron_message(sequence))
    subscriber.on_message(5, aeron_message(0, writer=7, incarnation=3, length=20))
    subscriber.finish()
    assert counts(subscriber.tracks[(8, 0)]) == (4, 1, 0, 0, 0)  # 3 lost
    assert counts(subscriber.tracks[(7, 3)]) == (1, 0, 0, 0, 0)
    assert check.aeron_key(check.aeron_publisher_id(70, 4095)) == (70, 4095)


def test_a_tampered_aeron_stream_message_is_corrupt_and_a_breach() -> None:
    """A flipped payload bit, a length field that lies, a payload whose CRC was made for it
    but which breaks the pattern: each is corrupt, and corrupt is a breach."""
    flipped = bytearray(aeron_message(1))
    flipped[-1] ^= 1
    lying = bytearray(aeron_message(2))
    lying[4] += 1
    pattern = bytearray(aeron_message(3))
    pattern[30] ^= 0xFF
    pattern[16:20] = zlib.crc32(pattern[20:]).to_bytes(4, "little")
    subscriber = check.AeronFormatCheck()
    for data in (aeron_message(0), bytes(flipped), bytes(lying), bytes(pattern),
                 aeron_message(0)[:19]):
        subscriber.on_message(5, data)
    subscriber.finish()
    assert subscriber.corrupt == 4 and subscriber.tracks[(8, 0)].received == 1
    sent = {(8, 0): check.Sent(acked=4, attempted=4, ending=check.FINISHED)}
    report = check.SubscriberReport("aeron-shmbus", "tethered", frozenset({8}), subscriber)
    assert "aeron-shmbus: 4 corrupt messages (never allowed)" in check.breaches(sent, [report],
                                                                             10)


def test_the_last_aeron_c_reader_gets_every_live_writers_last_message() -> None:
    """Rules 3 and 4 on the C reader's last incarnation: a finished writer's last acked
    message arrives, and one killed mid-offer that it followed; a writer it never saw that
    was killed, or lost with the driver, is no breach (it joined after)."""
    sent = {(7, 0): check.Sent(acked=100, attempted=100, ending=check.FINISHED),
            (8, 0): check.Sent(acked=50, attempted=51, ending=check.KILLED_MID_OFFER),
            (8, 1): check.Sent(acked=30, attempted=31, ending=check.KILLED_MID_OFFER),
            (8, 2): check.Sent(acked=20, attempted=20, ending=check.DRIVER_LOST)}
    final = check.SubscriberCheck()
    final.tracks[(7, 0)] = check.Track(received=60, first=40, last=99)
    final.tracks[(8, 0)] = check.Track(received=10, first=30, last=39)
    [line] = check.final_reader_breaches("aeron-c", sent, frozenset({7, 8}), final)
    assert line == ("aeron-c from writer 8 incarnation 0 (killed mid-offer): 10 messages acked "
                    "before the kill never arrived")
    final.tracks[(7, 0)].last = 97
    [line, _] = check.final_reader_breaches("aeron-c", sent, frozenset({7, 8}), final)
    assert "the last 2 of 100 acked messages never arrived at its last incarnation" in line
    assert check.final_reader_breaches("aeron-c", sent, frozenset({5}), final) == []


def aeron_line(out: str) -> dict[str, int]:
    """The Aeron pair's summary line: what its writers sent, what its readers checked."""
    line = re.search(r"^aeron pair \(stream \d+, one concurrent publication\): (.*)$", out,
                     re.M)
    assert line, out[-3000:]
    counts = {f"{program} writer": int(n) for program, n in re.findall(
        r"(shmbus|aeron-c) writer \d+ sent (\d+)", line[1])}
    counts.update({f"{name} reader": int(n) for name, n in re.findall(
        r"(aeron-c|aeron-shmbus) reader checked (\d+)", line[1])})
    assert len(counts) == 4, line[1]
    return counts


def test_a_short_run_of_the_aeron_pair_breaches_nothing() -> None:
    """20 s of the Aeron faults and a driver kill: the Aeron C and shmbus readers checked
    messages of both writers, each Aeron fault fired, and no rule broke."""
    result = subprocess.run([sys.executable, "-m", "tools.nemesis.run", "--seconds", "20",
                             "--seed", "38", "--faults",
                             "kill-aeron-writer,kill-aeron-reader,kill-driver"],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    out = result.stdout
    assert result.returncode == 0, out[-4000:] + result.stderr[-4000:]
    assert out.rstrip().endswith("no breach")
    assert all(n > 0 for n in aeron_line(out).values()), aeron_line(out)
    fired = dict(re.findall(r"([a-z-]+)=(\d+)", re.search(r"faults fired: (.*)", out)[1]))
    assert all(int(fired[f]) >= 1 for f in ("kill-aeron-writer", "kill-aeron-reader",
                                            "kill-driver")), fired
    readers = dict(re.findall(r"^(aeron-c|aeron-shmbus) +\S+ +(\d+)", out, re.M))
    assert sorted(readers) == ["aeron-c", "aeron-shmbus"] and all(
        int(n) > 0 for n in readers.values()), readers


def test_a_tampered_aeron_stream_message_fails_the_run() -> None:
    """--tamper-aeron: the Aeron C writer's first incarnation flips a bit of its message
    40,000 (8 s in, at 5,000 a second: every reader has joined by then), while the faults
    leave the Aeron pair alone: the Aeron C reader stops at it, naming it, and the shmbus
    reader counts it corrupt; the run reports both as breaches and exits 1."""
    result = subprocess.run([sys.executable, "-m", "tools.nemesis.run", "--seconds", "25",
                             "--seed", "38", "--faults", "kill-responder",
                             "--tamper-aeron", "40000"],
                            cwd=ROOT, capture_output=True, text=True, timeout=240)
    out = result.stdout
    assert result.returncode == 1, out[-4000:] + result.stderr[-4000:]
    breaches = out[out.index("BREACHES ("):]
    publisher = check.aeron_publisher_id(len(run.writer_specs(7, 0)) + 1, 0)
    assert re.search(rf"aeron-c-reader incarnation \d+ exited with status 1: .*publisher "
                     rf"{publisher}: message of \d+ bytes with sequence 40000 .*CRC-32", breaches)
    assert "aeron-shmbus: 1 corrupt messages (never allowed)" in breaches
