"""The driver process: what runs in ``shmbus driver`` (or the embedded driver ``connect()`` starts).

It owns the bus directory: the conductor serves the clients' commands
(``shmbus.shm.control_protocol``), links publications to subscriptions, runs IPC flow control
and tethering, cleans and unblocks logs, times out clients, and keeps the system counters. It
imports the shared structures (``shmbus.shm``) and plain settings (``shmbus.settings.context``,
``shmbus.settings.channel_uri``), never the client.
"""
