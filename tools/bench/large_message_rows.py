"""The rows of tools/bench/large_messages.py: each way of moving an array, its kind (in place
or copying), what it writes and reads (the page says it), and the targets between rows. Read by
the benchmark (its parent and its member processes) and by its page (large_messages_page.py).
"""

from __future__ import annotations

from dataclasses import dataclass

RING_SLOTS = 4  # the hand-written shared_memory ring: arrays in flight
ZMQ_SOURCES = 4  # zmq: source arrays in flight (each reused once its tracker is done)


@dataclass(frozen=True)
class Row:
    """One way of moving arrays: ``key`` on the command line, ``name`` in the tables, ``kind``
    "in place" or "copying", ``does`` what it writes and reads (present tense, for the page)."""

    key: str
    name: str
    kind: str
    does: str

    @property
    def shmbus(self) -> bool:
        return self.key.startswith("shmbus")


IN_PLACE, COPYING = "in place", "copying"
_RING_SLOT = f"{RING_SLOTS} preallocated `multiprocessing.shared_memory` slots"
_RING_HANDOVER = ("(once every reader has acked the array it held) and puts the sequence number "
                  "on a queue per reader; each reader sums a view of the slot, then acks it")
ROWS = (
    Row("shmbus-claim", "shmbus claim_array / arrays() views", IN_PLACE,
        "the writer claims room with `pub.claim_array((n,), np.uint64)` and fills it in place; "
        "each reader sums the read-only view `sub.arrays()` yields"),
    Row("shm-ring", "shared_memory ring, in place", IN_PLACE,
        f"the writer fills one of {_RING_SLOT} in place {_RING_HANDOVER}"),
    Row("iceoryx2-loan", "iceoryx2 loan, in place", IN_PLACE,
        "the writer loans a byte slice (`loan_slice_uninit`, back-pressure "
        "`RetryUntilDelivered`), fills it in place as a numpy array, sends it and notifies an "
        "event service; each reader waits on its listener, sums a view of the sample's payload "
        "and releases the sample"),
    Row("shmbus-publish", "shmbus publish_array / arrays() views", COPYING,
        "the writer fills its source array and calls `pub.publish_array(a)` (one copy into "
        "shared memory); each reader sums the read-only view `sub.arrays()` yields"),
    Row("shmbus-publish-copy", "shmbus publish_array / arrays(copy=True)", COPYING,
        "the writer fills its source array and calls `pub.publish_array(a)`; each reader takes "
        "a copy of its own with `sub.arrays(copy=True)` and sums it"),
    Row("zmq", "zmq send_array", COPYING,
        "pyzmq's `send_array` recipe: the writer fills one of "
        f"{ZMQ_SOURCES} source arrays (once its tracker says zmq is done with it), sends the "
        "dtype and shape as JSON then `send(a, copy=False, track=True)` on a PUB socket over "
        "ipc://; each reader's SUB socket does `recv(copy=False)`, `np.frombuffer`, and sums it"),
    Row("mp-queue", "mp.Queue put / get", COPYING,
        "the writer fills a new array (`put` pickles it later, in a thread) and puts it on a "
        "queue per reader (2 deep); each reader gets its unpickled copy and sums it"),
    Row("shm-ring-copy", "shared_memory ring, copied in", COPYING,
        f"the writer fills its source array, then copies it into one of {_RING_SLOT} "
        f"{_RING_HANDOVER}"),
)
BY_KEY = {row.key: row for row in ROWS}
#: the issue's targets at 64 MiB: (row, baseline row, at least this ratio of GB/s)
TARGETS = (("shmbus-claim", "shm-ring", 0.9), ("shmbus-publish", "zmq", 3.0))
