"""The benchmarks: one program per measurement, run as ``python -m tools.bench.<program>``
from the repository root (ipc, netbridge, fanout, workers, spark, aeron_clients, ...), and the
modules they share (harness, members, ipc_members, peers, aeron_c, aeron_rounds, network,
report, ...). A program imports the shared
modules and shmbus's public API, never another program (tests/test_layout.py checks it);
tools/README.md has a line per program."""
