"""Large-message reference frames no writer made: what a hostile or broken writer of a log may
append (a frame flagged as a reference to a block, with any payload), for the tests of the
readers that must refuse them."""

from __future__ import annotations

from typing import Any

from shmbus.shm.block_ring import REFERENCE_FLAGS


def forge_reference(publication: Any, payload: bytes) -> int:
    """Append a reference frame of ``payload`` to ``publication``'s log (a Publication or an
    ExclusivePublication), as a writer of the log may; its position."""
    result, frame_offset = publication._claim(len(payload), 0)
    assert result > 0
    view = publication._claim_view(frame_offset, len(payload))
    view[:] = payload
    view.release()
    publication.log.buffer.put_bytes(frame_offset + 5, bytes([REFERENCE_FLAGS]))
    publication._commit(frame_offset)
    return int(result)
