"""Targets of the tests' spawned processes (``multiprocessing`` "spawn": a child imports the
target's module by its path, ``tests.support.workers.<module>``, so these modules import
nothing from a test module and run no test code at import)."""
