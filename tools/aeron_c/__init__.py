"""Aeron's own C client beside the bus: ``build.sh`` builds libaeron and aeronmd (``make
aeron-c``); ``c/`` holds small programs written against ``aeronc.h`` (a publisher, a
subscriber, a counters reader) that ``programs`` compiles; ``message`` is the checked message
they exchange, in Python. The tests (tests/support/aeron_c.py), the nemesis (tools/nemesis/)
and the benchmark tools/bench/aeron_clients.py run them."""
