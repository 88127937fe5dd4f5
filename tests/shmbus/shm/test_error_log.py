"""Distinct error log: one record per distinct error, counts and timestamps, full log, reader."""

from __future__ import annotations

import mmap

from shmbus import AtomicBuffer
from shmbus.shm.error_log import (
    ENCODED_ERROR_OFFSET,
    FIRST_OBSERVATION_TIMESTAMP_OFFSET,
    LAST_OBSERVATION_TIMESTAMP_OFFSET,
    LENGTH_OFFSET,
    OBSERVATION_COUNT_OFFSET,
    DistinctErrorLog,
    ErrorObservation,
    error_text,
    read_error_log,
)


class FakeClock:
    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def make(capacity: int = 4096) -> tuple[DistinctErrorLog, AtomicBuffer, FakeClock]:
    buffer = AtomicBuffer(mmap.mmap(-1, capacity))
    clock = FakeClock()
    return DistinctErrorLog(buffer, clock), buffer, clock


def raise_and_catch(message: str) -> ValueError:
    try:
        raise ValueError(message)
    except ValueError as e:
        return e


def test_layout_offsets() -> None:
    assert (LENGTH_OFFSET, OBSERVATION_COUNT_OFFSET, LAST_OBSERVATION_TIMESTAMP_OFFSET,
            FIRST_OBSERVATION_TIMESTAMP_OFFSET, ENCODED_ERROR_OFFSET) == (0, 4, 8, 16, 24)


def test_should_record_first_observation() -> None:
    log, buffer, clock = make()
    assert log.record("IOError: disk full")
    assert buffer.get_int32(LENGTH_OFFSET) == ENCODED_ERROR_OFFSET + 18
    assert read_error_log(buffer) == [
        ErrorObservation(1, clock.now_ms, clock.now_ms, "IOError: disk full")]


def test_should_count_repeats_in_one_record() -> None:
    log, buffer, clock = make()
    first = clock.now_ms
    for _ in range(3):
        assert log.record("E: same")
        clock.now_ms += 10
    (observation,) = read_error_log(buffer)
    assert observation.observation_count == 3
    assert observation.first_observation_ms == first
    assert observation.last_observation_ms == first + 20


def test_should_record_distinct_errors_in_8_byte_aligned_records() -> None:
    log, buffer, _ = make()
    log.record("A: 1")                          # 24 + 4 = 28 -> next at 32
    log.record("B: 22")
    log.record("A: 1")
    assert buffer.get_int32(32) == ENCODED_ERROR_OFFSET + 5
    assert [(o.text, o.observation_count) for o in read_error_log(buffer)] == [
        ("A: 1", 2), ("B: 22", 1)]
    assert log.distinct_errors == 2


def test_exception_text_is_type_message_and_stack() -> None:
    error = raise_and_catch("bad value")
    text = error_text(error)
    assert text.startswith("ValueError: bad value\n")
    assert "raise_and_catch" in text
    assert error_text(KeyError("k")) == "KeyError: 'k'"


def test_the_same_error_from_the_same_place_is_one_record() -> None:
    log, buffer, _ = make()
    for _ in range(5):
        log.record(raise_and_catch("boom"))
    log.record(raise_and_catch("other"))
    observations = read_error_log(buffer)
    assert [o.observation_count for o in observations] == [5, 1]
    assert observations[0].text.startswith("ValueError: boom")


def test_should_return_false_when_full_and_still_count_known_errors() -> None:
    log, buffer, _ = make(capacity=64)
    assert log.record("A: fits")                # 24 + 7 -> 32 bytes
    assert not log.record("B: " + "x" * 20)     # 24 + 23 = 47 > 32 left
    assert log.record("A: fits")
    assert log.record("C: short")               # 24 + 8 = 32: exactly fits
    assert [(o.text, o.observation_count) for o in read_error_log(buffer)] == [
        ("A: fits", 2), ("C: short", 1)]


def test_reader_of_an_empty_log_returns_nothing() -> None:
    assert read_error_log(AtomicBuffer(bytearray(256))) == []


def test_reader_filters_by_last_observation() -> None:
    log, buffer, clock = make()
    log.record("Old: 1")
    clock.now_ms += 5000
    log.record("New: 2")
    assert [o.text for o in read_error_log(buffer, since_ms=clock.now_ms)] == ["New: 2"]


def test_log_resumes_over_a_buffer_in_use() -> None:
    log, buffer, clock = make()
    log.record("A: 1")
    log.record("B: 2")
    again = DistinctErrorLog(buffer, clock)
    again.record("B: 2")
    again.record("C: 3")
    assert [(o.text, o.observation_count) for o in read_error_log(buffer)] == [
        ("A: 1", 1), ("B: 2", 2), ("C: 3", 1)]


def test_utf8_text_round_trips() -> None:
    log, buffer, _ = make()
    log.record("Ошибка: données")
    assert read_error_log(buffer)[0].text == "Ошибка: données"
