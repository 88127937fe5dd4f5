"""Reassembly of fragmented messages, per publishing session (Aeron's FragmentAssembler).

``FragmentAssembler(delegate)`` is a fragment handler (pass it to ``poll``) that calls
``delegate(buffer, header)`` once per whole message: unfragmented messages pass straight
through without a copy; fragments are gathered into a per-session buffer until the E flag,
and the delegate gets a memoryview of the whole message with the last fragment's header. A
fragment of a message whose beginning this subscriber never saw is dropped. ``free_session``
forgets the partial message of a session that went away. It runs in the native core, so a
fragment costs no Python call.
"""

from shmbus.shm._native import FragmentAssembler

__all__ = ["FragmentAssembler"]
