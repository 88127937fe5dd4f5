"""What a ``with`` block does with the bus's handles: a handle is closed on leaving it, a claim
is committed on a normal exit and aborted on an exception.

Mixins with no state of their own (``__slots__ = ()``), so slotted and native-backed classes
take them too; ``__enter__`` is typed to return the concrete class.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Self

from shmbus.settings.errors import PublicationError


class Closeable:
    """A handle whose ``with`` block ends in :meth:`close`: ``__enter__`` returns the handle,
    ``__exit__`` closes it whether or not the block raised (the exception propagates)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the class it is mixed into defines
        def close(self) -> None:
            """Release what the handle holds (idempotent)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ClaimScope:
    """A claim whose ``with`` block ends in :meth:`commit` on a normal exit and in
    :meth:`abort` on an exception, unless the block already did one of them.

    Entering a failed claim (``result <= 0``) raises :class:`PublicationError` with its code.
    """

    __slots__ = ()

    #: the new stream position (> 0) once committed, or the failure code
    result: int

    if TYPE_CHECKING:  # what the class it is mixed into defines
        def commit(self) -> None:
            """Publish what was claimed."""

        def abort(self) -> None:
            """Give the claim up."""

        def _is_open(self) -> bool:
            """Whether the claim still waits for :meth:`commit` or :meth:`abort`."""

    def __enter__(self) -> Self:
        if self.result <= 0:
            raise PublicationError(self.result)
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._is_open():
            return
        if exc_type is None:
            self.commit()
        else:
            self.abort()
