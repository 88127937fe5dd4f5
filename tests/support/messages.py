"""Message bodies for the codec tests (shmbus/codecs/): hypothesis' arrays of every kind numpy
has, and what a hostile writer sends: array messages with forged headers, a table whose field
claims pyarrow's pickled extension type, an object whose unpickling leaves a marker file."""

from __future__ import annotations

import pathlib
import pickle
import struct
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

DTYPES = st.one_of(
    hnp.scalar_dtypes(),
    hnp.datetime64_dtypes(),
    hnp.timedelta64_dtypes(),
    hnp.array_dtypes(subtype_strategy=st.one_of(hnp.scalar_dtypes(), hnp.datetime64_dtypes()),
                     min_size=1, max_size=4),
    hnp.array_dtypes(subtype_strategy=hnp.scalar_dtypes(), min_size=1, max_size=3).map(
        lambda d: np.dtype(d.descr, align=True)),
)


@st.composite
def arrays(draw: Any, max_side: int = 12, max_dims: int = 4) -> np.ndarray:
    """Arrays of any of DTYPES, 0-d to 4-d, then C-ordered, Fortran-ordered, strided or
    transposed."""
    dtype = draw(DTYPES)
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side))
    array = draw(hnp.arrays(dtype, shape))
    layout = draw(st.sampled_from(["C", "F", "strided", "transposed"]))
    if layout == "F":
        array = np.asfortranarray(array)
    elif layout == "strided" and array.ndim:
        array = array[(slice(None, None, 2),) * array.ndim]
    elif layout == "transposed":
        array = array.T
    return array


#: an array message's fixed prefix: magic, version, flags, header length
ARRAY_PREFIX = struct.Struct("<4sHHI")


def forged(text: bytes | str, data: bytes = b"", length: int | None = None) -> bytes:
    """An array message with header text ``text`` (padded so the data is 64-byte aligned, as a
    writer pads it) and ``data`` after it; ``length`` overrides the header length field."""
    if isinstance(text, str):
        text = text.encode("utf-8", "surrogatepass")
    size = -(-(ARRAY_PREFIX.size + len(text)) // 64) * 64
    header = ARRAY_PREFIX.pack(b"SBAR", 1, 0, size if length is None else length)
    return header + text.ljust(size - ARRAY_PREFIX.size) + data


def header_text(descr: Any, shape: Any, fortran: Any = False) -> str:
    """An array header's text as numpy writes it."""
    return repr({"descr": descr, "fortran_order": fortran, "shape": shape})


class Marker:
    """Unpickled, it creates the file ``path``: a stranger's code, made harmless."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return pathlib.Path.touch, (pathlib.Path(self.path),)


def pickled_extension_table(marker: Path) -> Any:
    """A table message (a pyarrow Buffer) whose one field claims pyarrow's pickled extension
    type (``arrow.py_extension_type``), its metadata a pickle that touches ``marker``."""
    import pyarrow as pa

    from shmbus.codecs.table_messages import serialize

    field = pa.field("x", pa.binary(), metadata={
        b"ARROW:extension:name": b"arrow.py_extension_type",
        b"ARROW:extension:metadata": pickle.dumps(Marker(marker)),
    })
    return serialize(pa.table([pa.array([b"a", b"b"])], schema=pa.schema([field])))
