"""Aeron's own C client beside the bus: ``build.sh`` builds libaeron and aeronmd (``make
aeron-c``); ``c/`` holds small programs written against ``aeronc.h`` (a publisher, a
subscriber, a counters reader) that ``programs`` compiles; ``message`` is the checked message
they exchange, in Python. The tests (tests/support/aeron_c.py) and the nemesis
(tools/nemesis/) run them."""
