"""The client: a user process's connection to the driver.

:class:`~shmbus.client.client.Client` makes publications, subscriptions (:mod:`shmbus.streams`),
requesters and responders (:mod:`shmbus.calls`) and late joiners (:mod:`shmbus.history`). Its
parts: the conductor proxy (conductor_proxy.py) sends commands on the driver's command ring,
hears its responses on the broadcast buffer and keeps its lease alive; reconnection.py moves it
to a new driver; driver_launch.py finds the driver, or starts one; log_mappings.py maps the
logs. The public names are re-exported by :mod:`shmbus`.
"""
