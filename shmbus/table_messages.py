"""Arrow tables as messages, in Arrow's IPC stream format, read without a copy.

A message is one IPC stream (the schema, dictionary batches, the record batches, the
end-of-stream marker), so any Arrow reader can open it. The writer measures the stream first
(a mock sink, no data copied): up to the log's max message it is serialized and published as
one message; past it a block is claimed (:class:`LargeClaim`) and the stream is written into
the block in place, the data's one copy going straight into shared memory. The reader opens
the message as an Arrow buffer, so every column buffer of the table is a slice of it: for a
large message, of the block itself, valid while it is held (as ``arrays()`` views are).

pyarrow is optional (the ``spark`` extra); without it these calls raise ImportError naming it.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from shmbus import codes
from shmbus.errors import PublicationError
from shmbus.large_messages import LargeClaim

if TYPE_CHECKING:
    import pyarrow as pa

    from shmbus.publication import Publication

#: how long a writer waiting for a block sleeps between tries
_CLAIM_WAIT_S = 0.0005


def require_pyarrow() -> Any:
    """The pyarrow module; ImportError naming it when it is not installed."""
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401  (the IPC stream reader and writer)
    except ImportError as e:
        raise ImportError("publish_table() and tables() need pyarrow, which is not installed: "
                          "pip install pyarrow (or shmbus[spark])") from e
    return pyarrow


def _checked(data: Any) -> Any:
    pa = require_pyarrow()
    if not isinstance(data, (pa.Table, pa.RecordBatch)):
        raise TypeError(f"publish_table takes a pyarrow.Table or pyarrow.RecordBatch, not "
                        f"{type(data).__name__}")
    return pa


def _write(pa: Any, data: pa.Table | pa.RecordBatch, sink: Any) -> None:
    with pa.ipc.new_stream(sink, data.schema) as writer:
        if isinstance(data, pa.Table):
            writer.write_table(data)
        else:
            writer.write_batch(data)


def stream_length(data: pa.Table | pa.RecordBatch) -> int:
    """The length of ``data`` as an IPC stream (measured, nothing copied)."""
    pa = _checked(data)
    sink = pa.MockOutputStream()
    _write(pa, data, sink)
    return int(sink.size())


def serialize(data: pa.Table | pa.RecordBatch) -> pa.Buffer:
    """``data`` as one IPC stream in a new buffer."""
    pa = _checked(data)
    sink = pa.BufferOutputStream()
    _write(pa, data, sink)
    return sink.getvalue()


def _fill(claim: LargeClaim, data: pa.Table | pa.RecordBatch, length: int) -> None:
    """Write the stream into the claimed block; ValueError (the claim aborted by the caller's
    ``with``) if it came out another length than measured."""
    pa = require_pyarrow()
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(claim.buffer))
    _write(pa, data, sink)
    written = sink.tell()
    sink.close()
    del sink  # (its export of claim.buffer ends here: commit releases the buffer)
    if written != length:
        raise ValueError(f"the table's IPC stream took {written} bytes, measured {length}")


def publish_table(pub: Publication, data: pa.Table | pa.RecordBatch, timeout: float,
                  reserved_value: int) -> int:
    """Publish ``data`` as one message; the new position. Past the log's max message the stream
    is written in place into a block. Raises as ``publish`` does."""
    length = stream_length(data)
    if length <= pub.max_message_length:
        return pub.publish(serialize(data), timeout=timeout, reserved_value=reserved_value)
    pub._block_ring(length)  # (a channel without one: the ValueError naming its limit)
    claim = LargeClaim(pub, length, reserved_value, time.monotonic() + timeout)
    if not claim:
        raise PublicationError(claim.result, f"no block for a table of {length} bytes within "
                               f"{timeout} s: {codes.result_name(claim.result)}")
    with claim:
        _fill(claim, data, length)
    return claim.result


async def publish_table_async(pub: Publication, data: pa.Table | pa.RecordBatch,
                              timeout: float, reserved_value: int) -> int:
    """:func:`publish_table`, awaiting back-pressure without blocking the event loop."""
    length = stream_length(data)
    if length <= pub.max_message_length:
        return await pub.publish_async(serialize(data), timeout=timeout,
                                       reserved_value=reserved_value)
    pub._block_ring(length)
    deadline = time.monotonic() + timeout
    while True:
        claim = LargeClaim(pub, length, reserved_value)
        if claim:
            break
        if claim.result == codes.CLOSED or time.monotonic() >= deadline:
            raise PublicationError(claim.result, f"no block for a table of {length} bytes "
                                   f"within {timeout} s: {codes.result_name(claim.result)}")
        await asyncio.sleep(_CLAIM_WAIT_S)
    with claim:
        _fill(claim, data, length)
    return claim.result


def decode_table(buffer: memoryview, copy: bool) -> pa.Table:
    """The table in a table message: its column buffers are slices of ``buffer`` (``copy``
    False: valid as long as its memory is) or of a private copy. ValueError for a message that
    is not an IPC stream."""
    pa = require_pyarrow()
    source = pa.py_buffer(bytes(buffer) if copy else buffer)
    try:
        return pa.ipc.open_stream(source).read_all()
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise ValueError(f"not an Arrow IPC stream (was it sent with publish_table?): "
                         f"{e}") from None
