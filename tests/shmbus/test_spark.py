"""shmbus.spark: the reader and writer classes in plain Python first (fast), then a few real
Spark queries in one local SparkSession (local[2], 127.0.0.1, no UI).

The Spark tests need Java: without ``java`` they fail, saying so (they are not skipped).
"""

from __future__ import annotations

import pickle
import sys
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxBytes

import shmbus
import shmbus.spark as ss
from shmbus.archive.recording_reader import RecordingReader
from tests.support.recording_helpers import FakeLog, random_payloads, start_recording
from tests.support.waits import wait_until

DEADLINE_S = 30.0


def rows_of(batches) -> list[tuple[int, int, bytes]]:
    table = pa.Table.from_batches(list(batches), schema=ss.ARROW_SCHEMA)
    return list(zip(table.column("recording_id").to_pylist(), table.column("position").to_pylist(),
                    table.column("payload").to_pylist(), strict=True))


def expected_rows(recording_id: int, log: FakeLog, upto: int | None = None):
    return [(recording_id, p, m) for p, m, _ in log.messages
            if upto is None or p < upto]


# -- plain Python: the reader classes ---------------------------------------------------------


def test_arrow_schema_is_what_spark_expects() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    assert ss.ARROW_SCHEMA.equals(to_arrow_schema(ss.SCHEMA, timezone="UTC"))


def test_batch_reader_partitions_are_self_contained_and_read_everything(tmp_path) -> None:
    logs = [FakeLog(session_id=1), FakeLog(session_id=2, start_position=65536 * 5 + 1024)]
    writers = []
    for rid, log in enumerate(logs):
        catalog, writer = start_recording(tmp_path, log, segment_length=65536, recording_id=rid)
        for payload in random_payloads(20 + rid, 300):
            log.append(payload)
        log.drain_into(writer, fragment_limit=7)
        catalog.put(writer.finish("test"))
        catalog.close()
        writers.append(writer)
    reader = ss.ShmbusDataSource({"path": str(tmp_path), "partition_bytes": "100000"}).reader(
        ss.SCHEMA)
    partitions = reader.partitions()
    assert len(partitions) > 4
    assert all(p.to_position - p.from_position <= 131072 for p in partitions)
    # executors get the pickled reader and partitions: nothing else
    reader2 = pickle.loads(pickle.dumps(reader))
    rows = rows_of(b for p in partitions for b in reader2.read(pickle.loads(pickle.dumps(p))))
    assert sorted(rows) == expected_rows(0, logs[0]) + expected_rows(1, logs[1])
    batch = next(reader.read(partitions[0]))
    assert batch.schema.equals(ss.ARROW_SCHEMA)
    assert batch.column("record_time").null_count == 0
    one = ss.ShmbusDataSource({"path": str(tmp_path), "recordingIds": "1",
                               "start_position": str(logs[1].messages[10][0])}).reader(ss.SCHEMA)
    rows = rows_of(b for p in one.partitions() for b in one.read(p))
    assert rows == expected_rows(1, logs[1])[10:]
    with pytest.raises(ValueError, match="needs option path"):
        ss.ShmbusDataSource({}).reader(ss.SCHEMA)


def test_stream_reader_offsets_admission_control_and_available_now(tmp_path) -> None:
    log = FakeLog()
    catalog, writer = start_recording(tmp_path, log, segment_length=65536)
    payloads = random_payloads(30, 900, max_length=7000)
    payloads[300] = bytes(range(256)) * 27  # 5 fragments
    for payload in payloads[:300]:
        log.append(payload)
    log.drain_into(writer, fragment_limit=3)
    log.append(payloads[300])
    log.poll_into(writer, fragment_limit=2)  # the live end is inside a fragmented message
    options = {"path": str(tmp_path), "maxBytesPerTrigger": "20000"}
    reader = ss.ShmbusDataSource(options).streamReader(ss.SCHEMA)
    assert reader.getDefaultReadLimit() == ReadMaxBytes(20000)
    start = reader.initialOffset()
    assert start == {"recordings": {"0": {"position": 0}}}
    got: list[tuple[int, int, bytes]] = []

    def run_batches(reader, start, limit, max_batches=1000):
        for _ in range(max_batches):
            end = reader.latestOffset(start, limit)
            if end == start:
                return start
            assert end["recordings"]["0"]["position"] - start["recordings"]["0"]["position"] \
                <= getattr(limit, "max_bytes", 1 << 62)
            for p in reader.partitions(start, end):
                got.extend(rows_of(pickle.loads(pickle.dumps(reader)).read(
                    pickle.loads(pickle.dumps(p)))))
            start = end
        pytest.fail("no end")

    start = run_batches(reader, start, ReadMaxBytes(20000))
    assert got == expected_rows(0, log)[:300]  # not the message still being written
    # the recording grows; AvailableNow fixes a target; what comes after it waits
    for payload in payloads[301:600]:
        log.append(payload)
    log.drain_into(writer, fragment_limit=3)
    reader.prepareForTriggerAvailableNow()
    target = reader.reportLatestOffset()
    for payload in payloads[600:]:
        log.append(payload)
    log.drain_into(writer, fragment_limit=3)
    start = run_batches(reader, start, ReadMaxBytes(20000))
    assert start == target
    assert got == expected_rows(0, log)[:600]
    # a new reader (a restarted query) continues from the checkpointed offset, with a second
    # recording that appeared meanwhile
    log2 = FakeLog(session_id=77)
    catalog.close()
    catalog2, writer2 = start_recording(tmp_path, log2, segment_length=65536)
    for payload in payloads[:50]:
        log2.append(payload)
    log2.drain_into(writer2)
    catalog2.put(writer2.finish("test"))
    reader = ss.ShmbusDataSource(options).streamReader(ss.SCHEMA)
    start = run_batches(reader, start, ReadAllAvailable())
    assert sorted(got) == sorted(expected_rows(0, log) + expected_rows(1, log2))
    assert len(set(got)) == len(got)
    assert set(start["recordings"]) == {"0", "1"}
    catalog2.put(writer.finish("test"))
    catalog2.close()
    latest = ss.ShmbusDataSource({"path": str(tmp_path), "starting_position": "latest"})
    assert latest.streamReader(ss.SCHEMA).initialOffset() == start


def test_record_dtype_decodes_numpy_record_payloads_into_columns(tmp_path) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema

    tick = np.dtype([("time", "<i8"), ("symbol", "<i4"), ("price", "<f8")])
    log = FakeLog()
    catalog, writer = start_recording(tmp_path, log)
    ticks = np.zeros(500, tick)
    ticks["time"] = 1_700_000_000_123_456_789 + np.arange(500) * 1000
    ticks["symbol"] = np.arange(500) % 7
    ticks["price"] = np.linspace(1, 2, 500)
    for i, record in enumerate(ticks):
        log.append(b"not a tick" if i == 3 else record.tobytes())
    log.drain_into(writer, fragment_limit=50)
    catalog.put(writer.finish("test"))
    catalog.close()
    options = {"path": str(tmp_path), "record_dtype": "time:M8[ns],symbol:i4,price:f8"}
    source = ss.ShmbusDataSource(options)
    schema = source.schema()
    assert schema.simpleString().endswith("time:timestamp,symbol:int,price:double>")
    reader = source.reader(schema)
    table = pa.Table.from_batches([b for p in reader.partitions() for b in reader.read(p)])
    assert table.schema.equals(to_arrow_schema(schema, timezone="UTC"))
    assert table.column("symbol").to_pylist() == [
        None if i == 3 else i % 7 for i in range(500)]
    times = table.column("time").cast(pa.int64()).to_numpy(zero_copy_only=False)
    assert times[0] == 1_700_000_000_123_456 and times[-1] == 1_700_000_000_123_456 + 499
    assert table.column("price").null_count == 1
    with pytest.raises(ValueError, match="not supported"):
        ss.ShmbusDataSource({**options, "record_dtype": "x:c16"}).schema()
    with pytest.raises(ValueError, match="schema is"):
        source.reader(ss.SCHEMA)


def test_byte_budget_is_shared_fairly() -> None:
    assert ss._share({1: 100, 2: 5, 3: 100}, 60) == {1: 28, 2: 5, 3: 27}
    assert ss._share({1: 10}, None) == {1: 10}
    assert sum(ss._share({i: 1000 for i in range(7)}, 5).values()) == 5


# -- plain Python: the writer classes -----------------------------------------------------------


def test_reserved_value_layout() -> None:
    value = ss.encode_reserved_value(2**32 - 1, 1023, 2**22 - 1)
    assert value == -1
    assert ss.decode_reserved_value(ss.encode_reserved_value(7, 3, 12345)) == (7, 3, 12345)
    with pytest.raises(ValueError, match="repartition"):
        ss.encode_reserved_value(1, 0, 2**22)
    with pytest.raises(ValueError, match="fewer than 1024 partitions"):
        ss.encode_reserved_value(1, 1024, 0)
    keep = ss.ReplayFilter(keep_batches=2)
    values = [ss.encode_reserved_value(b, p, r) for b, p, r in
              [(1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 0, 0), (1, 0, 1), (1, 0, 2), (2, 0, 0),
               (3, 0, 0), (2, 0, 0)]]
    assert [keep(v) for v in values] == [True, True, True, False, False, True, True, True,
                                         False]


def test_writer_publishes_each_row_with_its_tag(bus_context, driver) -> None:
    schema = ss.SCHEMA
    options = {"context": ss.context_option(bus_context), "stream_id": "41",
               "batch_id": "9", "publish_timeout": "5"}
    writer = pickle.loads(pickle.dumps(ss.ShmbusDataSource(options).writer(schema, False)))
    payloads = [b"", b"x", b"y" * 3000, b"z" * 20]
    table = pa.table({"payload": pa.array(payloads * 40, pa.binary())})
    try:
        with shmbus.connect(bus_context) as bus:
            subscription = bus.add_subscription("aeron:ipc", 41)
            got = []
            assembler = shmbus.FragmentAssembler(
                lambda b, h: got.append((bytes(b), h.reserved_value)))
            for attempt in range(2):  # a retried task publishes its rows again
                results: list[ss.ShmbusCommitMessage] = []
                task = threading.Thread(target=lambda out=results: out.append(
                    writer.write(iter(table.to_batches(max_chunksize=50)))))
                task.start()
                wait_until(lambda n=attempt: len(got) == 160 * (n + 1), DEADLINE_S, "every row",
                           poll=lambda: subscription.poll(assembler, 100))
                task.join(DEADLINE_S)
                (message,) = results
                assert (message.partition_id, message.batch_id, message.rows) == (0, 9, 160)
            keep = ss.ReplayFilter()
            kept = [(m, ss.decode_reserved_value(rv)) for m, rv in got if keep(rv)]
            assert kept == [(m, (9, 0, i)) for i, m in enumerate(payloads * 40)]
            # a string column chosen by option, nulls skipped
            strings = ss.ShmbusDataSource({**options, "column": "text"}).writer(
                ss.SCHEMA.add("text", "string"), False)
            got.clear()
            strings.write(iter([pa.record_batch({"text": pa.array(["a", None, "ccc"])})]))
            wait_until(lambda: len(got) == 2, DEADLINE_S, "the two messages published",
                       poll=lambda: subscription.poll(assembler, 10))
            assert [(m, ss.decode_reserved_value(rv)[2]) for m, rv in got] == [(b"a", 0),
                                                                               (b"ccc", 2)]
            # nobody subscribed: the task fails after publish_timeout, saying why
            lonely = ss.ShmbusDataSource({**options, "stream_id": "42",
                                          "publish_timeout": "0.2"}).writer(schema, False)
            with pytest.raises(shmbus.PublicationError, match="NOT_CONNECTED"):
                lonely.write(iter(table.to_batches()))
    finally:
        ss.close_publications()
    with pytest.raises(ValueError, match="binary or string"):
        ss.ShmbusDataSource({"stream_id": "1", "column": "position"}).writer(schema, False)


def test_the_spark_guide_states_the_delivery_guarantee_word_for_word() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "guides" /
             "recordings-and-spark.md").read_text()
    quoted = " ".join(line.strip()[1:].strip() for line in guide.splitlines()
                      if line.strip().startswith(">"))
    # as the page renders it: Markdown's backslash escapes (\*\* for **) are not text
    quoted = quoted.replace("\\", "")
    assert " ".join(ss.DELIVERY_GUARANTEE.split()) in " ".join(quoted.split())


# -- real Spark ---------------------------------------------------------------------------------


def test_spark_batch_read_equals_the_recorded_messages(spark, bus_context, driver,
                                                       tmp_path) -> None:
    directory = tmp_path / "rec"
    with shmbus.connect(bus_context) as bus:
        recorder = bus.add_recorder(directory, "aeron:ipc", 43, segment_length=131072)
        publications = [bus.add_exclusive_publication("aeron:ipc", 43) for _ in range(2)]
        wait_until(lambda: len(recorder.recordings) == 2, DEADLINE_S, "images", poll=recorder.poll)
        for i, payload in enumerate(random_payloads(40, 1200, max_length=5000)):
            publication = publications[i % 2]
            wait_until(lambda p=publication, m=payload, r=i: p.offer(m, reserved_value=r) > 0,
                       DEADLINE_S, f"room for message {i}", poll=recorder.poll)
        ends = {p.session_id: p.position for p in publications}
        wait_until(lambda: all(recorder.positions[r.recording_id] >= ends[r.session_id]
                               for r in recorder.recordings), DEADLINE_S, "recorded",
                   poll=recorder.poll)
        recorder.close()
    expected = sorted((m.position, m.session_id, m.reserved_value, m.payload)
                      for rid in (0, 1) for m in RecordingReader(directory, rid).messages())
    assert len(expected) == 1200
    df = spark.read.format("shmbus").option("path", str(directory)).load()
    rows = df.select("position", "session_id", "reserved_value", "payload",
                     "record_time").collect()
    assert sorted((r.position, r.session_id, r.reserved_value, bytes(r.payload))
                  for r in rows) == expected
    assert all(r.record_time is not None for r in rows)
    assert df.filter("stream_id = 43").count() == 1200


def test_spark_available_now_reads_each_message_once_across_a_restart(spark,
                                                                       tmp_path) -> None:
    log = FakeLog()
    catalog, writer = start_recording(tmp_path / "rec", log, segment_length=65536)
    payloads = random_payloads(50, 900, max_length=6000)
    for payload in payloads[:400]:
        log.append(payload)
    log.drain_into(writer, fragment_limit=5)
    seen: list[tuple[int, int, int]] = []
    fail_batch = [2]

    def collect(df, batch_id):
        rows = df.select("recording_id", "position").collect()
        if batch_id == fail_batch[0]:
            fail_batch[0] = -1
            raise RuntimeError("a failure in the middle of the query")
        seen.extend((batch_id, r.recording_id, r.position) for r in rows)

    def run():
        query = (spark.readStream.format("shmbus").option("path", str(tmp_path / "rec"))
                 .option("maxBytesPerTrigger", 250_000).load()
                 .writeStream.foreachBatch(collect)
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        try:
            return query.awaitTermination(120)
        except Exception as e:  # the failed batch: the query stops, its offsets are logged
            assert "a failure in the middle" in str(e)
            return None

    assert run() is None  # batch 2 failed: batches 0 and 1 done
    assert {b for b, _, _ in seen} == {0, 1}
    assert run() is True  # restarted from the checkpoint: batch 2 again, then the rest
    first = {(rid, p) for _, rid, p in seen}
    assert first == {(0, p) for p, _, _ in log.messages}
    # the recording grows (the writer is live: its last message is still being written)
    for payload in payloads[400:]:
        log.append(payload)
    log.drain_into(writer, fragment_limit=5)
    log.append(payloads[0] * 2)
    log.poll_into(writer, fragment_limit=2)
    assert run() is True
    positions = [(rid, p) for _, rid, p in seen]
    assert len(positions) == len(set(positions))  # each message once
    assert sorted(positions) == [(0, p) for p, _, _ in log.messages[:-1]]
    batches = sorted({b for b, _, _ in seen})
    assert batches == list(range(len(batches))) and len(batches) > 5
    catalog.put(writer.finish("test"))
    catalog.close()


def test_spark_stream_write_publishes_every_row_to_a_live_subscriber(spark, bus_context,
                                                                     driver, tmp_path) -> None:
    log = FakeLog()
    catalog, writer = start_recording(tmp_path / "rec", log, segment_length=65536)
    for i in range(3000):
        log.append(i.to_bytes(4, "little") * (1 + i % 50))
    log.drain_into(writer, fragment_limit=64)
    catalog.put(writer.finish("test"))
    catalog.close()
    with shmbus.connect(bus_context) as bus:
        subscription = bus.add_subscription("aeron:ipc", 44)
        got = []
        assembler = shmbus.FragmentAssembler(
            lambda b, h: got.append((bytes(b), h.reserved_value)))
        query = (spark.readStream.format("shmbus").option("path", str(tmp_path / "rec"))
                 .option("maxBytesPerTrigger", 60_000).option("partition_bytes", 32768).load()
                 .select("payload")
                 .writeStream.format("shmbus").option("context", ss.context_option(bus_context))
                 .option("stream_id", 44)
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(availableNow=True).start())
        wait_until(lambda: not query.isActive and not subscription.poll(assembler, 1000), 120,
                   "the query to finish", poll=lambda: subscription.poll(assembler, 1000))
        assert query.exception() is None
        wait_until(lambda: len(got) >= 3000, DEADLINE_S, "every row",
                   poll=lambda: subscription.poll(assembler, 1000))
    keep = ss.ReplayFilter()
    kept = [(m, ss.decode_reserved_value(rv)) for m, rv in got if keep(rv)]
    assert sorted(m for m, _ in kept) == sorted(m for _, m, _ in log.messages)
    tags = [tag for _, tag in kept]
    assert len(set(tags)) == 3000
    assert len({b for b, _, _ in tags}) > 1  # several micro-batches ...
    assert len({(b, p) for b, p, _ in tags}) > len({b for b, _, _ in tags})  # ... partitions
    # rows of one task arrive in order, numbered from 0
    for key in {(b, p) for b, p, _ in tags}:
        rows = [r for b, p, r in tags if (b, p) == key]
        assert rows == list(range(len(rows)))
    assert np.all(np.array([len(m) for m, _ in kept]) > 0)


def test_spark_tests_ran_with_this_python(spark) -> None:
    assert Path(spark.conf.get("spark.pyspark.python")) == Path(sys.executable)
