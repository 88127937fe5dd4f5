"""The ``shmbus`` command line (``app``) and the read-only monitoring it shows.

``shmbus stat``, ``streams``, ``clients``, ``errors`` and ``export`` look at a bus without
disturbing it: nothing writes to the bus directory, sends a command or registers a client.
Each computes its view from one snapshot, so what they show (and their ``--json``) agrees.

* Reading the bus: :mod:`~shmbus.cli.snapshot` (cnc.dat, the counters and the logs'
  positions, read live in an order that makes them agree), :mod:`~shmbus.cli.processes` (the
  driver's and the clients' processes, through psutil) and :mod:`~shmbus.cli.bus_status`
  (running or stale, and the commands' exit codes).
* Views computed from a snapshot, pure functions: :mod:`~shmbus.cli.counter_labels` (which
  stream and client a counter belongs to), :mod:`~shmbus.cli.counter_views` (``stat``),
  :mod:`~shmbus.cli.stream_views`, :mod:`~shmbus.cli.verdicts` and
  :mod:`~shmbus.cli.stream_analysis` (``streams``), :mod:`~shmbus.cli.services` (request/reply
  services in ``streams``) and :mod:`~shmbus.cli.client_views` (``clients``).
* Output: :mod:`~shmbus.cli.rendering` (text and rich tables), :mod:`~shmbus.cli.formatting`
  (sizes and times), :mod:`~shmbus.cli.json_documents` (``--json``, whose JSON Schemas are in
  ``schema/``) and :mod:`~shmbus.cli.metrics` (Prometheus, for ``export``);
  :mod:`~shmbus.cli.app` parses the options and prints.
"""

from shmbus.cli.app import app, main

__all__ = ["app", "main"]
