"""tools/bench/aeron_clients.py: the rounds of the C programs' message check every byte in the
user's loop and name what is wrong, and a quick run measures every row with every message of
every row checked (untimed: the figures are the benchmark's, not the test's)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tools.aeron_c.message import encode_message
from tools.aeron_c.programs import AeronC
from tools.bench.aeron_rounds import AeronRounds
from tools.bench.user_loop import Consumer, write_count

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("size, publisher_id, count", [(32, 1, None), (20, 7, 16),
                                                        (100, 3, 256), (333, 255, 512)])
def test_the_rounds_are_the_messages_aeron_publish_writes(size: int, publisher_id: int,
                                                          count: int | None) -> None:
    rounds = AeronRounds(size, publisher_id, count)
    for round_no in (0, 1, 5):
        first = round_no * rounds.count
        expected = [encode_message(publisher_id, first + i, size) for i in range(rounds.count)]
        assert rounds.messages(round_no) == expected
        assert rounds.block(round_no) == b"".join(expected)
        assert rounds.check(expected[3]) == (first + 3, True)


def _stream(rounds: AeronRounds, round_count: int) -> list[bytes]:
    sent: list[bytes] = []
    out = write_count(sent.append, rounds, round_count)
    assert out["sent"] == len(sent) == round_count * rounds.count
    assert out["loop_write"] == "tools.bench.user_loop.write_count"
    return sent


def test_the_users_loop_reads_a_whole_stream_to_its_end() -> None:
    rounds = AeronRounds(32, 1, count=64)
    consumer = Consumer(AeronRounds(32, 1, count=64))
    assert consumer.read(iter(_stream(rounds, 3)[:-5])) is False  # no STOP: the count ends it
    result = consumer.result(0)
    assert (result["received"], result["errors"], result["first_bad"]) == (3 * 64 - 5, 0, None)


def _flip_a_payload_byte(stream: list[bytes]) -> None:
    message = bytearray(stream[70])
    message[-1] ^= 1  # the payload, not the sequence number: only the round comparison sees it
    stream[70] = bytes(message)


def _another_publisher(stream: list[bytes]) -> None:
    stream[90] = encode_message(2, 90, 32)


@pytest.mark.parametrize("damage, first_bad", [
    (lambda s: s.pop(100), "expected 100, got 101: out of order"),
    (_flip_a_payload_byte, "expected 70, got 70: bad checksum"),
    (_another_publisher, "expected 90, got 90: bad checksum"),
    (lambda s: s.__setitem__(5, s[5] + b"x"), "expected 5, got -2: wrong length"),
])
def test_a_damaged_stream_is_counted_and_named(damage: Callable[[list[bytes]], None],
                                               first_bad: str) -> None:
    rounds = AeronRounds(32, 1, count=64)
    stream = _stream(rounds, 4)
    damage(stream)
    consumer = Consumer(rounds)
    consumer.read(iter(stream))
    result = consumer.result(0)
    assert result["errors"] >= 1 and result["first_bad"] == first_bad


@pytest.mark.timeout(300)
def test_a_quick_run_checks_every_message_of_every_row(aeron_c: AeronC, tmp_path: Path) -> None:
    out = tmp_path / "aeron_clients.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.aeron_clients", "--quick", "--messages", "4096",
         "--idle", "0.2", "--json", str(out), "--page", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert (report["runs"], report["messages"]) == (1, 4096)
    rows = report["rows"]
    assert [(r["test"], r["row"], r["term"]) for r in rows] == [
        ("throughput", "shmbus -> shmbus", "default"),
        ("throughput", "Aeron C -> shmbus", "default"),
        ("throughput", "shmbus -> Aeron C", "default"),
        ("throughput", "shmbus -> shmbus", "16m"),
        ("throughput", "Aeron C -> shmbus", "16m"),
        ("idle", "driver", "default")]
    for r in rows:
        assert r["status"] == "ok" and r["errors"] == 0, r
    for r in rows[:5]:
        assert r["checked"] == r["messages"] == 4096, r
        assert r["msgs_per_s"] > 0
        for end in ("publisher", "subscriber", "driver", "all"):
            assert r[f"{end}_cpu_s_per_m"] is not None, (end, r)
        assert ("x_shmbus" in r) == (r["row"] != "shmbus -> shmbus"), r
    idle = rows[5]
    for key in ("driver_no_client_cores", "driver_aeron_client_cores", "aeron_client_cores"):
        assert idle[key] is not None and idle[key] >= 0, (key, idle)
    assert idle["added_cores"] == pytest.approx(
        idle["driver_aeron_client_cores"] - idle["driver_no_client_cores"])
    page = (tmp_path / "aeron_clients.md").read_text()
    assert page.startswith("# Aeron's C client on the shmbus driver")
    assert "## Targets" in page and "## Diagnosis: a larger window" in page
    assert "4,096 of 4,096" in page and "--page" not in page
