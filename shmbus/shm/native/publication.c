/*
 * PublicationCore: the Python type behind ExclusivePublication and ConcurrentPublication (one
 * writer, or many threads and processes), over the term appender (term_appender.c): offer,
 * gather, offer_many, claim/commit/abort on its log, closing and detaching, and the sleep of a
 * writer held at its limit (_await_progress). A message past the log's max message length goes
 * up to Python (Publication._offer_large), and so does a publish() the log refused
 * (Publication._publish_refused).
 *
 * Runs in client processes, on whichever thread offers, with the GIL held; _await_progress
 * releases it while asleep.
 */
#include "types.h"
#include "term_appender.h"

#include <sched.h>

typedef struct {
    PyObject_HEAD
    PyObject *log_buffer;     /* AtomicBuffer over the whole log file */
    PyObject *limit_buffer;   /* AtomicBuffer holding the publication-limit position */
    PyObject *counters_buffer;/* AtomicBuffer of counter values (None: never self-raise) */
    TermAppender a;           /* over the memory of those buffers */
    int sleeping;             /* threads of this process asleep in _await_progress */
    uint32_t generation;      /* bumped whenever the sleepers are let go (close, detach, init) */
    int closed;
    int64_t refusal;          /* what offers return once closed: CLOSED, or NOT_CONNECTED when
                               * detached from a lost driver (see _detach_core) */
    int64_t wait_spin_ns;     /* `_wait_spin_ns`: how long _await_progress looks before it sleeps */
} PublicationCore;

/* Appends one message (at most max_message bytes): the new position or a negative code, the
 * refusal once the core is closed or detached. */
static int64_t append_pieces(PublicationCore *self, const Piece *pieces, Py_ssize_t length,
                             int64_t reserved_value)
{
    if (self->closed)
        return self->refusal;
    return appender_append(&self->a, pieces, length, reserved_value);
}

/* A message longer than max_message does not go into the log: Publication._offer_large puts
 * it in a shared-memory block and offers a reference frame (shmbus/streams/large_messages.py). Only
 * such a message pays the Python call; the log's own path is unchanged. `publish_timeout` is
 * NULL for offer(), the timeout (or None) for publish(). */
static PyObject *offer_large(PublicationCore *self, PyObject *const *args, Py_ssize_t nargs,
                             int64_t reserved, PyObject *publish_timeout)
{
    PyObject *buffers = PyTuple_New(nargs);
    if (buffers == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(buffers, i, Py_NewRef(args[i]));
    return PyObject_CallMethod((PyObject *)self, "_offer_large", "NLOO", buffers,
                               (long long)reserved, publish_timeout != NULL ? Py_True : Py_False,
                               publish_timeout != NULL ? publish_timeout : Py_None);
}

static int get_message_buffer(PyObject *obj, Py_buffer *view)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "a message must support the buffer protocol (bytes, bytearray, "
                         "memoryview, numpy array), not %.100s", Py_TYPE(obj)->tp_name);
        }
        return -1;
    }
    return 0;
}

static int parse_reserved(PyObject *kwnames, PyObject *const *args, Py_ssize_t nargs,
                          int64_t *reserved)
{
    *reserved = 0;
    if (kwnames == NULL)
        return 0;
    Py_ssize_t nk = PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "reserved_value") != 0) {
            PyErr_Format(PyExc_TypeError,
                         "offer() got an unexpected keyword argument '%U' "
                         "(it takes reserved_value)", name);
            return -1;
        }
        long long v = PyLong_AsLongLong(args[nargs + i]);
        if (v == -1 && PyErr_Occurred())
            return -1;
        *reserved = v;
    }
    return 0;
}

#define MAX_GATHER 16

/* One message made of the buffers, concatenated: the new position or a negative code, as an
 * int; NULL with the exception set for a bad buffer or length. */
static PyObject *offer_buffers(PublicationCore *self, PyObject *const *args, Py_ssize_t nargs,
                               int64_t reserved, PyObject *publish_timeout)
{
    if (nargs == 1) {
        Py_buffer view;
        if (get_message_buffer(args[0], &view) < 0)
            return NULL;
        if (view.len > self->a.max_message) {
            PyBuffer_Release(&view);
            return offer_large(self, args, nargs, reserved, publish_timeout);
        }
        Piece piece = {(const uint8_t *)view.buf, view.len};
        int64_t result = append_pieces(self, &piece, view.len, reserved);
        PyBuffer_Release(&view);
        return PyLong_FromLongLong(result);
    }
    if (nargs < 1 || nargs > MAX_GATHER) {
        PyErr_Format(PyExc_TypeError, "offer takes 1 to %d buffers, got %zd", MAX_GATHER, nargs);
        return NULL;
    }
    Py_buffer views[MAX_GATHER];
    Piece pieces[MAX_GATHER];
    Py_ssize_t total = 0, got = 0;
    PyObject *result = NULL;
    for (; got < nargs; got++) {
        if (get_message_buffer(args[got], &views[got]) < 0)
            goto done;
        pieces[got].ptr = views[got].buf;
        pieces[got].len = views[got].len;
        total += views[got].len;
    }
    if (total > self->a.max_message)
        result = offer_large(self, args, nargs, reserved, publish_timeout);
    else
        result = PyLong_FromLongLong(append_pieces(self, pieces, total, reserved));
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    return result;
}

/* offer(head, body) for the request/reply path (calls.c), with `head` raw bytes: the
 * new position or a negative code; INT64_MIN with an exception set for a bad body or
 * publication. A message past max_message takes the large path, as offer() does. */
int64_t offer_headed(PyObject *publication, const uint8_t *head, Py_ssize_t head_length,
                     PyObject *body)
{
    if (!PyObject_TypeCheck(publication, &PublicationCoreType)) {
        PyErr_Format(PyExc_TypeError, "a call is offered on a Publication, not %.100s",
                     Py_TYPE(publication)->tp_name);
        return INT64_MIN;
    }
    PublicationCore *self = (PublicationCore *)publication;
    Py_buffer view;
    if (get_message_buffer(body, &view) < 0)
        return INT64_MIN;
    int64_t result;
    if (head_length + view.len <= self->a.max_message) {
        Piece pieces[2] = {{head, head_length}, {(const uint8_t *)view.buf, view.len}};
        result = append_pieces(self, pieces, head_length + view.len, 0);
    } else {
        PyObject *args[2] = {PyBytes_FromStringAndSize((const char *)head, head_length), body};
        PyObject *r = args[0] == NULL ? NULL : offer_large(self, args, 2, 0, NULL);
        Py_XDECREF(args[0]);
        result = r == NULL ? INT64_MIN : PyLong_AsLongLong(r);
        Py_XDECREF(r);
        if (result == -1 && PyErr_Occurred())
            result = INT64_MIN;
    }
    PyBuffer_Release(&view);
    return result;
}

/* offer(*buffers, reserved_value=0) -> int */
static PyObject *pub_offer(PublicationCore *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    int64_t reserved;
    if (parse_reserved(kwnames, args, nargs, &reserved) < 0)
        return NULL;
    return offer_buffers(self, args, nargs, reserved, NULL);
}

/* The default timeout of publish(), seconds: a float made once, on first use (NULL on failure,
 * the exception set). */
static PyObject *default_publish_timeout(void)
{
    static PyObject *seconds = NULL;
    if (seconds == NULL)
        seconds = PyFloat_FromDouble(1.0);
    return seconds;
}

/* publish(*buffers, timeout=1.0, reserved_value=0) -> int: one offer here; only a refused one
 * goes on in Python (Publication._publish_refused: the deadline, the retries and the sleeps),
 * so a publish accepted at once costs what an offer does. */
static PyObject *pub_publish(PublicationCore *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    PyObject *timeout = NULL, *reserved_obj = NULL;
    Py_ssize_t nk = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t i = 0; i < nk; i++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, i);
        if (PyUnicode_CompareWithASCIIString(name, "timeout") == 0) {
            timeout = args[nargs + i];
        } else if (PyUnicode_CompareWithASCIIString(name, "reserved_value") == 0) {
            reserved_obj = args[nargs + i];
        } else {
            PyErr_Format(PyExc_TypeError, "publish() got an unexpected keyword argument '%U' "
                         "(it takes timeout and reserved_value)", name);
            return NULL;
        }
    }
    int64_t reserved = 0;
    if (reserved_obj != NULL) {
        reserved = PyLong_AsLongLong(reserved_obj);
        if (reserved == -1 && PyErr_Occurred())
            return NULL;
    }
    if (timeout == NULL && (timeout = default_publish_timeout()) == NULL)
        return NULL;
    PyObject *result = offer_buffers(self, args, nargs, reserved, timeout);
    if (result == NULL || PyLong_AsLongLong(result) > 0)
        return result;
    PyObject *buffers = PyTuple_New(nargs);
    if (buffers == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(buffers, i, Py_NewRef(args[i]));
    PyObject *retry = PyObject_CallMethod(
        (PyObject *)self, "_publish_refused", "NNOL", buffers, result, timeout,
        (long long)reserved);
    return retry;
}

/* Appends messages [0, count) of a batch (see appender_append_batch); the refusal once the
 * core is closed or detached. */
static int64_t append_batch(PublicationCore *self, Py_ssize_t count, piece_getter get,
                            void *ctx)
{
    if (self->closed)
        return self->refusal;
    return appender_append_batch(&self->a, count, get, ctx);
}

typedef struct {
    PyObject *const *items;
    Py_buffer *views;
} SeqCtx;

static int seq_get(void *ctx, Py_ssize_t i, Piece *out)
{
    SeqCtx *c = ctx;
    out->ptr = c->views[i].buf;
    out->len = c->views[i].len;
    return 0;
}

typedef struct {
    const uint8_t *base;
    Py_ssize_t record_length;
} BlockCtx;

static int block_get(void *ctx, Py_ssize_t i, Piece *out)
{
    BlockCtx *c = ctx;
    out->ptr = c->base + i * c->record_length;
    out->len = c->record_length;
    return 0;
}

/* A message longer than max_message at the front of a batch is offered alone, on the
 * large-message path: 1 when it was appended, else the code. (One further along ends the batch
 * before it, so the stream keeps the batch's order.) */
static PyObject *offer_many_large(PublicationCore *self, PyObject *message)
{
    PyObject *r = offer_large(self, &message, 1, 0, NULL);
    if (r == NULL)
        return NULL;
    long long position = PyLong_AsLongLong(r);
    Py_DECREF(r);
    if (position == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLongLong(position > 0 ? 1 : position);
}

/* offer_many(messages) -> int: see the Python docstring of Publication.offer_many. */
static PyObject *pub_offer_many(PublicationCore *self, PyObject *messages)
{
    Py_buffer block;
    if (PyObject_CheckBuffer(messages)) {
        if (PyObject_GetBuffer(messages, &block, PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        Py_ssize_t count, record_length;
        if (block.ndim >= 2) {
            count = block.shape[0];
            record_length = count ? block.len / count : 0;
        } else if (block.ndim == 1 && block.itemsize > 1) {
            count = block.shape[0];
            record_length = block.itemsize;
        } else {
            PyBuffer_Release(&block);
            PyErr_SetString(PyExc_TypeError,
                            "offer_many takes a sequence of messages, a 2-D array (one message "
                            "per row) or a 1-D array of records; use offer() for one message");
            return NULL;
        }
        if (count > 0 && record_length > self->a.max_message) {
            PyObject *row = PyMemoryView_FromMemory((char *)block.buf, record_length, PyBUF_READ);
            PyObject *r = row == NULL ? NULL : offer_many_large(self, row);
            Py_XDECREF(row);
            PyBuffer_Release(&block);
            return r;
        }
        int64_t r = 0;
        if (count > 0) {
            BlockCtx ctx = {(const uint8_t *)block.buf, record_length};
            r = append_batch(self, count, block_get, &ctx);
        }
        PyBuffer_Release(&block);
        return PyLong_FromLongLong(r);
    }
    PyObject *seq = PySequence_Fast(messages, "offer_many takes a sequence of messages");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    /* bound the work per call so a huge list does not pin buffers for long */
    if (count > 4096)
        count = 4096;
    Py_buffer *views = PyMem_Malloc(sizeof(Py_buffer) * (count ? count : 1));
    if (views == NULL) { Py_DECREF(seq); return PyErr_NoMemory(); }
    PyObject *const *items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t got = 0;
    PyObject *result = NULL;
    for (; got < count; got++) {
        if (get_message_buffer(items[got], &views[got]) < 0)
            goto done;
        if (views[got].len > self->a.max_message) {
            PyBuffer_Release(&views[got]);
            if (got == 0) {
                result = offer_many_large(self, items[0]);
                goto done;
            }
            count = got;
            break;
        }
    }
    {
        int64_t r = 0;
        if (count > 0) {
            SeqCtx ctx = {items, views};
            r = append_batch(self, count, seq_get, &ctx);
        }
        result = PyLong_FromLongLong(r);
    }
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return result;
}

/* _claim(length, reserved_value) -> (result, frame_offset): frame_offset is into the log. */
static PyObject *pub_claim(PublicationCore *self, PyObject *args)
{
    Py_ssize_t length; long long reserved = 0;
    if (!PyArg_ParseTuple(args, "n|L", &length, &reserved))
        return NULL;
    if (length < 0 || length > self->a.max_payload) {
        PyErr_Format(PyExc_ValueError,
                     "claim length %zd is outside 0..%d (the max payload, mtu - 32)", length,
                     self->a.max_payload);
        return NULL;
    }
    if (self->closed)
        return Py_BuildValue("(Ln)", (long long)self->refusal, (Py_ssize_t)-1);
    Py_ssize_t frame_offset = -1;
    int64_t result = appender_claim(&self->a, (int32_t)length, reserved, &frame_offset);
    return Py_BuildValue("(Ln)", (long long)result, result < 0 ? (Py_ssize_t)-1 : frame_offset);
}

#define PADDED_CLAIM "the claim was padded over by the driver: it was held open past " \
    "publication_unblock_timeout (this writer descheduled that long); nothing was published"

/* The claimed frame at the log offset `arg`, and its (negative) length in *length; NULL with
 * ValueError when it is not an open claim. A frame the unblocker is padding now (its length
 * INT32_MIN) is one for `aborting`, none to commit. */
static uint8_t *claimed_frame(PublicationCore *self, PyObject *arg, int32_t *length,
                              int aborting)
{
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "the publication is closed (its claims were aborted)");
        return NULL;
    }
    Py_ssize_t frame_offset = PyLong_AsSsize_t(arg);
    if (frame_offset == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t log_terms = (Py_ssize_t)self->a.g.term_length * PARTITION_COUNT;
    if (frame_offset < 0 || frame_offset > log_terms - HEADER_LENGTH ||
        frame_offset % FRAME_ALIGNMENT != 0) {
        PyErr_Format(PyExc_ValueError, "%zd is not a frame offset in this log", frame_offset);
        return NULL;
    }
    uint8_t *frame = self->a.g.terms + frame_offset;
    *length = LOAD_ACQUIRE((int32_t *)frame);
    if (*length == INT32_MIN && !aborting) {  /* the unblocker's mark: it pads it now */
        PyErr_SetString(PyExc_ValueError, PADDED_CLAIM);
        return NULL;
    }
    if (*length >= 0) {
        uint16_t type;
        memcpy(&type, frame + TYPE_OFFSET, 2);
        PyErr_SetString(PyExc_ValueError,
                        type == HDR_TYPE_PAD && *length > 0
                            ? "the claim was already aborted, or padded over by the driver: it "
                              "was held open past publication_unblock_timeout"
                            : "the claim was already committed or aborted");
        return NULL;
    }
    return frame;
}

static PyObject *pub_commit(PublicationCore *self, PyObject *arg)
{
    int32_t length;
    uint8_t *frame = claimed_frame(self, arg, &length, 0);
    if (frame == NULL)
        return NULL;
    if (appender_commit(&self->a, frame, length) < 0) {
        PyErr_SetString(PyExc_ValueError, PADDED_CLAIM);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *pub_abort(PublicationCore *self, PyObject *arg)
{
    int32_t length;
    uint8_t *frame = claimed_frame(self, arg, &length, 1);
    if (frame == NULL)
        return NULL;
    appender_abort(&self->a, frame, length);
    Py_RETURN_NONE;
}

/* Writable memoryview over a claimed frame's payload (valid until commit/abort). */
static PyObject *pub_claim_view(PublicationCore *self, PyObject *args)
{
    Py_ssize_t frame_offset, length;
    if (!PyArg_ParseTuple(args, "nn", &frame_offset, &length))
        return NULL;
    Py_ssize_t log_terms = (Py_ssize_t)self->a.g.term_length * PARTITION_COUNT;
    if (self->closed || frame_offset < 0 || length < 0 ||
        frame_offset + HEADER_LENGTH + length > log_terms) {
        PyErr_SetString(PyExc_ValueError, "claim is outside this log");
        return NULL;
    }
    return PyMemoryView_FromMemory((char *)self->a.g.terms + frame_offset + HEADER_LENGTH,
                                   length, PyBUF_WRITE);
}

static PyObject *pub_get_position(PublicationCore *self, void *c)
{
    if (self->closed && self->refusal == CLOSED)
        return PyLong_FromLong(CLOSED);
    return PyLong_FromLongLong(appender_position(&self->a));
}

/* Lets go of this process's threads asleep in _await_progress on the current log (with the
 * GIL, before the log is unmapped or replaced): they are woken, and their waiter counts taken
 * back for them, since they must not touch that log again (the generation tells them). */
static void release_sleepers(PublicationCore *self)
{
    if (!self->closed && self->sleeping > 0) {
        __atomic_fetch_sub(meta_i32(&self->a.g, META_PROGRESS_WAITERS), self->sleeping,
                           __ATOMIC_SEQ_CST);
        __atomic_fetch_add(meta_i32(&self->a.g, META_PROGRESS_WAKE), 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, meta_i32(&self->a.g, META_PROGRESS_WAKE), FUTEX_WAKE, INT_MAX, NULL,
                NULL, 0);
    }
    self->sleeping = 0;
    self->generation++;
}

static PyObject *pub_close_core(PublicationCore *self, PyObject *Py_UNUSED(ignored))
{
    release_sleepers(self);
    self->closed = 1;
    self->refusal = CLOSED;
    Py_RETURN_NONE;
}

/* The driver is gone: offers return NOT_CONNECTED and the log is not written again, until
 * the core is initialised anew over the next driver's log. The position stays readable. */
static PyObject *pub_detach_core(PublicationCore *self, PyObject *Py_UNUSED(ignored))
{
    if (self->closed)
        Py_RETURN_NONE;
    release_sleepers(self);
    self->closed = 1;
    self->refusal = NOT_CONNECTED;
    Py_RETURN_NONE;
}

/* A back-pressured writer's look before it sleeps (see spin_for_images in wakeups.c): for up to
 * spin_ns, yielding the CPU and the GIL between looks, whether the limit is above the position
 * now. A reader that keeps up frees room within the spin: the writer does not sleep and its
 * readers pay no wake-up. 1 when there is room or the core changed (closed, detached, given
 * another log: the caller offers again and learns which); 0 after spin_ns. */
static int pub_spin_for_room(PublicationCore *self, int64_t spin_ns)
{
    uint32_t generation = self->generation;
    int64_t until = monotonic_ns() + spin_ns;
    do {
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
        if (self->closed || self->generation != generation || appender_has_room(&self->a))
            return 1;
    } while (monotonic_ns() < until);
    return 0;
}

/* _await_progress(timeout_s): sleep until a reader moves, the limit moves, or the timeout;
 * looks for _wait_spin_ns first (pub_spin_for_room). */
static PyObject *pub_await_progress(PublicationCore *self, PyObject *arg)
{
    double timeout = PyFloat_AsDouble(arg);
    if (timeout == -1.0 && PyErr_Occurred())
        return NULL;
    if (self->closed) {
        if (self->refusal == NOT_CONNECTED && timeout > 0) {
            /* detached: nothing will ring; the caller looks again after the timeout */
            int64_t ns = timeout_to_ns(timeout < 1.0 ? timeout : 1.0);
            struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
            Py_BEGIN_ALLOW_THREADS
            nanosleep(&ts, NULL);
            Py_END_ALLOW_THREADS
        }
        Py_RETURN_NONE;
    }
    int64_t spin_ns = timeout_to_ns(timeout);
    if (spin_ns > self->wait_spin_ns)
        spin_ns = self->wait_spin_ns;
    if (spin_ns > 0 && pub_spin_for_room(self, spin_ns))
        Py_RETURN_NONE;
    /* the log of this sleep: the core may be closed, detached or given another log meanwhile */
    int32_t *waiters = meta_i32(&self->a.g, META_PROGRESS_WAITERS);
    int32_t *word = meta_i32(&self->a.g, META_PROGRESS_WAKE);
    uint32_t generation = self->generation;
    __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
    self->sleeping++;
    int32_t seen = LOAD_ACQUIRE(word);
    if (!appender_has_room(&self->a)) {
        int64_t ns = timeout_to_ns(timeout);
        Py_BEGIN_ALLOW_THREADS
        wait_words(&word, &seen, 1, ns);
        Py_END_ALLOW_THREADS
    }
    if (self->generation == generation) {  /* else release_sleepers took our count back */
        __atomic_fetch_sub(waiters, 1, __ATOMIC_SEQ_CST);
        self->sleeping--;
    }
    Py_RETURN_NONE;
}

static int pub_init(PublicationCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"log_buffer", "term_length", "initial_term_id", "mtu", "session_id",
                             "stream_id", "limit_buffer", "limit_offset", "exclusive",
                             "counters", NULL};
    PyObject *log, *limit_buf, *counters = Py_None;
    int term_length, initial_term_id, mtu, session_id, stream_id, exclusive;
    Py_ssize_t limit_offset;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iiiiiO!np|O", kwlist, &AtomicBufferType,
                                     &log, &term_length, &initial_term_id, &mtu, &session_id,
                                     &stream_id, &AtomicBufferType, &limit_buf, &limit_offset,
                                     &exclusive, &counters))
        return -1;
    /* everything is checked before anything changes: a failed init leaves the core as it was */
    if (counters != Py_None && !PyObject_TypeCheck(counters, &AtomicBufferType)) {
        PyErr_SetString(PyExc_TypeError, "counters must be an AtomicBuffer or None");
        return -1;
    }
    LogGeometry g;
    if (geometry_from((AtomicBuffer *)log, term_length, initial_term_id, &g) < 0)
        return -1;
    if (mtu < HEADER_LENGTH + FRAME_ALIGNMENT || mtu % FRAME_ALIGNMENT != 0 || mtu > 65504) {
        PyErr_Format(PyExc_ValueError, "mtu %d is not a multiple of 32 in 64..65504", mtu);
        return -1;
    }
    int64_t *limit = position_ptr(limit_buf, limit_offset);
    if (limit == NULL || (counters != Py_None && position_ptr(limit_buf, limit_offset + 8) == NULL))
        return -1;
    /* initialised again (a publication moved to a new driver's log): the old log's sleepers
     * are let go before the geometry changes */
    if (self->log_buffer != NULL)
        release_sleepers(self);
    const uint8_t *values = NULL;
    Py_ssize_t values_len = 0;
    if (counters != Py_None) {
        values = ((AtomicBuffer *)counters)->data;
        values_len = ((AtomicBuffer *)counters)->capacity;
        Py_XSETREF(self->counters_buffer, Py_NewRef(counters));
    } else {
        Py_CLEAR(self->counters_buffer);
    }
    appender_init(&self->a, &g, limit, values, values_len, mtu, session_id, stream_id, exclusive);
    Py_XSETREF(self->log_buffer, Py_NewRef(log));
    Py_XSETREF(self->limit_buffer, Py_NewRef(limit_buf));
    self->closed = 0;
    self->refusal = CLOSED;
    return 0;
}

static int pub_traverse(PublicationCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->log_buffer);
    Py_VISIT(self->limit_buffer);
    Py_VISIT(self->counters_buffer);
    return 0;
}

static int pub_clear(PublicationCore *self)
{
    Py_CLEAR(self->log_buffer);
    Py_CLEAR(self->limit_buffer);
    Py_CLEAR(self->counters_buffer);
    return 0;
}

NATIVE_GC_DEALLOC(pub_dealloc, PublicationCore, pub_clear)

static PyObject *pub_get_max_payload(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->a.max_payload); }
static PyObject *pub_get_max_message(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->a.max_message); }
static PyObject *pub_get_session_id(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->a.session_id); }
static PyObject *pub_get_stream_id(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->a.stream_id); }
static PyObject *pub_get_term_length(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->a.g.term_length); }
static PyObject *pub_get_initial_term_id(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->a.g.initial_term_id); }
static PyObject *pub_get_mtu(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->a.mtu); }
static PyObject *pub_get_is_closed(PublicationCore *self, void *c)
{ return PyBool_FromLong(self->closed && self->refusal == CLOSED); }
static PyObject *pub_get_max_possible_position(PublicationCore *self, void *c)
{ return PyLong_FromLongLong(self->a.max_possible_position); }
static PyObject *pub_get_position_limit(PublicationCore *self, void *c)
{ return PyLong_FromLongLong(LOAD_ACQUIRE(self->a.limit)); }
static PyObject *pub_get_is_connected(PublicationCore *self, void *c)
{
    return PyBool_FromLong(!self->closed &&
                           LOAD_ACQUIRE((int32_t *)(self->a.g.meta + META_IS_CONNECTED)) == 1);
}

static PyMemberDef pub_members[] = {
    {"_wait_spin_ns", T_LONGLONG, offsetof(PublicationCore, wait_spin_ns), 0,
     "ns a back-pressured publish() looks for room, yielding, before it sleeps (set by the "
     "client from Context.wait_spin; 0: sleep at once)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef pub_getset[] = {
    {"max_payload_length", (getter)pub_get_max_payload, NULL,
     "largest payload of one frame (mtu - 32); larger messages are fragmented", NULL},
    {"max_message_length", (getter)pub_get_max_message, NULL,
     "largest message offer accepts: min(term length / 8, 16 MiB)", NULL},
    {"session_id", (getter)pub_get_session_id, NULL, "session id of this publication", NULL},
    {"stream_id", (getter)pub_get_stream_id, NULL, "stream id of this publication", NULL},
    {"term_length", (getter)pub_get_term_length, NULL, "term length in bytes", NULL},
    {"initial_term_id", (getter)pub_get_initial_term_id, NULL, "initial term id of the log", NULL},
    {"mtu", (getter)pub_get_mtu, NULL, "maximum frame length including the header", NULL},
    {"is_closed", (getter)pub_get_is_closed, NULL, "True once closed", NULL},
    {"max_possible_position", (getter)pub_get_max_possible_position, NULL,
     "term length * 2^31: offers at or past it return MAX_POSITION_EXCEEDED", NULL},
    {"position", (getter)pub_get_position, NULL,
     "the position the next message would be appended at (CLOSED once closed; while "
     "detached from a lost driver, where the lost log ended)", NULL},
    {"position_limit", (getter)pub_get_position_limit, NULL,
     "the position beyond which offers are back-pressured", NULL},
    {"is_connected", (getter)pub_get_is_connected, NULL,
     "True while at least one subscriber is connected", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef pub_methods[] = {
    {"publish", (PyCFunction)(void (*)(void))pub_publish, METH_FASTCALL | METH_KEYWORDS,
     "publish(*buffers, timeout=1.0, reserved_value=0) -> int\n\nOffer until it succeeds, "
     "sleeping while back-pressured (after a short spin, Context.wait_spin); returns the new "
     "position. A back-pressured publisher sleeps (no CPU) until a subscriber moves, woken by "
     "it. Raises PublicationError with the last code after timeout seconds (None: never; 0: "
     "after the one offer), or at "
     "once when the publication is closed or its position space is exhausted. Accepted at once, "
     "it costs one offer."},
    {"offer", (PyCFunction)(void (*)(void))pub_offer, METH_FASTCALL | METH_KEYWORDS,
     "offer(*buffers, reserved_value=0) -> int\n\nAppend one message made of the given buffers "
     "(a gather of up to 16). Returns the new stream position (> 0) or a negative code: "
     "NOT_CONNECTED, BACK_PRESSURED, ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED. Raises "
     "ValueError when the message exceeds max_message_length, TypeError for a non-buffer."},
    {"offer_many", (PyCFunction)pub_offer_many, METH_O,
     "offer_many(messages) -> int\n\nAppend several messages with one reservation. messages is "
     "a sequence of buffers, a 2-D array (one message per row) or a 1-D array of records (one "
     "message per record). Returns how many were appended from the front (>= 1), or a negative "
     "code when none was; 0 for an empty batch. A message past max_message_length goes alone "
     "on the large-message path (as offer() takes it): first in the batch, it is the one "
     "appended; further along, the batch ends before it."},
    {"_claim", (PyCFunction)pub_claim, METH_VARARGS, NULL},
    {"_claim_view", (PyCFunction)pub_claim_view, METH_VARARGS, NULL},
    {"_commit", (PyCFunction)pub_commit, METH_O, NULL},
    {"_abort", (PyCFunction)pub_abort, METH_O, NULL},
    {"_close_core", (PyCFunction)pub_close_core, METH_NOARGS, NULL},
    {"_detach_core", (PyCFunction)pub_detach_core, METH_NOARGS,
     "_detach_core(): the driver is gone; offers return NOT_CONNECTED until __init__ again"},
    {"_await_progress", (PyCFunction)pub_await_progress, METH_O,
     "_await_progress(timeout_s): sleep until a reader or the limit moves, or the timeout"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject PublicationCoreType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.PublicationCore", PublicationCore,
                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
                     "The term appender behind ExclusivePublication and ConcurrentPublication."),
    NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, pub_init, pub_dealloc),
    .tp_traverse = (traverseproc)pub_traverse,
    .tp_clear = (inquiry)pub_clear,
    .tp_methods = pub_methods,
    .tp_getset = pub_getset,
    .tp_members = pub_members,
};
