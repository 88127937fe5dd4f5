"""shmbus: a shared-memory message bus for Python processes, following Aeron's design.

Public API: publications and subscriptions over shared-memory log buffers, the result codes
of ``offer``, poll actions, idle strategies and errors, and the recorder and reader of
recordings. Everything not named here is private.
"""

from shmbus.archive.catalog import DiskFullError, RecordingError
from shmbus.archive.recorder import Recorder
from shmbus.archive.recording_reader import RecordingReader
from shmbus.channel_uri import ChannelUriError
from shmbus.client import Client, connect
from shmbus.codes import (
    ADMIN_ACTION,
    BACK_PRESSURED,
    CLOSED,
    MAX_POSITION_EXCEEDED,
    NOT_CONNECTED,
    Action,
    result_name,
)
from shmbus.context import Context
from shmbus.errors import (
    ClientClosedError,
    ClientTimeoutError,
    DriverTimeoutError,
    DriverUnavailableError,
    PublicationError,
    RegistrationError,
    ShmbusError,
)
from shmbus.fragment_assembler import FragmentAssembler
from shmbus.idle_strategy import (
    BackoffIdleStrategy,
    BusySpinIdleStrategy,
    NoOpIdleStrategy,
    SleepingIdleStrategy,
    YieldingIdleStrategy,
)
from shmbus.image import FragmentBatch, Image
from shmbus.publication import (
    BufferClaim,
    ConcurrentPublication,
    ExclusivePublication,
    Publication,
)
from shmbus.shm._native import AtomicBuffer, Header
from shmbus.shm.log_buffer import LogBuffer, LogBufferError
from shmbus.subscription import Subscription

__all__ = [
    "ADMIN_ACTION",
    "BACK_PRESSURED",
    "CLOSED",
    "MAX_POSITION_EXCEEDED",
    "NOT_CONNECTED",
    "Action",
    "AtomicBuffer",
    "BackoffIdleStrategy",
    "BufferClaim",
    "BusySpinIdleStrategy",
    "ChannelUriError",
    "Client",
    "ClientClosedError",
    "ClientTimeoutError",
    "Context",
    "DiskFullError",
    "DriverTimeoutError",
    "DriverUnavailableError",
    "ConcurrentPublication",
    "ExclusivePublication",
    "FragmentAssembler",
    "FragmentBatch",
    "Header",
    "Image",
    "LogBuffer",
    "LogBufferError",
    "NoOpIdleStrategy",
    "Publication",
    "PublicationError",
    "RecordingError",
    "RecordingReader",
    "Recorder",
    "RegistrationError",
    "ShmbusError",
    "SleepingIdleStrategy",
    "Subscription",
    "YieldingIdleStrategy",
    "connect",
    "result_name",
]
