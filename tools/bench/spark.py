"""shmbus.spark benchmark: batch read of a recording into a Spark DataFrame, beside Parquet.

    python -m tools.bench.spark [--messages N] [--json FILE]   # from the repository root

1. Records N (default 1,000,000) 32-byte messages: a publisher (offer_many of 1024 rows at a
   time) and a Recorder in this process, through an embedded driver, into a recording
   directory in /dev/shm (default segments of 32 MiB). Prints the recording rate.
2. Writes the same rows (the columns the shmbus source gives) to a Parquet file with pyarrow
   (snappy, one row group per 1M rows: what Spark writes by default).
3. In one local SparkSession (local[2], the machine's two cores): two untimed warm-up rounds,
   then the best of ``--repeat`` (default 7) rounds, each running every query on both sources
   in turn (interleaved, so that both meet the same machine load), of
   * ``count()``: what the issue asks for. Parquet answers it from row-group metadata without
     reading a column, the shmbus source reads every message;
   * ``agg(sum(length(payload)))``: both read every payload.
   Prints rows/s for both sources and the ratio shmbus / Parquet.

Everything runs on the same machine in the same run; the recording and the Parquet file are
both in /dev/shm (page cache), so neither pays for disk.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import shmbus
from shmbus import RecordingReader

#: the local SparkSession's settings: on loopback, no UI or progress bars, one shuffle
#: partition per core of local[2], 2 GiB for the driver
SPARK_SETTINGS: dict[str, Any] = {
    "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2", "spark.driver.memory": "2g"}


def record(directory: Path, bus_dir: Path, messages: int) -> tuple[float, int]:
    """Record ``messages`` 32-byte messages; returns the seconds it took and the recording
    id."""
    rows = np.zeros((1024, 32), np.uint8)
    context = shmbus.Context(dir=str(bus_dir), driver_idle_timeout=2.0)
    with shmbus.connect(context) as bus:
        recorder = bus.add_recorder(directory, "aeron:ipc", 1001)
        publication = bus.add_exclusive_publication("aeron:ipc", 1001)
        deadline = time.monotonic() + 30
        while not recorder.recordings:
            recorder.poll()
            if time.monotonic() > deadline:
                raise SystemExit("the recorder saw no image")
        start = time.perf_counter()
        sent = 0
        counter = rows[:, :8].view(np.int64)
        deadline = time.monotonic() + 600
        while sent < messages:
            n = min(1024, messages - sent)
            counter[:n, 0] = np.arange(sent, sent + n)
            result = publication.offer_many(rows[:n])
            if result > 0:
                sent += result
            else:
                recorder.poll()
            if time.monotonic() > deadline:
                raise SystemExit("recording did not finish within 600 s")
        end = publication.position
        recording_id = recorder.recordings[0].recording_id
        while recorder.positions[recording_id] < end:
            recorder.poll()
        elapsed = time.perf_counter() - start
        recorder.close()
    return elapsed, recording_id


def to_parquet(reader: RecordingReader, path: Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmbus.spark import ARROW_SCHEMA, to_arrow

    batches = [to_arrow(b) for b in reader.read_batches()]
    table = pa.Table.from_batches(batches, schema=ARROW_SCHEMA)
    pq.write_table(table, path, row_group_size=1 << 20)
    return table.num_rows


def best_times(repeat: int, runs: dict[tuple[str, str], object],
               warm_up: int = 2) -> dict[tuple[str, str], float]:
    """Best wall time of each run over ``repeat`` rounds, all the runs interleaved in each
    round (so that every source meets the same load), after ``warm_up`` untimed rounds (the
    JVM compiles the read paths of both sources before anything is timed)."""
    for _ in range(warm_up):
        for run in runs.values():
            run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for key, run in runs.items():
            start = time.perf_counter()
            run()
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="shmbus-bench-spark-", dir="/dev/shm"))
    try:
        directory = work / "recording"
        record_seconds, recording_id = record(directory, work / "bus", args.messages)
        reader = RecordingReader(directory, recording_id)
        print(f"recorded {args.messages:,} messages of 32 bytes "
              f"({reader.stop_position / 2**20:.1f} MiB of frames) in {record_seconds:.2f} s: "
              f"{args.messages / record_seconds:,.0f} messages/s")
        parquet = work / "messages.parquet"
        rows = to_parquet(reader, parquet)
        assert rows == args.messages, rows

        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F

        import shmbus.spark

        spark = (SparkSession.builder.master("local[2]").appName("bench-spark")
                 .config(map=SPARK_SETTINGS).getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        shmbus.spark.register(spark)
        try:
            sources = {
                "shmbus": lambda: spark.read.format("shmbus").option("path", str(directory))
                .load(),
                "parquet": lambda: spark.read.parquet(str(parquet)),
            }
            queries = {"count": args.messages, "sum(length(payload))": 32 * args.messages}

            def run(load, query: str) -> None:
                df = load()
                value = df.count() if query == "count" else df.agg(
                    F.sum(F.length("payload"))).collect()[0][0]
                assert value == queries[query], (query, value)

            best = best_times(args.repeat, {
                (query, name): lambda load=load, query=query: run(load, query)
                for query in queries for name, load in sources.items()})
            results: dict[str, dict[str, float]] = {}
            for (query, name), seconds in best.items():
                results.setdefault(query, {})[name] = args.messages / seconds
        finally:
            spark.stop()
        print(f"\nSpark local[2], {args.messages:,} rows, best of {args.repeat} interleaved "
              f"rounds after 2 warm-up rounds (load average {os.getloadavg()[0]:.1f}):")
        print(f"{'query':<24}{'shmbus rows/s':>16}{'parquet rows/s':>17}{'shmbus/parquet':>16}")
        for query, by_source in results.items():
            ratio = by_source["shmbus"] / by_source["parquet"]
            print(f"{query:<24}{by_source['shmbus']:>16,.0f}{by_source['parquet']:>17,.0f}"
                  f"{ratio:>16.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"messages": args.messages,
                           "record_messages_per_s": args.messages / record_seconds,
                           "spark_rows_per_s": results}, f, indent=1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
