"""A stop flag shared with worker processes that the nemesis SIGKILLs at any instruction.

``multiprocessing.Event`` guards its flag with a semaphore: a worker killed inside
``is_set()`` holds it forever, and every later ``set()`` or ``is_set()`` hangs. This flag is
one byte of shared memory with no lock: a killed reader or writer of it wedges nothing.
"""

from __future__ import annotations

import ctypes
import time
from multiprocessing.context import BaseContext
from typing import Any

#: how often wait() looks at the flag
_POLL_S = 0.01


class Flag:
    """A one-way flag: clear until :meth:`set`. Made by the orchestrator; passed to workers
    as a Process argument (spawn pickles the shared memory's handle)."""

    def __init__(self, mp: BaseContext) -> None:
        self._value: Any = mp.RawValue(ctypes.c_bool, False)

    def set(self) -> None:
        self._value.value = True

    def is_set(self) -> bool:
        return bool(self._value.value)

    def wait(self, timeout: float) -> bool:
        """True once set, False when ``timeout`` seconds passed first."""
        deadline = time.monotonic() + timeout
        while not self._value.value:
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        return True
