/*
 * The request/reply call path's hot loop (shmbus/calls/requester.py, shmbus/calls/responder.py): the
 * 16-byte call header (shmbus/shm/call_header.py, docs/protocol.md) packed and parsed here, so
 * a call costs no struct.pack/unpack and no Python call per fragment.
 *
 *   offer_call      a request or reply offered with its header (PublicationCore's append);
 *   await_reply     a lone caller's wait for the reply to its correlation id: take replies,
 *                   spin, then sleep (wait_images: Context.wait_spin, then the futex);
 *   answer_request  a responder's claim of one request (group_member.c), the handler's call
 *                   and the reply's offer; the message is done once the reply is offered;
 *   answer_requests answer_request in a loop while it replies (one call from Python a poll).
 *
 * Runs in client processes with the GIL held (handlers are Python callables); waits release it.
 * A fragmented request is put together natively (group_next_message). Anything off the
 * common path (a large message, a request handed on from a responder that left, a handler
 * that raised, a reply not accepted at once) goes back to the Python side.
 */
#include "types.h"

#include <sched.h>

#define CALL_HEADER_LENGTH 16
#define CALL_VERSION 1
#define CALL_REQUEST 1
#define CALL_REPLY 2
#define CALL_IDEMPOTENT 0x01
#define CALL_REPLY_TO 0x02    /* a request over UDP (shmbus/calls/remote_calls.py) */

/* What answer_request did (shmbus/calls/responder.py names them). */
#define ANSWER_NOTHING 0   /* nothing to claim */
#define ANSWER_REPLIED 1   /* answered: the reply was offered */
#define ANSWER_DELIVER 2   /* the next message is for poll(handler, 1) (see group_next_message) */
#define ANSWER_MALFORMED 3 /* not a request of this version: dropped (done) */
#define ANSWER_SETTLED 4   /* answered through the responder's Python side (error, slow reply) */

static void pack_header(uint8_t *head, int kind, int flags, int32_t stream_id,
                        int64_t correlation_id)
{
    head[0] = (uint8_t)kind;
    head[1] = (uint8_t)flags;
    uint16_t version = CALL_VERSION;
    memcpy(head + 2, &version, 2);
    wr_i32(head + 4, stream_id);
    wr_i64(head + 8, correlation_id);
}

/* The header's fields; 0 when `message` is too short, of another version, or has a flag
 * version 1 does not know (malformed: call_header.decode names it). */
static int parse_header(const uint8_t *message, Py_ssize_t length, int *kind, int *flags,
                        int32_t *stream_id, int64_t *correlation_id)
{
    if (length < CALL_HEADER_LENGTH || rd_u16(message + 2) != CALL_VERSION ||
        (message[1] & ~(CALL_IDEMPOTENT | CALL_REPLY_TO)))
        return 0;
    *kind = message[0];
    *flags = message[1];
    *stream_id = rd_i32(message + 4);
    *correlation_id = rd_i64(message + 8);
    return 1;
}

/* 0 when a function got `expected` arguments, else -1 with a TypeError showing `usage`. */
static int check_nargs(Py_ssize_t nargs, Py_ssize_t expected, const char *usage)
{
    if (nargs == expected)
        return 0;
    PyErr_SetString(PyExc_TypeError, usage);
    return -1;
}

/* offer_call(publication, kind, flags, stream_id, correlation_id, body) -> int */
static PyObject *call_offer(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs(nargs, 6,
                    "offer_call(publication, kind, flags, stream_id, correlation_id, body)") < 0)
        return NULL;
    long kind = PyLong_AsLong(args[1]);
    long flags = PyLong_AsLong(args[2]);
    long stream_id = PyLong_AsLong(args[3]);
    long long correlation_id = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return NULL;
    if (kind < 0 || kind > 255 || flags < 0 || flags > 255 || stream_id < INT32_MIN ||
        stream_id > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "call header field out of range: kind %ld, flags %ld, "
                     "stream id %ld", kind, flags, stream_id);
        return NULL;
    }
    uint8_t head[CALL_HEADER_LENGTH];
    pack_header(head, (int)kind, (int)flags, (int32_t)stream_id, correlation_id);
    int64_t result = offer_headed(args[0], head, CALL_HEADER_LENGTH, args[5]);
    return result == INT64_MIN ? NULL : PyLong_FromLongLong(result);
}

/* await_reply(replies, correlation_id, timeout_s, on_other) -> bytes | None: the body of the
 * REPLY to correlation_id when it comes within timeout_s. Any other message read meanwhile
 * goes to on_other(message) and the call returns None at once (it may have settled the
 * caller's call: an error reply, say); None too when timeout_s passed or the subscription's
 * watched word moved (see _watch_word: the requester's publication lost its responders).
 * Raises what the subscription's reads raise (the client failed). With a spinning wait
 * (wait_spin > 0) it yields the CPU once before it spins. */
static PyObject *call_await_reply(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyObject_TypeCheck(args[0], &SubscriptionCoreType)) {
        PyErr_SetString(PyExc_TypeError,
                        "await_reply(replies: Subscription, correlation_id, timeout_s, on_other)");
        return NULL;
    }
    SubscriptionCore *sub = (SubscriptionCore *)args[0];
    long long correlation_id = PyLong_AsLongLong(args[1]);
    double timeout = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred())
        return NULL;
    PyObject *on_other = args[3];
    int64_t deadline = monotonic_ns() + (timeout > 0 ? timeout_to_ns(timeout) : 0);
    if (timeout > 1e9)
        deadline = INT64_MAX;
    int yielded = 0;
    for (;;) {
        int32_t seen = sub->wake != NULL ? LOAD_ACQUIRE(sub->wake) : 0;
        PyObject *message = sub_take(sub);
        if (message != NULL && PyBytes_Check(message)) {
            const uint8_t *bytes = (const uint8_t *)PyBytes_AS_STRING(message);
            Py_ssize_t length = PyBytes_GET_SIZE(message);
            int kind, flags;
            int32_t stream_id;
            int64_t id;
            if (parse_header(bytes, length, &kind, &flags, &stream_id, &id) &&
                kind == CALL_REPLY && id == correlation_id) {
                PyObject *body = PyBytes_FromStringAndSize((const char *)bytes +
                                                           CALL_HEADER_LENGTH,
                                                           length - CALL_HEADER_LENGTH);
                Py_DECREF(message);
                return body;
            }
        }
        if (message != NULL) {
            PyObject *r = PyObject_CallOneArg(on_other, message);
            Py_DECREF(message);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
            Py_RETURN_NONE;
        }
        if (PyErr_Occurred())
            return NULL;
        int64_t now = monotonic_ns();
        if (now >= deadline || sub->closed)
            Py_RETURN_NONE;
        /* a spinning wait gives the CPU up once before it spins: a responder on this very
         * CPU answers now rather than after the spin's first look (which makes no system
         * call); on a CPU of its own, the responder needs longer than the yield anyway */
        if (!yielded && sub->wait_spin_ns > 0) {
            yielded = 1;
            Py_BEGIN_ALLOW_THREADS
            sched_yield();
            Py_END_ALLOW_THREADS
            continue;
        }
        PyObject *images = Py_NewRef(sub->images);
        int ready = wait_images_watching(images, sub->wake, seen, sub,
                                         deadline == INT64_MAX ? -1 : deadline - now,
                                         sub->wait_spin_ns);
        Py_DECREF(images);
        if (ready < 0)
            return NULL;
        if (ready == 2)  /* the watched word moved (the responders left): the caller looks */
            Py_RETURN_NONE;
    }
}

/* The handler raised (the exception is set): its error reply goes through
 * responder._reply_error(stream_id, correlation_id, error). A BaseException that is not an
 * Exception (KeyboardInterrupt, SystemExit) propagates instead, as from poll(). 0, or -1 with
 * an exception set. */
static int reply_error(PyObject *responder, int32_t stream_id, int64_t correlation_id)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL)
        PyException_SetTraceback(value, traceback);
    PyObject *r = PyObject_CallMethod(responder, "_reply_error", "iLO", (int)stream_id,
                                      (long long)correlation_id, value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* answer_request's work on the request group_next_message found (payload, length; next: the
 * position past it). */
static PyObject *answer_message(PyObject *member, PyObject *handler, PyObject *replies,
                                PyObject *responder, const uint8_t *payload, int32_t length,
                                int64_t next, int handed_on)
{
    int kind, flags;
    int32_t stream_id;
    int64_t correlation_id;
    if (!parse_header(payload, length, &kind, &flags, &stream_id, &correlation_id) ||
        kind != CALL_REQUEST) {
        group_message_done(member, next);
        return PyLong_FromLong(ANSWER_MALFORMED);
    }
    /* the Python side answers "lost", and handles (or drops) a request naming a reply-to */
    if ((handed_on && !(flags & CALL_IDEMPOTENT)) || (flags & CALL_REPLY_TO))
        return PyLong_FromLong(ANSWER_DELIVER);
    /* copied out before the handler runs: the handler may close the responder (and with it
     * the log's mapping) */
    PyObject *request = PyBytes_FromStringAndSize((const char *)payload + CALL_HEADER_LENGTH,
                                                  length - CALL_HEADER_LENGTH);
    if (request == NULL)
        return NULL;
    PyObject *reply = PyObject_CallOneArg(handler, request);
    Py_DECREF(request);
    if (reply != NULL && !PyObject_CheckBuffer(reply)) {
        /* a reply is anything with the buffer protocol: memoryview() names what it is not */
        PyObject *view = PyMemoryView_FromObject(reply);
        Py_XDECREF(view);
        Py_CLEAR(reply);
    }
    if (reply == NULL) {
        int r = reply_error(responder, stream_id, correlation_id);
        group_message_done(member, next);
        return r < 0 ? NULL : PyLong_FromLong(ANSWER_SETTLED);
    }
    int outcome = ANSWER_SETTLED;
    PyObject *key = PyLong_FromLong(stream_id);
    PyObject *publication = key == NULL ? NULL : PyDict_GetItemWithError(replies, key);
    Py_XDECREF(key);
    if (publication == NULL && PyErr_Occurred()) {
        Py_DECREF(reply);
        group_message_done(member, next);
        return NULL;
    }
    if (publication != NULL) {
        uint8_t head[CALL_HEADER_LENGTH];
        pack_header(head, CALL_REPLY, 0, 0, correlation_id);
        Py_INCREF(publication);
        int64_t result = offer_headed(publication, head, CALL_HEADER_LENGTH, reply);
        Py_DECREF(publication);
        if (result == INT64_MIN) {
            Py_DECREF(reply);
            group_message_done(member, next);
            return NULL;
        }
        if (result > 0)
            outcome = ANSWER_REPLIED;
    }
    if (outcome != ANSWER_REPLIED) {
        PyObject *r = PyObject_CallMethod(responder, "_reply", "iiLO", (int)stream_id,
                                          CALL_REPLY, (long long)correlation_id, reply);
        if (r == NULL) {
            Py_DECREF(reply);
            group_message_done(member, next);
            return NULL;
        }
        Py_DECREF(r);
    }
    Py_DECREF(reply);
    group_message_done(member, next);
    return PyLong_FromLong(outcome);
}

/* answer_request(member, handler, replies, responder) -> int: claim the next request of the
 * group member, call handler(request: bytes) and offer its reply on replies[stream_id] (the
 * requester's response publication), then mark the request done. Returns ANSWER_*. The reply
 * goes through responder._reply(stream_id, kind, correlation_id, body) when the publication is
 * not in `replies` yet or the offer is refused; a handler's exception through
 * responder._reply_error. */
static PyObject *call_answer_request(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 || !PyObject_TypeCheck(args[0], &GroupMemberCoreType) ||
        !PyDict_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError,
                        "answer_request(member: GroupMemberCore, handler, replies: dict, "
                        "responder)");
        return NULL;
    }
    const uint8_t *payload;
    int32_t length;
    int64_t next;
    int handed_on = 0;
    PyObject *assembled;
    int got = group_next_message(args[0], &payload, &length, &next, &handed_on, &assembled);
    if (got < 0)
        return NULL;
    if (got == 0)
        return PyLong_FromLong(ANSWER_NOTHING);
    if (got == 2)
        return PyLong_FromLong(ANSWER_DELIVER);
    PyObject *answer = answer_message(args[0], args[1], args[2], args[3], payload, length,
                                      next, handed_on);
    Py_XDECREF(assembled);
    return answer;
}

/* answer_requests(member, handler, replies, responder, limit) -> (replied, outcome):
 * answer_request over and over while it replies, at most `limit` times, so a responder's poll
 * costs one call from Python for a burst of requests (and for one request and the empty look
 * after it). `replied` counts the ANSWER_REPLIED outcomes; `outcome` is the last one:
 * ANSWER_REPLIED when `limit` replies were made, else the outcome that stopped the loop, for
 * the caller to handle (ANSWER_NOTHING: drained). */
static PyObject *call_answer_requests(PyObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_nargs(nargs, 5,
                    "answer_requests(member, handler, replies: dict, responder, limit)") < 0)
        return NULL;
    long limit = PyLong_AsLong(args[4]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    long replied = 0, outcome = ANSWER_REPLIED;
    while (replied < limit) {
        PyObject *r = call_answer_request(m, args, 4);
        if (r == NULL)
            return NULL;
        outcome = PyLong_AsLong(r);
        Py_DECREF(r);
        if (outcome != ANSWER_REPLIED)
            break;
        replied++;
    }
    PyObject *count = PyLong_FromLong(replied), *last = PyLong_FromLong(outcome);
    PyObject *pair = count != NULL && last != NULL ? PyTuple_Pack(2, count, last) : NULL;
    Py_XDECREF(count);
    Py_XDECREF(last);
    return pair;
}

PyMethodDef call_functions[] = {
    {"offer_call", (PyCFunction)(void (*)(void))call_offer, METH_FASTCALL,
     "offer_call(publication, kind, flags, stream_id, correlation_id, body) -> int: offer "
     "body behind a call header (the offer's result)"},
    {"await_reply", (PyCFunction)(void (*)(void))call_await_reply, METH_FASTCALL,
     "await_reply(replies, correlation_id, timeout_s, on_other) -> bytes | None: the reply "
     "body to correlation_id, or None (timed out, or another message went to on_other)"},
    {"answer_request", (PyCFunction)(void (*)(void))call_answer_request, METH_FASTCALL,
     "answer_request(member, handler, replies, responder) -> int: answer one request of a "
     "group member (0 none, 1 replied, 2 deliver with poll, 3 malformed, 4 answered by the "
     "responder's Python side)"},
    {"answer_requests", (PyCFunction)(void (*)(void))call_answer_requests, METH_FASTCALL,
     "answer_requests(member, handler, replies, responder, limit) -> (replied, outcome): "
     "answer_request while it replies, at most limit times; outcome is the last one"},
    {NULL, NULL, 0, NULL},
};
