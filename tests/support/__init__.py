"""What the tests share, besides the fixtures of the conftest.py files. No test module
(``test_*.py``) is imported by another: what two tests need lives here
(tests/test_test_layout.py checks it).

* waits: :func:`~tests.support.waits.wait_until`, the one bounded wait for a state (and
  ``await_until`` for a coroutine).
* sleepers: who is asleep, read from outside: a log's sleeping readers and writers, the
  driver's timer heartbeat, a process's CPU time. What a test waits for instead of sleeping.
* processes: spawned client processes and the reports they send back (the ``procs`` fixture).
* drivers: driver processes started until they serve and stopped; tiny cnc.dat lengths.
* system: a tmpfs of a given size, the room left on a file system, io_uring futex waits.
* networks: free UDP ports, two buses with their drivers (and netbridges), channel counters,
  the netbridge a driver started, a checking reader; hosts as network namespaces (from
  tools/bench/network.py, the one copy).
* keyrings: keyring files for keyed channels.
* calls: request/reply counters, reports, calling threads, two buses serving calls.
* groups: subscription groups' task records, and the rule a killed member keeps.
* messages: hypothesis arrays, and hostile array, table and object messages.
* commands: the ``shmbus`` command through typer's runner, or the installed script.
* standalone_stream: a log with a publication and images and no driver.
* recording_helpers: an in-memory log for the recorder's writer, a recording's environment.
* sans_io: a stream's geometry and hand-made frames for the netbridge's state machines.
* fake_log_port, shared_logs: in-memory and shared-memory logs behind the netbridge's port.
* forged_peer: a sender speaking Aeron's wire protocol from plain sockets.
* pcap, wireshark: a pcap reader, and what Wireshark's Aeron dissector shows of a datagram.
* workers/: the targets of spawned processes (imported by the child by module path); no
  test module holds one (tests/test_test_layout.py checks it).
"""
