"""The nemesis: ``python -m tools.nemesis.run`` (as root, from the repository root) streams
checked messages while faults hit writers, readers, the driver, the netbridge, the disk and
the network; ``check`` is the message format and the checker (pure code), ``workers`` the
writer, reader and recorder processes, ``calls`` request/reply's, ``aeron_pair`` Aeron's own C
writer and reader beside them."""
