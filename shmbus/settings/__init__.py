"""What every process shares: its settings (:class:`Context`, channel URIs, idle strategies,
keyrings) and the words for outcomes (result codes and errors).

Plain values with no process of their own: the client, the driver, the netbridge and the
commands all import them. Nothing here imports another shmbus package but :mod:`shmbus.shm`.
"""
