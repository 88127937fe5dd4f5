"""What every process maps: the structures in shared memory and the C core that touches them.

Log buffers, the to-driver ring buffer, the to-clients broadcast buffer and the control
protocol carried on them (``control_protocol``: client, driver and netbridge all speak it),
counters, cnc.dat, the error log and positions. Each module draws its layout; every field
another process writes concurrently is read and written through ``_native`` (atomics with
acquire/release ordering). Nothing here knows which process it runs in.
"""
