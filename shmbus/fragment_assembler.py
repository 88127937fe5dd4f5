"""Reassembly of fragmented messages, per publishing session (Aeron's FragmentAssembler)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shmbus._native import Header
from shmbus.log_buffer import BEGIN_FLAG, END_FLAG, UNFRAGMENTED


class FragmentAssembler:
    """A fragment handler that calls ``delegate(buffer, header)`` once per whole message.

    Unfragmented messages pass straight through (zero copy). Fragments are copied into a
    per-session buffer until the E flag arrives; the delegate then gets a memoryview of the
    whole message (valid during the call) and the header of the last fragment. A fragment
    that arrives without a begun message (joined mid-message) is dropped.
    """

    __slots__ = ("delegate", "_builders")

    def __init__(self, delegate: Callable[[memoryview, Header], Any]) -> None:
        self.delegate = delegate
        self._builders: dict[int, bytearray] = {}

    def __call__(self, buffer: memoryview, header: Header) -> Any:
        flags = header.flags & UNFRAGMENTED
        if flags == UNFRAGMENTED:
            return self.delegate(buffer, header)
        session_id = header.session_id
        if flags & BEGIN_FLAG:
            self._builders[session_id] = bytearray(buffer)
            return None
        builder = self._builders.get(session_id)
        if builder is None:
            return None
        builder += buffer
        if flags & END_FLAG:
            del self._builders[session_id]
            return self.delegate(memoryview(builder), header)
        return None

    def free_session(self, session_id: int) -> None:
        """Forget a partial message of a session that went away."""
        self._builders.pop(session_id, None)
