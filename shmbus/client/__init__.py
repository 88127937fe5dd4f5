"""The client: a user process's connection to the driver.

:class:`Client` sends commands on the driver's command ring, hears its responses on the
broadcast buffer, keeps its lease alive, reconnects to a new driver, and makes publications,
subscriptions (:mod:`shmbus.streams`), requesters and responders (:mod:`shmbus.calls`) and late
joiners (:mod:`shmbus.history`). The public names are re-exported by :mod:`shmbus`.
"""
