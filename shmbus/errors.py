"""The exceptions shmbus raises. All derive from ShmbusError."""

from __future__ import annotations

from shmbus.codes import result_name


class ShmbusError(Exception):
    """Base class of shmbus errors."""


class PublicationError(ShmbusError):
    """An offer or claim could not be made; ``code`` is the negative result (see shmbus.codes)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        super().__init__(message or f"publication refused: {result_name(code)}")
