"""A recorder meets a large message (kept in shared memory, referred to from the log): it stops
with an error that says so, having recorded every message before it exactly."""

from __future__ import annotations

import time

import pytest

import shmbus
from shmbus import Recorder, RecordingError, RecordingReader
from tests.shmbus.driver.test_driver_processes import wait_until


def test_a_recorder_stops_before_a_large_message_with_a_clear_error(bus_context, driver,
                                                                    tmp_path) -> None:
    with shmbus.connect(bus_context) as bus:
        pub = bus.add_exclusive_publication("aeron:ipc", 41)
        recorder = Recorder(tmp_path / "rec", "aeron:ipc", 41, client=bus)
        wait_until(lambda: pub.is_connected, 10, "the recorder's subscription")
        small = [bytes([i]) * 100 for i in range(5)]
        for message in small:
            pub.publish(message)
        pub.publish(bytes(pub.max_message_length + 1))
        deadline = time.monotonic() + 5
        with pytest.raises(RecordingError, match="large message"):
            while time.monotonic() < deadline:
                recorder.poll()
                time.sleep(0.01)
        [recording] = recorder.recordings
        recorder.close()
        reader = RecordingReader(tmp_path / "rec", recording.recording_id)
        assert [bytes(m.payload) for m in reader.messages()] == small
