"""Streams, in the client process: publications that append messages to a log, subscriptions
that read every publishing session's log through an :class:`Image`, subscription groups, and
the large-message path beside the log.

The driver creates the logs; these classes map and use them. The :class:`shmbus.Client`
facade (:mod:`shmbus.client`) makes them. The public names are re-exported by :mod:`shmbus`.
"""
