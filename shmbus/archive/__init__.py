"""Recordings: the recorder (a client that appends a stream's frames to segment files), the
catalog, and the reader that reads recordings by position and replays them onto a bus.
Runs in the application's process (or ``shmbus record``); reads the files, never cnc.dat.
"""
