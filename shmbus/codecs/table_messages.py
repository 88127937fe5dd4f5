"""Arrow tables as messages, in Arrow's IPC stream format, read without a copy.

A message is one IPC stream (the schema, dictionary batches, the record batches, the
end-of-stream marker), so any Arrow reader can open it. The writer measures the stream first
(a mock sink, no data copied): up to the log's max message it is serialized and published as
one message; past it a block is claimed (:class:`LargeClaim`) and the stream is written into
the block in place, the data's one copy going straight into shared memory. The reader opens
the message as an Arrow buffer, so every column buffer of the table is a slice of it: for a
large message, of the block itself, valid while it is held (as ``arrays()`` views are).

pyarrow is optional (the ``tables`` or ``spark`` extra); without it these calls raise
ImportError naming it.

Reading a table runs no code from its bytes as long as pyarrow does not: pyarrow before 14.0.1
unpickled the metadata of a field typed ``arrow.py_extension_type`` (CVE-2023-47248), so these
calls refuse an older pyarrow (ImportError naming the fix), whether it came with an extra or
was installed by hand. Extension types the reading process registered itself are its
own code; never re-enable pyarrow's auto-loading of pickled extension types
(``PyExtensionType.set_auto_load``) in a process that reads tables from others.
"""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa


#: The oldest pyarrow these calls take: the first that does not unpickle extension types'
#: metadata when it reads an IPC stream (CVE-2023-47248).
MIN_PYARROW = (14, 0, 1)
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def require_pyarrow() -> Any:
    """The pyarrow module; ImportError naming it when it is not installed, or naming the fix
    when it is older than ``MIN_PYARROW``."""
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401  (the IPC stream reader and writer)
    except ImportError as e:
        raise ImportError("publish_table() and tables() need pyarrow, which is not installed: "
                          "pip install pyarrow (or shmbus[tables])") from e
    check_pyarrow_version(pyarrow.__version__)
    return pyarrow


@functools.lru_cache(maxsize=4)
def check_pyarrow_version(version: str) -> None:
    """ImportError unless ``version`` is a pyarrow release at least ``MIN_PYARROW`` (one this
    cannot read counts as older)."""
    match = _RELEASE.match(version)
    if match is None or tuple(int(part) for part in match.groups()) < MIN_PYARROW:
        floor = ".".join(map(str, MIN_PYARROW))
        raise ImportError(f"publish_table() and tables() need pyarrow >= {floor}, not "
                          f"{version}: older pyarrow runs code from the bytes of a table it "
                          f"reads (CVE-2023-47248); pip install 'pyarrow>={floor}'")


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


def write_stream(buffer: memoryview, data: pa.Table | pa.RecordBatch, length: int) -> None:
    """Write ``data``'s IPC stream into ``buffer`` (a claimed block); ValueError if it came out
    another length than :func:`stream_length` measured."""
    pa = require_pyarrow()
    sink = pa.FixedSizeBufferWriter(pa.py_buffer(buffer))
    _write(pa, data, sink)
    written = sink.tell()
    sink.close()
    del sink  # (its export of the buffer ends here: the claim's commit releases it)
    if written != length:
        raise ValueError(f"the table's IPC stream took {written} bytes, measured {length}")


def _check_names(field: pa.Field) -> None:
    """Decode the name of ``field`` and of every field nested in its type, as reading values
    does (UnicodeDecodeError for one that is not UTF-8: validate() leaves names unchecked)."""
    _ = field.name
    for i in range(field.type.num_fields):
        _check_names(field.type.field(i))


def decode_table(buffer: memoryview, copy: bool, validate: bool = False) -> pa.Table:
    """The table in a table message: its column buffers are slices of ``buffer`` (``copy``
    False: valid as long as its memory is) or of a private copy. ``validate``: check every
    buffer in full (offsets within their data, UTF-8 strings and field names; linear in the
    table's bytes), so a hostile message cannot make a table that reads outside its memory or
    fails when read; without it pyarrow checks only the structure. ValueError for a message
    that is not a valid IPC stream."""
    pa = require_pyarrow()
    source = pa.py_buffer(bytes(buffer) if copy else buffer)
    try:
        table = pa.ipc.open_stream(source).read_all()
        if validate:
            table.validate(full=True)
            for field in table.schema:
                _check_names(field)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:  # (a bad stream: OSError)
        raise ValueError(f"not an Arrow IPC stream, or a corrupt one (was it sent with "
                         f"publish_table?): {e}") from None
    return table
