"""No code from the network by default: a stranger's pickle never runs in ``objects()``, and
its arrays and tables are only ever data; a large-message reference from the network (whose
logs have no block ring) is a named error, the frame dropped.

A subscriber reads an unkeyed ``aeron:udp`` channel; a plain UDP socket in this test (no bus)
makes the netbridge take its hand-made SETUP and DATA frames, the DATA carrying an object
message whose unpickling would create a marker file, a table whose field claims pyarrow's
pickled extension type, an array header naming objects. The real driver, netbridge and
sockets; the only thing forged is the sender.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import shmbus
from shmbus.codecs.object_messages import object_parts
from shmbus.shm import block_ring as br
from tests.support.corrupt_references import messages_and_errors
from tests.support.drivers import running_driver
from tests.support.forged_peer import ForgedPeer, udp_socket
from tests.support.keyrings import write_keyring
from tests.support.messages import Marker, forged, header_text, pickled_extension_table
from tests.support.networks import free_udp_port

pytestmark = pytest.mark.timeout(120)
STREAM = 4101


def marker_message(path: Path) -> bytes:
    """An object message (shmbus/codecs/object_messages.py) whose pickle touches ``path``."""
    return b"".join(bytes(part) for part in object_parts(Marker(path)))


def wait_for_image(sub: shmbus.Subscription, timeout: float = 20.0) -> shmbus.Image:
    deadline = time.monotonic() + timeout
    while not sub.images:
        assert time.monotonic() < deadline, "the netbridge made no image of the forged SETUP"
        sub.wait(0.05)
    return sub.images[0]


@dataclasses.dataclass
class ForgedStream:
    """A subscription of an unkeyed UDP ``channel`` with the image of a forged ``peer``, and
    the ``marker`` file a forged pickle would create."""

    channel: str
    sub: shmbus.Subscription
    peer: ForgedPeer
    marker: Path


@pytest.fixture
def forged_stream(bus_context, driver, tmp_path) -> Iterator[ForgedStream]:
    """A :class:`ForgedStream` whose image (of the peer's SETUP) the netbridge made."""
    port = free_udp_port()
    channel = f"aeron:udp?endpoint=127.0.0.1:{port}"
    with shmbus.connect(bus_context) as bus, bus.add_subscription(channel, STREAM) as sub, \
            udp_socket() as sock:
        peer = ForgedPeer(sock, ("127.0.0.1", port), STREAM)
        peer.setup()
        image = wait_for_image(sub)
        assert image.source_identity == peer.source_identity
        yield ForgedStream(channel, sub, peer, tmp_path / "pwned")


def test_a_forged_pickle_on_an_unkeyed_udp_channel_is_refused_and_never_runs(
        forged_stream: ForgedStream) -> None:
    channel, sub, peer, marker = (forged_stream.channel, forged_stream.sub,
                                  forged_stream.peer, forged_stream.marker)
    peer.send(marker_message(marker))
    with pytest.raises(shmbus.UntrustedSourceError) as refused:
        next(sub.objects(timeout=10))
    assert not marker.exists()
    error = refused.value
    assert (error.channel, error.source) == (channel, peer.source_identity)
    text = str(error)
    for named in (channel, peer.source_identity, "trust_unkeyed_network=True", "key="):
        assert named in text, named

    # asyncio refuses the same way
    peer.send(marker_message(marker))

    async def read_one() -> Any:
        async for obj in sub.objects_async(timeout=10):
            return obj
        return None

    with pytest.raises(shmbus.UntrustedSourceError, match="trust_unkeyed_network"):
        asyncio.run(read_one())
    assert not marker.exists()

    # the control: opted in, the same bytes do run (this test's forgery is real)
    peer.send(marker_message(marker))
    obj = next(sub.objects(timeout=10, trust_unkeyed_network=True))
    assert obj is None and marker.exists()  # (Path.touch returns None)


def keyed_context(context: shmbus.Context, folder: Path, name: str) -> shmbus.Context:
    """``context`` with a keyring holding a fresh key ``name``."""
    return dataclasses.replace(context, keyring=write_keyring(folder, name))


def test_a_spy_reads_its_hosts_own_objects_and_a_keyed_channel_reads_with_no_opt_in(
        bus_context, tmp_path) -> None:
    """A spy on an unkeyed UDP publication reads this host's own publications: trusted as IPC
    is. Objects cross a keyed channel with no opt-in (the netbridges seal its datagrams)."""
    context = keyed_context(bus_context, tmp_path, "objects-test")
    unkeyed = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|ssc=true"  # the spy connects
    keyed = f"aeron:udp?endpoint=127.0.0.1:{free_udp_port()}|key=objects-test"
    with running_driver(context), shmbus.connect(context) as bus:
        with bus.add_publication(unkeyed, STREAM) as pub, \
                bus.add_subscription("aeron-spy:" + unkeyed, STREAM) as spy:
            wait_for_image(spy)
            pub.publish_object({"n": 1}, timeout=10)
            assert next(spy.objects(timeout=10)) == {"n": 1}
        with bus.add_subscription(keyed, STREAM) as sub, \
                bus.add_publication(keyed, STREAM) as pub:
            wait_for_image(sub)
            pub.publish_object({"n": 3}, timeout=10)
            assert next(sub.objects(timeout=10)) == {"n": 3}


def test_a_forged_table_and_array_on_an_unkeyed_udp_channel_are_only_data(
        forged_stream: ForgedStream) -> None:
    sub, peer, marker = forged_stream.sub, forged_stream.peer, forged_stream.marker
    peer.send(pickled_extension_table(marker).to_pybytes())
    table = next(sub.tables(timeout=10))
    assert not marker.exists()
    assert table.schema.field("x").type == pa.binary()
    peer.send(forged(header_text("|O", (2,)), bytes(16)))
    with pytest.raises(ValueError, match="refused array message"):
        next(sub.arrays(timeout=10))


def test_a_forged_large_message_reference_over_udp_is_dropped_with_a_named_error(
        forged_stream: ForgedStream) -> None:
    """A network image's log has no block ring: a frame with the large flag from the network
    is a CorruptReferenceError naming the log, raised once by a take, the frame dropped, and
    the reader reads on (not stuck on the frame)."""
    sub, peer = forged_stream.sub, forged_stream.peer
    (image,) = sub.images
    peer.send(b"before")
    peer.send(br.encode_reference(0, 100), flags=br.REFERENCE_FLAGS)
    peer.send(b"after")
    before, error, after = messages_and_errors(sub, 3, 20)
    assert (before, after) == (b"before", b"after")
    assert isinstance(error, br.CorruptReferenceError), error
    assert str(image.log.path) in str(error) and "no block ring" in str(error), str(error)
