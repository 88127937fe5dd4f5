"""Request/reply under the nemesis: responder processes and a caller, and the rule they keep.

The callers (``run_caller``) make calls one after another on ``CALL_STREAM`` (paced; after a
failed call, which a fault's window makes, a caller backs off for FAILED_PAUSE_S), one on
``aeron:ipc`` and one on a UDP channel through the netbridge (the service's endpoint and the
caller's response endpoint on loopback, so requests and replies cross the netbridge both
ways, under its loss filter and its kills), each request
``(seq u64, crc32(body) u32)`` then a body; every 7th asks the handler to raise, every 5th is
marked idempotent. The responders (``run_responder``, two per channel, a group per channel)
answer with the request's bytes reversed. Both rebuild their client on the errors that mean
the bus went away (as the writers and readers do, tools/nemesis/workers.py).

The rule (``call_breaches``): every call is settled exactly once, either answered with the
reply to that very request (checked byte for byte), or failed with a documented error:
RemoteError naming the ValueError (only for requests that asked for it), NoResponderError,
ResponderLostError, RequestTimeoutError, or an error that made the caller rebuild its client.
A wrong reply, a raising request answered as if it did not raise, or an undocumented
exception is a breach.
"""

from __future__ import annotations

import random
import struct
import time
import zlib
from collections import Counter
from typing import Any

import shmbus

CALL_STREAM = 3001
REQUEST = struct.Struct("<QI")
REBUILD = (shmbus.DriverTimeoutError, shmbus.ClientTimeoutError, shmbus.DriverUnavailableError,
           shmbus.ClientClosedError, shmbus.RegistrationError)
DOCUMENTED = (shmbus.NoResponderError, shmbus.ResponderLostError, shmbus.RequestTimeoutError)
CALL_TIMEOUT = 5.0
#: the pause after a call, paced (about 300 calls a second at most: the calls must not starve
#: the writers and readers of the two cores the nemesis runs on); after one that failed (no
#: responder, the bus rebuilt: a fault's window) a caller backs off as a real one would, so a
#: window of faults costs a few calls, not a hundred a second
ANSWERED_PAUSE_S, FAILED_PAUSE_S = 0.003, 0.1


def make_request(seq: int, rng: random.Random) -> bytes:
    body = (b"raise" if seq % 7 == 3 else b"") + rng.randbytes(rng.randrange(8, 3000))
    return REQUEST.pack(seq, zlib.crc32(body)) + body


def answer(request: bytes) -> bytes:
    """The handler: raises ValueError when asked to (after checking the request's CRC),
    else the request reversed."""
    seq, crc = REQUEST.unpack_from(request)
    body = request[REQUEST.size:]
    if zlib.crc32(body) != crc:
        raise RuntimeError(f"request {seq}: corrupt")
    if body.startswith(b"raise"):
        raise ValueError(f"request {seq} asked for it")
    if seq % 11 == 0:
        time.sleep(0.002)  # a request in hand for a while: a kill may land in it
    return request[::-1]


def run_responder(context: shmbus.Context, stop: Any, errors: Any,
                  channel: str = "aeron:ipc") -> None:
    while not stop.is_set():
        try:
            with shmbus.connect(context) as bus, \
                    bus.add_responder(channel, CALL_STREAM, answer) as responder:
                while not stop.is_set():
                    responder.serve(timeout=0.2)
        except REBUILD:
            time.sleep(0.2)
        except Exception as error:  # noqa: BLE001 - reported as a breach, not lost
            errors.put(f"responder: {error!r}")
            time.sleep(0.2)


def run_caller(context: shmbus.Context, seed: int, stop: Any, results: Any,
               errors: Any, channel: str = "aeron:ipc", name: str = "caller") -> None:
    """Call ``channel`` until ``stop``; then put (``name``, tally) on ``results``."""
    rng = random.Random(seed)
    tally: Counter[str] = Counter()
    seq = 0
    while not stop.is_set():
        try:
            with shmbus.connect(context) as bus, \
                    bus.add_requester(channel, CALL_STREAM) as client:
                while not stop.is_set():
                    request = make_request(seq, rng)
                    seq += 1
                    tally["calls"] += 1
                    began = time.monotonic()
                    outcome = _call(client, request, seq - 1)
                    tally[outcome] += 1
                    if outcome in ANSWERS:
                        tally[LATENCY_US] += int((time.monotonic() - began) * 1e6)
                    time.sleep(ANSWERED_PAUSE_S if outcome in ANSWERS else FAILED_PAUSE_S)
        except REBUILD as error:
            tally[f"rebuilt after {type(error).__name__}"] += 1
            tally["failed rebuild"] += tally["calls"] - _settled(tally)
            time.sleep(0.2)
        except Exception as error:  # noqa: BLE001 - reported as a breach, not lost
            errors.put(f"{name}: {error!r}")
            time.sleep(0.2)
    results.put((name, dict(tally)))


#: the outcomes that are the service's answer: its reply, or the error the request asked for
ANSWERS = ("answered", "failed RemoteError")
#: the tally's sum of the answered calls' durations (microseconds)
LATENCY_US = "answer time us"


def _call(client: shmbus.Requester, request: bytes, seq: int) -> str:
    """How one call ended: "answered", "failed <Error>", or "breach: ..."."""
    raising = request[REQUEST.size:].startswith(b"raise")
    try:
        reply = client.request(request, timeout=CALL_TIMEOUT, idempotent=seq % 5 == 0)
    except shmbus.RemoteError as error:
        if raising and error.remote.startswith("ValueError: request"):
            return "failed RemoteError"
        return f"breach: call {seq} failed with {error}"
    except DOCUMENTED as error:
        return f"failed {type(error).__name__}"
    if raising:
        return f"breach: call {seq} asked the handler to raise and was answered"
    if reply != request[::-1]:
        return f"breach: call {seq} got a reply to another request ({len(reply)} bytes)"
    return "answered"


def _settled(tally: Counter[str]) -> int:
    return sum(n for outcome, n in tally.items()
               if outcome == "answered" or outcome.startswith(("failed ", "breach: ")))


def call_breaches(tally: dict[str, int] | None, name: str = "caller") -> list[str]:
    """The rule over caller ``name``'s tally (None: it sent none)."""
    if tally is None:
        return [f"the {name} sent no tally"]
    found = [f"request/reply ({name}): {outcome} ({n}x)" for outcome, n in tally.items()
             if outcome.startswith("breach: ")]
    settled = _settled(Counter(tally))
    if settled != tally.get("calls", 0):
        found.append(f"request/reply ({name}): {tally.get('calls', 0)} calls, {settled} "
                     f"settled")
    if not tally.get("answered"):
        found.append(f"request/reply ({name}): no call was answered")
    return found


def summary_line(tally: dict[str, int] | None, name: str = "caller") -> str:
    """``request/reply (<name>): calls N, answered A (P%: R replies, E RemoteError as asked;
    mean M ms), failed F (<kind> n, ...), rebuilt after <error> n, ...`` (a failure that made
    the caller rebuild is ``rebuild``: the calls it had open when its client failed)."""
    if tally is None:
        return f"request/reply ({name}): no tally"
    counts = Counter(tally)
    calls = counts["calls"]
    replies, raised = counts["answered"], counts["failed RemoteError"]
    answered = replies + raised
    failures = {outcome.removeprefix("failed "): n for outcome, n in sorted(counts.items())
                if outcome.startswith("failed ") and outcome != "failed RemoteError" and n}
    failed = sum(failures.values())
    mean_ms = counts[LATENCY_US] / answered / 1000 if answered else 0.0
    share = 100 * answered / calls if calls else 0.0
    line = (f"request/reply ({name}): calls {calls}, answered {answered} ({share:.0f}%: "
            f"{replies} replies, {raised} RemoteError as asked; mean {mean_ms:.1f} ms), "
            f"failed {failed} (" + ", ".join(f"{k} {n}" for k, n in failures.items()) + ")")
    rebuilt = [f"{outcome} {n}" for outcome, n in sorted(counts.items())
               if outcome.startswith("rebuilt after ")]
    breaches = [f"{outcome} {n}" for outcome, n in sorted(counts.items())
                if outcome.startswith("breach: ")]
    return ", ".join([line, *rebuilt, *breaches])

