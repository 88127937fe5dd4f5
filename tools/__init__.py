"""Programs beside the bus, run from the repository root (``python -m tools.<package>.<program>``):
the benchmarks (tools/bench/) and the fault-injection run (tools/nemesis/). Not installed."""
