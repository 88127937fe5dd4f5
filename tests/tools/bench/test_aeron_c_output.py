"""tools/bench/aeron_c.py reads the Aeron C samples' output: the figures come from the lines the
samples print (excerpts of real runs of streaming_publisher and cping from Aeron 1.48), and
output without them is a clear error, never a made-up figure."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.bench.aeron_c import find_binaries, parse_ping_histogram, parse_publisher_total
from tools.bench.harness import Unavailable

PUBLISHER = """\
Streaming 3000000 messages of payload length 32 bytes to aeron:udp?endpoint=127.0.0.1:40123 on \
stream id 1001
Publication channel status 1
1000ms, 6.514e+05 msgs/sec, 2.084e+07 bytes/sec, totals 651424 messages 19 MB payloads
Done sending.
Publisher back pressure ratio 55.9862
Total: 9489ms, 3.161e+05 msgs/sec, 1.012e+07 bytes/sec, totals 3000000 messages 91 MB payloads
"""

PING = """\
Pinging 1000 messages of length 32 bytes
       Value   Percentile   TotalCount 1/(1-Percentile)

     135.551     0.000000            1         1.00
    1443.839     0.100000          100         1.11
    6914.047     0.500000          500         2.00
    8384.511     0.550000          550         2.22
   43941.887     0.900000          900        10.00
   46792.703     0.912500          913        11.43
  115015.679     0.989062          990        91.43
  120127.487     0.990625          991       106.67
  540016.639     1.000000         1000          inf
#[Mean    =    17723.410, StdDeviation   =    31402.843]
#[Max     =   540016.639, Total count    =         1000]
#[Buckets =           24, SubBuckets     =         2048]
Shutting down...
"""


def test_the_publisher_total_line_gives_rate_count_and_time() -> None:
    assert parse_publisher_total(PUBLISHER) == {
        "messages": 3_000_000, "seconds": 9.489, "msgs_per_s": 3.161e5, "mb_per_s": 10.12}


def test_the_ping_histogram_gives_percentiles_at_or_above_each_rank() -> None:
    assert parse_ping_histogram(PING) == {
        "p50_us": 6914.047, "p90_us": 43941.887, "p99_us": 120127.487, "max_us": 540016.639,
        "round_trips": 1000}


@pytest.mark.parametrize("parse, output", [
    (parse_publisher_total, PUBLISHER.replace("Total:", "Sum:")),  # interrupted: no total
    (parse_ping_histogram, PING.split("#[Max")[0]),  # cut off before the summary
    (parse_ping_histogram, "Pinging 1000 messages of length 32 bytes\n"),
])
def test_output_without_the_figures_is_an_error_quoting_it(parse, output) -> None:
    with pytest.raises(ValueError, match="output: .*"):
        parse(output)


def test_a_build_directory_without_the_samples_is_named_with_what_is_missing(
        tmp_path: Path) -> None:
    (tmp_path / "aeronmd").write_text("")
    (tmp_path / "aeronmd").chmod(0o755)
    (tmp_path / "cping").write_text("")  # not executable
    with pytest.raises(Unavailable, match="no executable streaming_publisher, rate_subscriber, "
                                          "cping, cpong"):
        find_binaries(tmp_path)
