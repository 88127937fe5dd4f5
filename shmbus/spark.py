"""``shmbus.spark``: bus recordings into Spark, Spark results back onto the bus.

A PySpark Python Data Source (``pyspark.sql.datasource``, pyspark >= 4.2) named ``shmbus``.
Register it once per session with :func:`register`, then::

    spark.read.format("shmbus").option("path", "/data/rec").load()           # batch
    spark.readStream.format("shmbus").option("path", "/data/rec").load()     # streaming
    df.write.format("shmbus").option("stream_id", 2001).mode("append").save()
    df.writeStream.format("shmbus").option("stream_id", 2001).start()

Reading (batch and streaming) reads the files of a recording directory written by
:class:`shmbus.archive.recorder.Recorder`, never the bus, so it works from any executor that sees
the directory (shared storage on a cluster). Columns (:data:`SCHEMA`): ``recording_id``,
``position`` (stream position of the message's first fragment), ``session_id``, ``stream_id``,
``term_id``, ``term_offset``, ``reserved_value`` (of the first fragment), ``payload`` (the whole
message, reassembled) and ``record_time`` (when the recorder had written it).

Read options: ``path`` (required); ``recording_ids`` (comma separated), ``stream_id``,
``session_id``, ``channel`` select recordings (default: all); batch only: ``start_position``,
``end_position``; streaming only: ``starting_position`` (``earliest``, the default, or
``latest``) and ``maxBytesPerTrigger`` (bytes of recording per micro-batch, shared fairly
between recordings); ``partition_bytes`` (default 32 MiB) caps the recording bytes one
partition reads (whole segments, or a segment cut at term boundaries); ``record_dtype``
(``"name:type,..."``, numpy type codes, e.g. ``"time:M8[ns],symbol:i4,price:f8"``) adds one
column per field, decoded with numpy from payloads that are one such record (null otherwise);
``chunk_bytes`` (default 4 MiB) is how much an executor reads from the files at a time.

Streaming offsets are stream positions: ``{"recordings": {"<id>": {"position": N}}}``. A
message belongs to the micro-batch whose range holds the position of its first fragment, and
the latest offset of a live recording is the end of the last whole message the recorder wrote,
so every message is read once, whole, and a query restarted from its checkpoint resumes
exactly where it stopped. ``Trigger.AvailableNow`` reads up to the positions recorded when the
query started.

Writing: each row's ``payload`` (or the binary/string column named by option ``column``; null
rows are skipped) is published as one message on ``channel`` (default ``aeron:ipc``) and
``stream_id`` of the bus in ``dir`` (or the settings of a :class:`shmbus.Context` given as JSON
in option ``context``, see :func:`context_option`); option ``publish_timeout`` (seconds,
default 30) bounds how long a row may wait for back-pressure or for a subscriber.

Delivery guarantee of the writers (:data:`DELIVERY_GUARANTEE`): see its text.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any, cast, overload

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from shmbus.archive.catalog import RecordingDescriptor, RecordingError, live_position, read_catalog
from shmbus.archive.recording_reader import CHUNK_LENGTH, MessageBatch, RecordingReader

NAME = "shmbus"
PARTITION_BYTES_DEFAULT = 32 * 1024 * 1024

SCHEMA = StructType([
    StructField("recording_id", LongType(), False),
    StructField("position", LongType(), False),
    StructField("session_id", IntegerType(), False),
    StructField("stream_id", IntegerType(), False),
    StructField("term_id", IntegerType(), False),
    StructField("term_offset", IntegerType(), False),
    StructField("reserved_value", LongType(), False),
    StructField("payload", BinaryType(), False),
    StructField("record_time", TimestampType(), True),
])

ARROW_SCHEMA = pa.schema([
    pa.field("recording_id", pa.int64(), False),
    pa.field("position", pa.int64(), False),
    pa.field("session_id", pa.int32(), False),
    pa.field("stream_id", pa.int32(), False),
    pa.field("term_id", pa.int32(), False),
    pa.field("term_offset", pa.int32(), False),
    pa.field("reserved_value", pa.int64(), False),
    pa.field("payload", pa.binary(), False),
    pa.field("record_time", pa.timestamp("us", tz="UTC"), True),
])

DELIVERY_GUARANTEE = """\
At least once. Each write task publishes its rows in order on the bus, one message per row,
with reserved_value = batch_id << 32 | partition_id << 22 | row_index (row_index counts the
task's rows from 0; use decode_reserved_value). A task succeeds only after every one of its rows
was appended to the stream's log (offer accepted); a row that cannot be appended within
publish_timeout (back-pressure, or no subscriber connected: the bus does not keep messages
nobody subscribes to) fails the task. Spark then retries the task, which publishes its rows
again from row 0; a streaming micro-batch whose output was published but whose commit was not
recorded in the checkpoint is run again after a restart with the same batch id. So a row can
be published more than once, always with the same (batch_id, partition_id, row_index), and is
never lost once its task succeeded, for subscribers connected while it was published.
ReplayFilter drops the replays: with it a consumer gets each row exactly once, provided the
written DataFrame is deterministic (a re-run puts the same rows in the same partitions in the
same order; sort within partitions otherwise). Order: rows of one task arrive in row order;
tasks are not ordered with each other. A null payload is not published (its row index is
skipped). Batch writes use batch_id = option batch_id (default:
the writer's creation time in seconds, the same for all the job's tasks); streaming writes use
Spark's micro-batch id. Limits: batch_id < 2**32, partition_id < 1024, row_index < 2**22 per
task (a task with more rows fails: repartition).
"""

BATCH_ID_BITS, PARTITION_BITS, ROW_BITS = 32, 10, 22


def register(spark: Any) -> None:
    """Make ``format("shmbus")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(ShmbusDataSource)


def context_option(context: Any) -> str:
    """The ``context`` option value for the writers: a :class:`shmbus.Context` as JSON."""
    return json.dumps(dataclasses.asdict(context))


def encode_reserved_value(batch_id: int, partition_id: int, row_index: int) -> int:
    """The reserved value the writers put on a row's message (a signed 64-bit integer)."""
    if not 0 <= batch_id < 1 << BATCH_ID_BITS:
        raise ValueError(f"batch id {batch_id} does not fit {BATCH_ID_BITS} bits")
    if not 0 <= partition_id < 1 << PARTITION_BITS:
        raise ValueError(f"partition id {partition_id} does not fit {PARTITION_BITS} bits: "
                         f"write with fewer than {1 << PARTITION_BITS} partitions")
    if not 0 <= row_index < 1 << ROW_BITS:
        raise ValueError(f"row index {row_index} does not fit {ROW_BITS} bits: a task may write "
                         f"at most {1 << ROW_BITS} rows (repartition)")
    value = batch_id << 32 | partition_id << ROW_BITS | row_index
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_reserved_value(value: int) -> tuple[int, int, int]:
    """(batch_id, partition_id, row_index) of a message the writers published."""
    value &= (1 << 64) - 1
    return value >> 32, (value >> ROW_BITS) & ((1 << PARTITION_BITS) - 1), \
        value & ((1 << ROW_BITS) - 1)


class ReplayFilter:
    """Drops the messages a Spark writer published again (task retries, re-run batches).

    Call it with each message's reserved value: True for a row seen for the first time. It
    keeps, per (batch, partition), the highest row index seen; rows of a task arrive in order,
    so a row at or below it is a replay. ``keep_batches`` recent batch ids are remembered.
    """

    def __init__(self, keep_batches: int = 1024) -> None:
        self.keep_batches = keep_batches
        self._seen: dict[tuple[int, int], int] = {}
        self._batches: dict[int, None] = {}

    def __call__(self, reserved_value: int) -> bool:
        batch_id, partition_id, row_index = decode_reserved_value(reserved_value)
        key = (batch_id, partition_id)
        last = self._seen.get(key, -1)
        if row_index <= last:
            return False
        self._seen[key] = row_index
        if batch_id not in self._batches:
            self._batches[batch_id] = None
            while len(self._batches) > self.keep_batches:
                old = next(iter(self._batches))
                del self._batches[old]
                for k in [k for k in self._seen if k[0] == old]:
                    del self._seen[k]
        return True


# -- the data source --------------------------------------------------------------------------


class ShmbusDataSource(DataSource):
    """The ``shmbus`` data source: see the module documentation for its options."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return read_schema(_option(self.options, "record_dtype"))

    def reader(self, schema: StructType) -> DataSourceReader:
        _check_read_schema(schema, self.schema())
        return ShmbusReader(dict(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        _check_read_schema(schema, self.schema())
        return ShmbusStreamReader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return ShmbusWriter(dict(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamArrowWriter:
        return ShmbusStreamWriter(dict(self.options), schema)


def _check_read_schema(schema: StructType, expected: StructType) -> None:
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType)
                                                         for f in expected.fields]:
        raise ValueError(f"the shmbus source's schema is {expected.simpleString()} (set by "
                         f"option record_dtype), not {schema.simpleString()}")


# -- record_dtype: payloads that are numpy records, decoded into columns -----------------------

_SPARK_TYPES = {
    "b1": (BooleanType, pa.bool_()), "i1": (ByteType, pa.int8()), "i2": (ShortType, pa.int16()),
    "i4": (IntegerType, pa.int32()), "i8": (LongType, pa.int64()),
    "u1": (ShortType, pa.int16()), "u2": (IntegerType, pa.int32()),
    "u4": (LongType, pa.int64()), "f4": (FloatType, pa.float32()),
    "f8": (DoubleType, pa.float64()),
}


def parse_record_dtype(text: str) -> np.dtype:
    """``"name:type,..."`` (numpy type codes: i1..i8, u1..u4, f4, f8, b1, M8[ns|us|ms|s])
    as a packed little-endian numpy record dtype."""
    fields = []
    for item in str(text).split(","):
        name, _, code = item.strip().partition(":")
        try:
            dtype = np.dtype(code.strip()).newbyteorder("<")
        except TypeError:
            raise ValueError(f"record_dtype field {item.strip()!r}: {code!r} is not a numpy "
                             f"type") from None
        key = f"{dtype.kind}{dtype.itemsize}"
        if key not in _SPARK_TYPES and dtype.kind != "M":
            raise ValueError(f"record_dtype field {name!r}: type {code!r} is not supported "
                             f"(i1..i8, u1..u4, f4, f8, b1, M8[unit])")
        if not name.strip() or name.strip() in {f.name for f in SCHEMA.fields}:
            raise ValueError(f"record_dtype field name {name!r} is empty or a column already")
        fields.append((name.strip(), dtype))
    return np.dtype(fields)


def _record_fields(dtype: np.dtype) -> list[tuple[str, np.dtype]]:
    """The (name, type) of each field of a record dtype from :func:`parse_record_dtype`."""
    assert dtype.names is not None and dtype.fields is not None
    return [(name, dtype.fields[name][0]) for name in dtype.names]


def read_schema(record_dtype: str | None) -> StructType:
    """The source's columns: :data:`SCHEMA`, then the ``record_dtype`` fields if any."""
    if not record_dtype:
        return SCHEMA
    extra = []
    for name, field in _record_fields(parse_record_dtype(record_dtype)):
        kind = TimestampType() if field.kind == "M" else \
            _SPARK_TYPES[f"{field.kind}{field.itemsize}"][0]()
        extra.append(StructField(name, kind, True))
    return StructType([*SCHEMA.fields, *extra])


def _record_columns(batch: MessageBatch, dtype: np.dtype) -> list[pa.Array]:
    """The record fields of every message, null where the payload is not one record long."""
    n = len(batch)
    fits = batch.lengths == dtype.itemsize
    if fits.all():
        records = batch.data.view(dtype) if n else np.empty(0, dtype)
        mask = None
    else:
        records = np.zeros(n, dtype)
        rows = np.flatnonzero(fits)
        index = batch.offsets[rows][:, None] + np.arange(dtype.itemsize)
        records[rows] = batch.data[index].view(dtype).reshape(len(rows))
        mask = ~fits
    columns = []
    for name, _ in _record_fields(dtype):
        values = records[name]
        if values.dtype.kind == "M":
            columns.append(pa.array(values.astype("M8[us]").view(np.int64),
                                    pa.timestamp("us", tz="UTC"), mask=mask))
        else:
            arrow = _SPARK_TYPES[f"{values.dtype.kind}{values.dtype.itemsize}"][1]
            columns.append(pa.array(values.astype(arrow.to_pandas_dtype()), arrow, mask=mask))
    return columns


def _arrow_schema(dtype: np.dtype | None) -> pa.Schema:
    if dtype is None:
        return ARROW_SCHEMA
    fields = list(ARROW_SCHEMA)
    for name, field in _record_fields(dtype):
        arrow = pa.timestamp("us", tz="UTC") if field.kind == "M" else \
            _SPARK_TYPES[f"{field.kind}{field.itemsize}"][1]
        fields.append(pa.field(name, arrow, True))
    return pa.schema(fields)


def _option(options: Mapping[str, str], name: str, default: Any = None) -> Any:
    """An option by name, case-insensitive, also accepting camelCase for snake_case names."""
    wanted = {name.lower(), name.replace("_", "").lower()}
    for key, value in options.items():
        if key.lower() in wanted or key.replace("_", "").lower() in wanted:
            return value
    return default


@overload
def _int_option(options: Mapping[str, str], name: str, default: int) -> int: ...
@overload
def _int_option(options: Mapping[str, str], name: str, default: None = None) -> int | None: ...
def _int_option(options: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    value = _option(options, name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"option {name}={value!r} is not an integer") from None


class RecordingRange(InputPartition):
    """One partition: the messages of one recording that begin in [from, to).

    Carries everything an executor needs (it never reads the catalog): the directory, the
    recording's catalog entry and ``limit``, how far frames may be read to complete a message.
    """

    def __init__(self, directory: str, descriptor: dict[str, Any], from_position: int,
                 to_position: int, limit: int, record_dtype: str | None = None,
                 chunk_bytes: int = CHUNK_LENGTH) -> None:
        super().__init__((descriptor["recording_id"], from_position, to_position))
        self.directory = directory
        self.descriptor = descriptor
        self.from_position = from_position
        self.to_position = to_position
        self.limit = limit
        self.record_dtype = record_dtype
        self.chunk_bytes = chunk_bytes

    def __repr__(self) -> str:
        return (f"RecordingRange(recording {self.descriptor['recording_id']}, "
                f"[{self.from_position}, {self.to_position}), limit {self.limit})")


class _RecordingSource:
    """What the batch and the stream readers share: options, selection and planning."""

    def __init__(self, options: dict[str, str]) -> None:
        path = _option(options, "path")
        if not path:
            raise ValueError("the shmbus source needs option path (a recording directory)")
        self.directory = os.path.abspath(path)
        ids = _option(options, "recording_ids") or _option(options, "recording_id")
        self.recording_ids = None if ids is None else {int(i) for i in str(ids).split(",")
                                                       if i.strip()}
        self.stream_id = _int_option(options, "stream_id")
        self.session_id = _int_option(options, "session_id")
        self.channel = _option(options, "channel")
        self.record_dtype = _option(options, "record_dtype")
        if self.record_dtype:
            parse_record_dtype(self.record_dtype)  # checked here, on the driver
        self.chunk_bytes = _int_option(options, "chunk_bytes", CHUNK_LENGTH)
        self.partition_bytes = _int_option(options, "partition_bytes", PARTITION_BYTES_DEFAULT)
        if self.partition_bytes <= 0:
            raise ValueError("option partition_bytes must be positive")

    def recordings(self) -> dict[int, RecordingDescriptor]:
        """The selected recordings, by id."""
        selected = {}
        for d in read_catalog(self.directory):
            if ((self.recording_ids is None or d.recording_id in self.recording_ids)
                    and (self.stream_id is None or d.stream_id == self.stream_id)
                    and (self.session_id is None or d.session_id == self.session_id)
                    and (self.channel is None or d.channel == self.channel)):
                selected[d.recording_id] = d
        return selected

    def plan(self, d: RecordingDescriptor, start: int, end: int,
             limit: int) -> list[RecordingRange]:
        """Partitions of [start, end): whole segments up to partition_bytes each, or pieces of
        a segment cut at term boundaries when a segment is larger than that."""
        unit = d.segment_length if d.segment_length <= self.partition_bytes else d.term_length
        ranges = []
        entry = d.to_json()
        position = start
        while position < end:
            cut = (position + self.partition_bytes) // unit * unit
            if cut <= position:
                cut = (position // unit + 1) * unit
            stop = min(end, cut)
            ranges.append(RecordingRange(self.directory, entry, position, stop, limit,
                                         self.record_dtype, self.chunk_bytes))
            position = stop
        return ranges

    @staticmethod
    def read_range(partition: RecordingRange) -> Iterator[pa.RecordBatch]:
        descriptor = RecordingDescriptor.from_json(partition.descriptor)
        reader = RecordingReader(partition.directory, descriptor)
        dtype = parse_record_dtype(partition.record_dtype) if partition.record_dtype else None
        for batch in reader.read_batches(partition.from_position, partition.to_position,
                                         limit=partition.limit,
                                         chunk_length=partition.chunk_bytes):
            yield to_arrow(batch, dtype)


def to_arrow(batch: MessageBatch, record_dtype: np.dtype | None = None) -> pa.RecordBatch:
    """A :class:`~shmbus.archive.recording_reader.MessageBatch` as an Arrow batch of :data:`SCHEMA`
    (then the fields of ``record_dtype``, decoded from the payloads, if given)."""
    n = len(batch)
    payload = pa.Array.from_buffers(pa.binary(), n, [
        None, pa.py_buffer(batch.offsets.astype(np.int32)), pa.py_buffer(batch.data)])
    times = batch.record_times
    unknown = times < 0
    record_time = pa.array(times // 1000, pa.timestamp("us", tz="UTC"),
                           mask=unknown if unknown.any() else None)
    return pa.RecordBatch.from_arrays([
        pa.array(np.full(n, batch.recording_id, np.int64)),
        pa.array(batch.positions),
        pa.array(np.full(n, batch.session_id, np.int32)),
        pa.array(np.full(n, batch.stream_id, np.int32)),
        pa.array(batch.term_ids),
        pa.array(batch.term_offsets),
        pa.array(batch.reserved_values),
        payload,
        record_time,
        *([] if record_dtype is None else _record_columns(batch, record_dtype)),
    ], schema=_arrow_schema(record_dtype))


class ShmbusReader(_RecordingSource, DataSourceReader):
    """Batch read: every selected recording from ``start_position`` to ``end_position`` (default:
    its start and its live position when the query is planned)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.start_position = _int_option(options, "start_position", 0)
        self.end_position = _int_option(options, "end_position")

    def partitions(self) -> list[InputPartition]:
        ranges: list[InputPartition] = []
        for d in self.recordings().values():
            live = live_position(self.directory, d)
            end = live if self.end_position is None else min(self.end_position, live)
            ranges.extend(self.plan(d, max(d.start_position, self.start_position), end, live))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RecordingRange):  # Spark's placeholder: nothing to read
            return iter(())
        return _RecordingSource.read_range(partition)


def _offset(positions: dict[int, int]) -> dict[str, Any]:
    return {"recordings": {str(rid): {"position": int(positions[rid])}
                           for rid in sorted(positions)}}


def _positions(offset: dict[str, Any] | None) -> dict[int, int]:
    if not offset:
        return {}
    return {int(rid): int(entry["position"]) for rid, entry in offset["recordings"].items()}


class ShmbusStreamReader(_RecordingSource, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming read of a recording directory, while the recorder writes it."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.starting_position = str(_option(options, "starting_position", "earliest")).lower()
        if self.starting_position not in ("earliest", "latest"):
            raise ValueError(f"option starting_position={self.starting_position!r} must be "
                             f"earliest or latest")
        self.max_bytes_per_trigger = _int_option(options, "maxBytesPerTrigger")
        if self.max_bytes_per_trigger is not None and self.max_bytes_per_trigger <= 0:
            raise ValueError("option maxBytesPerTrigger must be positive")
        self._target: dict[int, int] | None = None

    def _live(self) -> dict[int, tuple[RecordingDescriptor, int]]:
        live = {rid: (d, live_position(self.directory, d))
                for rid, d in self.recordings().items()}
        if self._target is not None:  # Trigger.AvailableNow: nothing past the target
            live = {rid: (d, min(p, self._target[rid])) for rid, (d, p) in live.items()
                    if rid in self._target}
        return live

    def initialOffset(self) -> dict[str, Any]:
        live = self._live()
        if self.starting_position == "latest":
            return _offset({rid: p for rid, (_, p) in live.items()})
        return _offset({rid: d.start_position for rid, (d, _) in live.items()})

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_bytes_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxBytes(self.max_bytes_per_trigger)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        positions = _positions(start)
        begins: dict[int, int] = {}
        wanted: dict[int, int] = {}
        for rid, (d, live) in self._live().items():
            begins[rid] = positions.get(rid, d.start_position)
            if live > begins[rid]:
                wanted[rid] = live - begins[rid]
        budget = limit.max_bytes if isinstance(limit, ReadMaxBytes) else None
        for rid, take in _share(wanted, budget).items():
            if take > 0:
                positions[rid] = begins[rid] + take
        return _offset(positions)

    def reportLatestOffset(self) -> dict[str, Any]:
        return _offset({rid: p for rid, (_, p) in self._live().items()})

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = None
        self._target = {rid: p for rid, (_, p) in self._live().items()}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, finish = _positions(start), _positions(end)
        recordings = self.recordings()
        ranges: list[InputPartition] = []
        for rid, stop in finish.items():
            d = recordings.get(rid)
            if d is None:
                raise RecordingError(f"recording {rid} is no longer in {self.directory}")
            first = begin.get(rid, d.start_position)
            if stop > first:
                limit = max(live_position(self.directory, d), stop)
                ranges.extend(self.plan(d, first, stop, limit))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # partitions() makes only RecordingRanges
        return _RecordingSource.read_range(cast(RecordingRange, partition))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: recordings are kept (delete them when no query needs them)."""


def _share(wanted: dict[int, int], budget: int | None) -> dict[int, int]:
    """Split ``budget`` bytes fairly between recordings wanting ``wanted`` bytes (water-fill)."""
    if budget is None:
        return dict(wanted)
    given = dict.fromkeys(wanted, 0)
    hungry = sorted(rid for rid, w in wanted.items() if w > 0)
    while budget > 0 and hungry:
        share = max(1, budget // len(hungry))
        for rid in list(hungry):
            take = min(share, wanted[rid] - given[rid], budget)
            given[rid] += take
            budget -= take
            if given[rid] == wanted[rid]:
                hungry.remove(rid)
            if budget == 0:
                break
    return given


# -- writers ----------------------------------------------------------------------------------


@dataclasses.dataclass
class ShmbusCommitMessage(WriterCommitMessage):
    """What a write task reports: its partition, batch id, rows published and session."""

    partition_id: int
    batch_id: int
    rows: int
    session_id: int


_publications: dict[tuple[Any, ...], tuple[int, Any, Any]] = {}


def _publication(context_json: str | None, directory: str | None, channel: str,
                 stream_id: int) -> Any:
    """A publication cached per process (Spark reuses its Python workers)."""
    import shmbus

    key = (context_json, directory, channel, stream_id)
    cached = _publications.get(key)
    if cached is not None:
        pid, client, publication = cached
        if pid == os.getpid() and not client.is_closed and not publication.is_closed:
            return publication
        del _publications[key]
    if context_json:
        context = shmbus.Context(**json.loads(context_json))
    else:
        context = shmbus.Context.resolve(dir=directory)
    client = shmbus.connect(context)
    publication = client.add_publication(channel, stream_id)
    _publications[key] = (os.getpid(), client, publication)
    return publication


def close_publications() -> None:
    """Close the bus clients the writers opened in this process (they are cached between the
    tasks a reused Python worker runs; a worker that exits closes them anyway)."""
    cached = list(_publications.values())
    _publications.clear()
    for pid, client, _ in cached:
        if pid == os.getpid():
            client.close()


class _Publisher:
    """What the batch and the stream writers share."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        self.context_json = _option(options, "context")
        self.directory = _option(options, "dir")
        self.channel = _option(options, "channel", "aeron:ipc")
        stream_id = _int_option(options, "stream_id")
        if stream_id is None:
            raise ValueError("the shmbus sink needs option stream_id")
        self.stream_id = stream_id
        self.column = _option(options, "column", "payload")
        self.publish_timeout = float(_option(options, "publish_timeout", 30.0))
        names = {f.name: f.dataType for f in schema.fields}
        if self.column not in names:
            raise ValueError(f"the shmbus sink publishes column {self.column!r} (option "
                             f"column), which is not in {schema.simpleString()}")
        if not isinstance(names[self.column], (BinaryType, StringType)):
            raise ValueError(f"column {self.column!r} is {names[self.column].simpleString()}; "
                             f"the shmbus sink publishes a binary or string column")

    def publish(self, batches: Iterator[pa.RecordBatch], batch_id: int) -> ShmbusCommitMessage:
        from pyspark import TaskContext

        from shmbus.settings import codes
        from shmbus.settings.errors import PublicationError
        from shmbus.settings.idle_strategy import BackoffIdleStrategy

        task = TaskContext.get()
        partition_id = task.partitionId() if task is not None else 0
        base = encode_reserved_value(batch_id, partition_id, 0)
        publication = _publication(self.context_json, self.directory, self.channel,
                                   self.stream_id)
        offer = publication.offer
        row = 0
        row_limit = 1 << ROW_BITS
        for batch in batches:
            column = batch.column(self.column)
            n = len(column)
            if row + n > row_limit:
                encode_reserved_value(batch_id, partition_id, row + n - 1)  # raises
            offsets, data = _binary_buffers(column)
            valid = None if column.null_count == 0 else np.asarray(
                column.is_valid().to_numpy(zero_copy_only=False))
            bounds = offsets.tolist()
            for i in range(n):
                if valid is not None and not valid[i]:
                    continue  # a null payload is not published (its row index is skipped)
                message = data[bounds[i]:bounds[i + 1]]
                reserved = base + row + i
                if offer(message, reserved_value=reserved) > 0:
                    continue
                deadline = time.monotonic() + self.publish_timeout
                idle = BackoffIdleStrategy()
                while True:
                    result = offer(message, reserved_value=reserved)
                    if result > 0:
                        break
                    if result in (codes.CLOSED, codes.MAX_POSITION_EXCEEDED):
                        raise PublicationError(result)
                    if result != codes.ADMIN_ACTION:
                        if time.monotonic() >= deadline:
                            raise PublicationError(
                                result, f"row {row + i} of partition {partition_id} not "
                                f"published on {self.channel} stream {self.stream_id} within "
                                f"{self.publish_timeout} s: {codes.result_name(result)}")
                        idle.idle(0)
            row += n
        return ShmbusCommitMessage(partition_id, batch_id, row, publication.session_id)


def _binary_buffers(column: pa.Array) -> tuple[np.ndarray, memoryview]:
    """Offsets (n + 1) and data of a binary/string Arrow array, zero copy."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    kind = column.type
    dtype: type[np.signedinteger[Any]]
    if pa.types.is_large_binary(kind) or pa.types.is_large_string(kind):
        dtype = np.int64
    elif pa.types.is_binary(kind) or pa.types.is_string(kind):
        dtype = np.int32
    else:
        raise TypeError(f"cannot publish a column of Arrow type {kind}")
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], dtype)[column.offset:column.offset + len(column) + 1]
    data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")
    return offsets, data


class ShmbusWriter(_Publisher, DataSourceArrowWriter):
    """Batch write: every row published once per successful task (see DELIVERY_GUARANTEE)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        super().__init__(options, schema)
        self.batch_id = _int_option(options, "batch_id", int(time.time()) & 0xFFFFFFFF)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ShmbusCommitMessage:
        return self.publish(iterator, self.batch_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to do: the rows are on the bus already."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing can be undone: rows published by tasks that succeeded stay published."""


class ShmbusStreamWriter(_Publisher, DataSourceStreamArrowWriter):
    """Streaming write: each micro-batch's rows, tagged with its batch id."""

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ShmbusCommitMessage:
        from pyspark import TaskContext

        task = TaskContext.get()
        batch_id = task.getLocalProperty("streaming.sql.batchId") if task is not None else None
        if batch_id is None:
            raise RuntimeError("the shmbus stream writer runs outside a streaming micro-batch "
                               "(no streaming.sql.batchId local property)")
        return self.publish(iterator, int(batch_id))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: the rows are on the bus already."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing can be undone: rows of tasks that succeeded stay published."""
