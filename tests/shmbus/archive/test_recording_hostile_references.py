"""A recorder meets large-message reference frames no writer made (shmbus/archive/recorder.py,
shmbus/shm/block_ring.py): for each kind, the messages before it are recorded and read back
exactly, and the recorder stops with a RecordingError naming the frame's position and what is
wrong with the reference; it does not record it, or anything after it, as a message."""

from __future__ import annotations

import pytest

import shmbus
from shmbus import RecordingReader
from shmbus.archive.catalog import read_catalog
from shmbus.shm import block_ring as br
from tests.support.forged_references import forge_reference
from tests.support.waits import wait_until

pytestmark = pytest.mark.timeout(120)
STREAM = 57


def test_a_corrupt_reference_stops_the_recording_before_it_naming_it(bus_context, driver,
                                                                      tmp_path) -> None:
    with shmbus.connect(bus_context) as bus:
        for n, (forged, why) in enumerate([
                (b"SHBL\x01", "has 24 bytes, not 5"),
                (br.encode_reference(1 << 40, 100), "past what writers reserved"),
                (br.encode_reference(4096 + 1, 100), "not a block start"),
        ]):
            directory = tmp_path / f"rec{n}"
            pub = bus.add_exclusive_publication("aeron:ipc", STREAM + n)
            small, large = b"small" * 10, bytes(range(256)) * 400  # (100 KiB: a block)
            with bus.add_recorder(directory, "aeron:ipc", STREAM + n) as recorder:
                wait_until(lambda p=pub: p.is_connected, 10, "the recorder's subscription")
                pub.publish(small)
                pub.publish(large)
                at = pub.position
                forge_reference(pub, forged)
                pub.publish(b"after")
                with pytest.raises(shmbus.RecordingError) as stopped:
                    wait_until(lambda: recorder.poll() < 0, 10, "the recorder to stop")
                assert f"large message at position {at} " in str(stopped.value)
                assert why in str(stopped.value)
            [entry] = read_catalog(directory)
            assert [m.payload for m in RecordingReader(directory, entry).messages()] == [
                small, large]
            pub.close()
