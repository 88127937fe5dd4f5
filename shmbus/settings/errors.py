"""The exceptions shmbus raises. All derive from ShmbusError."""

from __future__ import annotations

from shmbus.settings.codes import result_name


class ShmbusError(Exception):
    """Base class of shmbus errors."""


class PublicationError(ShmbusError):
    """An offer or claim could not be made; ``code`` is the negative result (see
    shmbus.settings.codes)."""

    def __init__(self, code: int, message: str | None = None) -> None:
        self.code = code
        super().__init__(message or f"publication refused: {result_name(code)}")


class DriverUnavailableError(ShmbusError):
    """No live driver in the bus directory, and none could be started."""


class DriverTimeoutError(ShmbusError):
    """The driver stopped heartbeating (or answering) within the driver timeout."""


class ClientTimeoutError(ShmbusError):
    """The driver declared this client dead (its heartbeat stopped); connect again."""


class ClientClosedError(ShmbusError):
    """The client was closed (or failed) and can no longer be used."""


class RegistrationError(ShmbusError):
    """The driver refused a command; ``code`` is Aeron's error code, the message says why."""

    def __init__(self, code: int, message: str) -> None:
        self.code = code
        super().__init__(message)


class RequestError(ShmbusError):
    """A request/reply call failed; the subclass says how."""


class NoResponderError(RequestError):
    """No responder serves the service: the call was not sent."""


class ResponderLostError(RequestError):
    """The responder(s) left (died, closed, or were timed out) before answering the call."""


class RequestTimeoutError(RequestError):
    """No reply came before the call's deadline (a later reply is dropped)."""


class RemoteError(RequestError):
    """The responder's handler raised: ``remote`` is ``"ExceptionType: message"``."""

    def __init__(self, remote: str, service: str) -> None:
        self.remote = remote
        super().__init__(f"the responder of {service} raised {remote}")


class UntrustedSourceError(ShmbusError):
    """A message was refused before any of its bytes were decoded, because decoding it would
    run code its sender chose and the sender may be any host: ``objects()`` on an aeron:udp
    channel without ``key=`` (see shmbus/codecs/source_trust.py). ``channel`` is the subscription's,
    ``source`` the image's source identity ("host:port", "ipc"); the message names the key and
    the keyword argument that let it through."""

    def __init__(self, channel: str, source: str, option: str) -> None:
        self.channel = channel
        self.source = source
        self.option = option
        super().__init__(
            f"refused to unpickle a message from {source} on {channel!r}: an aeron:udp channel "
            f"without key= takes datagrams from any host that can reach its endpoint, and "
            f"unpickling runs code of the sender's choosing. Seal the channel with a key "
            f"(add |key=<name> to the channel on both sides; see 'shmbus keygen'), or pass "
            f"{option}=True to objects() if every host that can reach it is trusted")
