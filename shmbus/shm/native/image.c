/*
 * The term reader: ImageCore (poll, controlled_poll, the batch _scan; image_take, the whole
 * messages of Subscription.take and messages()) and Header, the copy of a frame's header
 * handed to fragment handlers. The subscriber position is stored here (advance, consume).
 *
 * Runs in client processes, on the thread that polls, with the GIL held (handlers are Python
 * callables). image_ready is also called by the sleeps (wakeups.c, futex_ring.c) and
 * group_member.c delivers with deliver/frame_ok.
 */
#include "types.h"

static PyObject *header_i32(Header *self, void *closure)
{ return PyLong_FromLong(rd_i32(self->bytes + (intptr_t)closure)); }
static PyObject *header_flags(Header *self, void *c)
{ return PyLong_FromLong(self->bytes[FLAGS_OFFSET]); }
static PyObject *header_type(Header *self, void *c)
{ return PyLong_FromLong(rd_u16(self->bytes + TYPE_OFFSET)); }
static PyObject *header_reserved(Header *self, void *c)
{ return PyLong_FromLongLong(rd_i64(self->bytes + RESERVED_VALUE_OFFSET)); }
static PyObject *header_position(Header *self, void *c)
{
    int32_t term_id = rd_i32(self->bytes + TERM_ID_OFFSET);
    int64_t end = rd_i32(self->bytes + TERM_OFFSET_OFFSET) +
                  ALIGN((int64_t)rd_i32(self->bytes + FRAME_LENGTH_OFFSET), FRAME_ALIGNMENT);
    return PyLong_FromLongLong((term_count_between(term_id, self->initial_term_id)
                                << self->position_bits) + end);
}
static PyObject *header_raw(Header *self, void *c)
{ return PyBytes_FromStringAndSize((const char *)self->bytes, HEADER_LENGTH); }

static PyObject *header_repr(Header *self)
{
    return PyUnicode_FromFormat(
        "Header(session_id=%d, stream_id=%d, term_id=%d, term_offset=%d, frame_length=%d, "
        "flags=0x%x)", rd_i32(self->bytes + SESSION_ID_OFFSET),
        rd_i32(self->bytes + STREAM_ID_OFFSET), rd_i32(self->bytes + TERM_ID_OFFSET),
        rd_i32(self->bytes + TERM_OFFSET_OFFSET), rd_i32(self->bytes + FRAME_LENGTH_OFFSET),
        self->bytes[FLAGS_OFFSET]);
}

static PyGetSetDef header_getset[] = {
    {"frame_length", (getter)header_i32, NULL, "header + payload length in bytes",
     (void *)(intptr_t)FRAME_LENGTH_OFFSET},
    {"term_offset", (getter)header_i32, NULL, "offset of the frame in its term",
     (void *)(intptr_t)TERM_OFFSET_OFFSET},
    {"session_id", (getter)header_i32, NULL, "publisher's session id",
     (void *)(intptr_t)SESSION_ID_OFFSET},
    {"stream_id", (getter)header_i32, NULL, "stream id", (void *)(intptr_t)STREAM_ID_OFFSET},
    {"term_id", (getter)header_i32, NULL, "term id", (void *)(intptr_t)TERM_ID_OFFSET},
    {"flags", (getter)header_flags, NULL, "B 0x80, E 0x40, EOS 0x20", NULL},
    {"type", (getter)header_type, NULL, "frame type (1 DATA)", NULL},
    {"reserved_value", (getter)header_reserved, NULL, "the 64-bit reserved value", NULL},
    {"position", (getter)header_position, NULL, "stream position just after this frame", NULL},
    {"raw", (getter)header_raw, NULL, "the 32 header bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject HeaderType = {
    NATIVE_TYPE_HEAD("shmbus.Header", Header, Py_TPFLAGS_DEFAULT,
                     "The header of one fragment: a copy, safe to keep after the handler returns."),
    .tp_getset = header_getset,
    .tp_repr = (reprfunc)header_repr,
};

/* Stores the new subscriber position and wakes a publisher asleep at its limit. An owned
 * image stores by compare-and-swap from what it stored last, so a counter reclaimed under it
 * (see image_owns_counter) is left alone. */
static inline void advance(ImageCore *self, int64_t position)
{
    self->partial = 0;
    if (self->ids == NULL) {
        STORE_RELEASE(self->position, position);
    } else {
        int64_t expected = self->stored;
        self->local = position;
        if (!image_owns_counter(self) ||
            !__atomic_compare_exchange_n(self->position, &expected, position, 0,
                                         __ATOMIC_RELEASE, __ATOMIC_RELAXED)) {
            self->reclaimed = 1;
            return;
        }
        self->stored = position;
        AtomicBuffer *values = (AtomicBuffer *)self->position_buffer;
        fc_raise_for_writer(&self->g, values->data, values->capacity);
    }
    if (!self->closed)
        wake_word(meta_i32(&self->g, META_PROGRESS_WAKE), meta_i32(&self->g, META_PROGRESS_WAITERS));
}

/*
 * Consumes up to `position` for image_take, one message at a time. An owned image publishes
 * the new position only once it is a sixteenth of a term past the last one stored (or when
 * flushed: the reader found nothing more, or its iterator went away). Storing per message
 * would cost a fence and a compare-and-swap per message, and a back-pressured publisher would
 * be woken for every message instead of for a run of them. Everything in this process reads
 * the image from `local`, so nothing is read twice; other processes see the position at most
 * that far behind.
 */
static inline void consume(ImageCore *self, int64_t position)
{
    if (self->ids != NULL && position - self->stored < (self->g.term_length >> 4)) {
        self->local = position;
        self->partial = 0;
    } else {
        advance(self, position);
    }
}

/* Publishes what consume held back. */
void flush_position(ImageCore *self)
{
    if (self->ids != NULL && self->local != self->stored && !self->closed)
        advance(self, self->local);
}

static PyObject *release_str;

static Header *next_header(ImageCore *self, const uint8_t *frame)
{
    Header *h = self->header;
    if (h == NULL || Py_REFCNT(h) > 1) {
        Py_XDECREF(h);
        h = PyObject_New(Header, &HeaderType);
        if (h == NULL) { self->header = NULL; return NULL; }
        h->position_bits = self->g.position_bits;
        h->initial_term_id = self->g.initial_term_id;
        self->header = h;
    }
    memcpy(h->bytes, frame, HEADER_LENGTH);
    return h;
}

static PyObject *large_payload_str, *large_bytes_str;
/* What deliver returns for a large message whose block is gone: the driver stopped counting
 * this reader (timed out, resting) and freed it. Like a lapped frame, it is not delivered and
 * not consumed: the reader stops there until the client hears that the image is gone. */
PyObject *large_gone;

/* The payload of a large message's reference frame, resolved by the Python side of the image
 * (Image._large_payload / _large_bytes(reference, position): the shared-memory block it refers
 * to, which its writer bound to the frame ending at that stream position). */
static PyObject *resolve_large(ImageCore *self, PyObject *method, const uint8_t *frame,
                               int32_t length)
{
    int64_t end = (term_count_between(rd_i32(frame + TERM_ID_OFFSET), self->g.initial_term_id)
                   << self->g.position_bits)
                  + rd_i32(frame + TERM_OFFSET_OFFSET) + ALIGN((int64_t)length, FRAME_ALIGNMENT);
    PyObject *args[3] = {(PyObject *)self,
                         PyBytes_FromStringAndSize((const char *)frame + HEADER_LENGTH,
                                                   length - HEADER_LENGTH),
                         PyLong_FromLongLong(end)};
    PyObject *r = args[1] == NULL || args[2] == NULL ? NULL
        : PyObject_VectorcallMethod(method, args, 3, NULL);
    Py_XDECREF(args[1]);
    Py_XDECREF(args[2]);
    return r;
}

/* A copy of a large message's block as bytes (what messages() yields), from its reference
 * frame; Py_None when the block is gone (see large_gone), NULL with an exception on error. */
PyObject *large_bytes(ImageCore *self, const uint8_t *frame, int32_t length)
{
    return resolve_large(self, large_bytes_str, frame, length);
}

/* Calls handler(memoryview, header) for one fragment; returns its result (new ref) or NULL. */
PyObject *deliver(ImageCore *self, PyObject *handler, uint8_t *frame, int32_t length)
{
    PyObject *view = IS_REFERENCE(frame[FLAGS_OFFSET])
        ? resolve_large(self, large_payload_str, frame, length)
        : PyMemoryView_FromMemory((char *)frame + HEADER_LENGTH, length - HEADER_LENGTH,
                                  PyBUF_READ);
    if (view == NULL)
        return NULL;
    if (view == Py_None) {
        Py_DECREF(view);
        return Py_NewRef(large_gone);
    }
    Header *h = next_header(self, frame);
    if (h == NULL) { Py_DECREF(view); return NULL; }
    PyObject *args[2] = {view, (PyObject *)h};
    PyObject *r = PyObject_Vectorcall(handler, args, 2, NULL);
    if (Py_REFCNT(view) > 1) {
        /* the handler kept the view (or its traceback does): it must not outlive the call,
         * since the term is cleaned and reused. A pending exception is kept across this. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyObject *rr = PyObject_CallMethodNoArgs(view, release_str);
        if (rr == NULL) PyErr_Clear(); else Py_DECREF(rr);
        PyErr_Restore(type, value, tb);
    }
    Py_DECREF(view);
    return r;
}

/*
 * Whether a committed DATA frame belongs to the term the reader is in. A writer no longer held
 * back by this reader (the driver dropped it: timed out, untethered and resting; or its process
 * was stopped mid-poll) may lap it and rewrite the term for a later term id. Such frames are not
 * delivered: the reader stops there until the client hears from the driver that the image is
 * gone. (Padding is not checked: the driver's unblocker writes only its type and length.)
 */
static inline int frame_in_term(const ImageCore *self, const uint8_t *frame, int64_t position)
{
    uint32_t term_id = (uint32_t)self->g.initial_term_id +
                       (uint32_t)(position >> self->g.position_bits);
    return rd_i32(frame + TERM_ID_OFFSET) == (int32_t)term_id;
}

/* Validates a committed frame's length. An impossible one in a lapped term (the bytes of a
 * later term's frames, no frame of this term) returns 0 with no error: the reader stops, as
 * at any lapped frame. In the reader's own term it is corruption: raises, returns 0. */
int frame_ok(ImageCore *self, const uint8_t *frame, int32_t offset, int32_t length,
             int64_t position)
{
    if (length < HEADER_LENGTH || (int64_t)offset + ALIGN((int64_t)length, FRAME_ALIGNMENT) >
                                      self->g.term_length) {
        if (frame_in_term(self, frame, position))
            PyErr_Format(PyExc_RuntimeError,
                         "corrupt log: frame length %d at term offset %d (term length %d)",
                         length, offset, self->g.term_length);
        return 0;
    }
    return 1;
}

/* What a reader finds at a term offset (see next_frame). */
enum { FRAME_STOP, FRAME_PAD, FRAME_DATA, FRAME_ERROR };

/*
 * One step of the readers' walk through their term (poll, controlled_poll, _scan, take): the
 * frame at term[offset], with its committed *length. FRAME_STOP at an uncommitted frame or a
 * DATA frame of a later term (see frame_in_term), FRAME_ERROR (exception set) for a corrupt
 * length in the reader's own term. The other walks over logs keep their own loops because
 * their rules differ: message_extent (take's fragments after the first) tells an uncommitted
 * fragment from a stale one; a group member (group_member.c) scans without the lock, where a
 * bad length may be a stale read; the netbridge sender (netbridge/native/term_scan.c) cuts
 * datagrams, not fragments.
 */
static inline int next_frame(ImageCore *self, const uint8_t *term, int32_t offset,
                             int64_t position, int32_t *length)
{
    *length = LOAD_ACQUIRE((const int32_t *)(term + offset));
    if (*length <= 0)
        return FRAME_STOP;
    const uint8_t *frame = term + offset;
    int pad = rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD;
    if (!pad && !frame_in_term(self, frame, position))
        return FRAME_STOP;
    if (!frame_ok(self, frame, offset, *length, position))
        return PyErr_Occurred() ? FRAME_ERROR : FRAME_STOP;
    return pad ? FRAME_PAD : FRAME_DATA;
}

/*
 * Delivers up to `limit` fragments to handler(buffer, header); returns how many, or -1 with an
 * exception set (the fragments before it still count as consumed). A controlled handler returns
 * an Action (None: CONTINUE); a plain handler's return value is ignored. Either way a large
 * message whose payload is gone (large_gone) is not consumed and ends the poll, as ABORT does.
 */
static inline long poll_fragments(ImageCore *self, PyObject *handler, long limit, int controlled)
{
    if (self->closed || !image_owns_counter(self))
        return 0;
    int64_t position = image_position(self);
    int32_t initial_offset = (int32_t)(position & (self->g.term_length - 1));
    uint8_t *term = term_at(&self->g, (int)((position >> self->g.position_bits) % PARTITION_COUNT));
    int32_t offset = initial_offset;
    long fragments = 0;
    int failed = 0;
    while (fragments < limit && offset < self->g.term_length) {
        int32_t length;
        int kind = next_frame(self, term, offset, position, &length);
        if (kind == FRAME_STOP || kind == FRAME_ERROR) {
            failed = kind == FRAME_ERROR;
            break;
        }
        uint8_t *frame = term + offset;
        int32_t aligned = (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        offset += aligned;
        if (kind == FRAME_PAD)
            continue;
        fragments++;
        PyObject *r = deliver(self, handler, frame, length);
        if (r == NULL) { failed = 1; break; }
        long action = r == large_gone ? ACTION_ABORT
                    : !controlled || r == Py_None ? ACTION_CONTINUE : PyLong_AsLong(r);
        Py_DECREF(r);
        if (action == -1 && PyErr_Occurred()) { failed = 1; break; }
        if (action == ACTION_ABORT) {
            fragments--;
            offset -= aligned;
            break;
        }
        if (action == ACTION_BREAK || self->closed)
            break;  /* closed: the handler closed the image, and its log may be gone */
        if (action == ACTION_COMMIT) {
            position += offset - initial_offset;
            initial_offset = offset;
            advance(self, position);
        } else if (action != ACTION_CONTINUE) {
            PyErr_Format(PyExc_ValueError, "controlled poll handler returned %ld, not an Action",
                         action);
            failed = 1;
            break;
        }
    }
    if (offset != initial_offset)
        advance(self, position + (offset - initial_offset));
    return failed ? -1 : fragments;
}

/* poll_fragments with a plain handler. */
long image_poll(ImageCore *self, PyObject *handler, long limit)
{
    return poll_fragments(self, handler, limit, 0);
}

/* Like image_poll, the handler returning an Action. */
long image_controlled_poll(ImageCore *self, PyObject *handler, long limit)
{
    return poll_fragments(self, handler, limit, 1);
}

/* The length of the message whose first fragment is at `offset` in its term: on return,
 * *end is the term offset just past its last fragment and the result is its payload length.
 * Returns -1 when the rest is not committed yet (*end: the first missing fragment), -2 when
 * the frames after it are not this message's (*end: where they start; they are read as
 * messages of their own), -3 with an exception set for a corrupt frame, -4 when the term was
 * lapped under the reader. */
Py_ssize_t message_extent(ImageCore *self, const uint8_t *term, int32_t offset,
                          int64_t position, int32_t *end)
{
    Py_ssize_t total = 0;
    int32_t at = offset;
    for (;;) {
        int32_t length = LOAD_ACQUIRE((const int32_t *)(term + at));
        *end = at;
        if (length <= 0)
            return -1;
        const uint8_t *frame = term + at;
        if (rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD)
            return -2;
        if (!frame_in_term(self, frame, position))
            return -4;
        if (!frame_ok(self, frame, at, length, position))
            return PyErr_Occurred() ? -3 : -4;
        uint8_t flags = frame[FLAGS_OFFSET];
        if (at != offset && (flags & BEGIN_FLAG))
            return -2;
        total += length - HEADER_LENGTH;
        at += (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        if (flags & END_FLAG) {
            *end = at;
            return total;
        }
        if (at >= self->g.term_length) {
            *end = at;
            return -2;
        }
    }
}

/* The payloads of the fragments from term offset `offset` to `end` (a whole message, as
 * message_extent found it: `total` bytes) copied one after the other into a new bytes object;
 * NULL with an exception when out of memory. */
PyObject *gather_fragments(const uint8_t *term, int32_t offset, int32_t end, Py_ssize_t total)
{
    PyObject *message = PyBytes_FromStringAndSize(NULL, total);
    if (message == NULL)
        return NULL;
    char *out = PyBytes_AS_STRING(message);
    for (int32_t at = offset; at < end;) {
        int32_t frame_length = rd_i32(term + at);
        memcpy(out, term + at + HEADER_LENGTH, (size_t)(frame_length - HEADER_LENGTH));
        out += frame_length - HEADER_LENGTH;
        at += (int32_t)ALIGN(frame_length, FRAME_ALIGNMENT);
    }
    return message;
}

/* Asks the cache for the next message's committed fragments at term offset `at` (their
 * lines after the first): its bytes come from the writer's core while the caller works on
 * this one. */
static inline void prefetch_message(const ImageCore *self, const uint8_t *term, int32_t at)
{
    while (at < self->g.term_length) {
        int32_t length = LOAD_ACQUIRE((const int32_t *)(term + at));
        if (length <= 0)
            return;
        int32_t next = at + (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        for (int32_t line = at + 64; line < next; line += 64)
            __builtin_prefetch(term + line, 0, 3);
        if (term[at + FLAGS_OFFSET] & END_FLAG || next > self->g.term_length)
            return;
        at = next;
    }
}

/*
 * The next whole message of the image, copied out as a new bytes object and consumed (with
 * any padding before it). A fragmented message is put together from its fragments, which lie
 * one after the other in one term. NULL with no exception when no whole message is committed:
 * a fragmented message still arriving leaves `partial` set, so that a waiter sleeps until its
 * next fragment. NULL with an exception for a corrupt log. Fragments that are not part of a
 * whole message (no first fragment, or a new first fragment before the last one) are dropped,
 * as FragmentAssembler drops them.
 */
PyObject *image_take(ImageCore *self)
{
    if (self->closed || !image_owns_counter(self))
        return NULL;
    for (;;) {
        int64_t position = image_position(self);
        int32_t offset = (int32_t)(position & (self->g.term_length - 1));
        uint8_t *term = term_at(&self->g, (int)((position >> self->g.position_bits) % PARTITION_COUNT));
        int32_t length;
        int kind = next_frame(self, term, offset, position, &length);
        if (kind == FRAME_STOP || kind == FRAME_ERROR)
            return NULL;
        uint8_t *frame = term + offset;
        int32_t aligned = (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        uint8_t flags = frame[FLAGS_OFFSET];
        if (kind == FRAME_PAD || !(flags & BEGIN_FLAG)) {
            consume(self, position + aligned);
            continue;
        }
        if (flags & END_FLAG) {
            PyObject *message = IS_REFERENCE(flags)
                ? large_bytes(self, frame, length)
                : PyBytes_FromStringAndSize((char *)frame + HEADER_LENGTH,
                                            length - HEADER_LENGTH);
            if (message == Py_None) {  /* its block is gone: stop here (see large_gone) */
                Py_DECREF(message);
                return NULL;
            }
            if (message != NULL) {
                prefetch_message(self, term, offset + aligned);
                consume(self, position + aligned);
            } else if (PyErr_ExceptionMatches(PyExc_ValueError)) {
                /* a reference no writer made (CorruptReferenceError): dropped, the error
                 * raised once, as poll does; staying there would stop the reader for good */
                consume(self, position + aligned);
            }
            return message;
        }
        int32_t end;
        Py_ssize_t total = message_extent(self, term, offset, position, &end);
        if (total == -1) {
            self->partial = end - offset;
            return NULL;
        }
        if (total == -3 || total == -4)
            return NULL;
        if (total == -2) {
            consume(self, position + (end - offset));
            continue;
        }
        PyObject *message = gather_fragments(term, offset, end, total);
        if (message == NULL)
            return NULL;
        prefetch_message(self, term, end);
        consume(self, position + (end - offset));
        return message;
    }
}

/* Parses (handler, fragment_limit) for the poll methods; the limit is -1 on error. */
static long poll_args(PyObject *const *args, Py_ssize_t nargs, const char *usage)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s(handler, fragment_limit)", usage);
        return -1;
    }
    long limit = PyLong_AsLong(args[1]);
    if (limit < 0 && !PyErr_Occurred())
        PyErr_Format(PyExc_ValueError, "fragment_limit must be >= 0, not %ld", limit);
    return limit < 0 ? -1 : limit;
}

static PyObject *img_poll(ImageCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    long limit = poll_args(args, nargs, "poll");
    long n = limit < 0 ? -1 : image_poll(self, args[0], limit);
    return n < 0 ? NULL : PyLong_FromLong(n);
}

static PyObject *img_controlled_poll(ImageCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    long limit = poll_args(args, nargs, "controlled_poll");
    long n = limit < 0 ? -1 : image_controlled_poll(self, args[0], limit);
    return n < 0 ? NULL : PyLong_FromLong(n);
}

/*
 * _scan(limit, offsets, lengths, flags) -> (count, term_index, bytes_scanned)
 * Fills payload offsets (int64, relative to the term) and payload lengths (int32) and flags
 * (uint8) of up to `limit` DATA fragments from the current position, without moving it.
 */
static PyObject *img_scan(ImageCore *self, PyObject *args)
{
    Py_ssize_t limit;
    Py_buffer offs, lens, flags;
    if (!PyArg_ParseTuple(args, "nw*w*w*", &limit, &offs, &lens, &flags))
        return NULL;
    PyObject *result = NULL;
    if (self->closed || !image_owns_counter(self)) {
        result = Py_BuildValue("(nii)", (Py_ssize_t)0, 0, 0);
        goto done;
    }
    if (offs.len < limit * 8 || lens.len < limit * 4 || flags.len < limit) {
        PyErr_SetString(PyExc_ValueError, "scan arrays are smaller than the limit");
        goto done;
    }
    int64_t position = image_position(self);
    int32_t term_offset = (int32_t)(position & (self->g.term_length - 1));
    int index = (int)((position >> self->g.position_bits) % PARTITION_COUNT);
    uint8_t *term = term_at(&self->g, index);
    int64_t *o = offs.buf;
    int32_t *l = lens.buf;
    uint8_t *f = flags.buf;
    int32_t offset = term_offset;
    Py_ssize_t count = 0;
    while (count < limit && offset < self->g.term_length) {
        int32_t length;
        int kind = next_frame(self, term, offset, position, &length);
        if (kind == FRAME_ERROR)
            goto done;
        if (kind == FRAME_STOP)
            break;
        uint8_t *frame = term + offset;
        if (kind == FRAME_DATA) {
            o[count] = offset + HEADER_LENGTH;
            l[count] = length - HEADER_LENGTH;
            f[count] = frame[FLAGS_OFFSET];
            count++;
        }
        offset += (int32_t)ALIGN(length, FRAME_ALIGNMENT);
    }
    result = Py_BuildValue("(nii)", count, index, offset - term_offset);
done:
    PyBuffer_Release(&offs);
    PyBuffer_Release(&lens);
    PyBuffer_Release(&flags);
    return result;
}

/* Called with the GIL before the log is unmapped (see pub_close_core). */
static PyObject *img_close_core(ImageCore *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->closed && self->sleeping > 0) {
        __atomic_fetch_sub(meta_i32(&self->g, META_DATA_WAITERS), self->sleeping,
                           __ATOMIC_SEQ_CST);
        __atomic_fetch_add(meta_i32(&self->g, META_DATA_WAKE), 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, meta_i32(&self->g, META_DATA_WAKE), FUTEX_WAKE, INT_MAX, NULL, NULL,
                0);
        self->sleeping = 0;
    }
    self->closed = 1;
    Py_RETURN_NONE;
}

/* For a group's image (whole_messages): whether a whole message (or padding, or a bad frame,
 * which the claim reports) is committed at `position`, as a member's claim would find it. The
 * leading fragments of a message whose next fragment is not there yet (a UDP fragment awaiting
 * its retransmission, a writer between fragments) are not: they are remembered in `partial`,
 * so the next look starts at the gap and a waiter sleeps until it is filled. */
static int whole_message_ready(ImageCore *self, int64_t position, const uint8_t *term,
                               int32_t start)
{
    if (self->partial_at != position) {  /* a member claimed meanwhile: measure anew */
        self->partial = 0;
        self->partial_at = position;
    }
    int32_t offset = start + self->partial;
    while (offset < self->g.term_length) {
        const uint8_t *frame = term + offset;
        int32_t length = LOAD_ACQUIRE((const int32_t *)frame);
        if (length <= 0) {
            self->partial = offset - start;
            return 0;
        }
        if (length < HEADER_LENGTH || rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD ||
            (frame[FLAGS_OFFSET] & END_FLAG))
            return 1;
        offset += (int32_t)ALIGN(length, FRAME_ALIGNMENT);
    }
    return 1;
}

/* True when a poll would find a frame (or the image is closed: the caller must look); for a
 * group's image, a whole message (see whole_message_ready). */
int image_ready(ImageCore *self)
{
    if (self->closed || !image_owns_counter(self))
        return self->closed;
    int64_t position = image_position(self);
    int32_t start = (int32_t)(position & (self->g.term_length - 1));
    uint8_t *term = term_at(&self->g, (int)((position >> self->g.position_bits) % PARTITION_COUNT));
    if (self->whole_messages)
        return whole_message_ready(self, position, term, start);
    return LOAD_ACQUIRE((int32_t *)(term + start + self->partial)) > 0;
}

static PyObject *img_get_is_closed(ImageCore *self, void *c)
{ return PyBool_FromLong(self->closed); }

static PyObject *img_get_position(ImageCore *self, void *c)
{ return PyLong_FromLongLong(image_position(self)); }

static PyObject *img_get_whole_messages(ImageCore *self, void *c)
{ return PyBool_FromLong(self->whole_messages); }

static int img_set_whole_messages(ImageCore *self, PyObject *value, void *c)
{
    int on = value == NULL ? 0 : PyObject_IsTrue(value);
    if (on < 0)
        return -1;
    self->whole_messages = on;
    self->partial = 0;
    self->partial_at = -1;
    return 0;
}

static PyObject *img_get_is_reclaimed(ImageCore *self, void *c)
{ return PyBool_FromLong(!image_owns_counter(self)); }

static int img_set_position(ImageCore *self, PyObject *value, void *c)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "position cannot be deleted");
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0 || v % FRAME_ALIGNMENT != 0) {
        PyErr_Format(PyExc_ValueError, "position %lld is not a non-negative multiple of 32", v);
        return -1;
    }
    advance(self, (int64_t)v);
    return 0;
}

static PyObject *img_get_term_length(ImageCore *self, void *c)
{ return PyLong_FromLong(self->g.term_length); }
static PyObject *img_get_initial_term_id(ImageCore *self, void *c)
{ return PyLong_FromLong(self->g.initial_term_id); }

static int img_init(ImageCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"log_buffer", "term_length", "initial_term_id", "position_buffer",
                             "position_offset", "owned", NULL};
    PyObject *log, *pos_buf;
    int term_length, initial_term_id, owned = 0;
    Py_ssize_t pos_offset;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iiO!n|p", kwlist, &AtomicBufferType, &log,
                                     &term_length, &initial_term_id, &AtomicBufferType, &pos_buf,
                                     &pos_offset, &owned))
        return -1;
    if (geometry_from((AtomicBuffer *)log, term_length, initial_term_id, &self->g) < 0)
        return -1;
    self->position = position_ptr(pos_buf, pos_offset);
    if (self->position == NULL)
        return -1;
    self->ids = NULL;
    self->reclaimed = 0;
    if (owned) {  /* a counter slot: value, registration id, owner id, reference id */
        if (position_ptr(pos_buf, pos_offset + 24) == NULL)
            return -1;
        self->ids = self->position + 1;
        self->registration_id = LOAD_ACQUIRE(self->ids);
        self->reference_id = LOAD_ACQUIRE(self->ids + 2);
        self->local = self->stored = LOAD_ACQUIRE(self->position);
    }
    self->partial = 0;
    self->partial_at = -1;
    Py_XSETREF(self->log_buffer, Py_NewRef(log));
    Py_XSETREF(self->position_buffer, Py_NewRef(pos_buf));
    return 0;
}

static int img_traverse(ImageCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->log_buffer);
    Py_VISIT(self->position_buffer);
    return 0;
}

static int img_clear(ImageCore *self)
{
    Py_CLEAR(self->log_buffer);
    Py_CLEAR(self->position_buffer);
    Py_CLEAR(self->header);
    return 0;
}

NATIVE_GC_DEALLOC(img_dealloc, ImageCore, img_clear)

static PyGetSetDef img_getset[] = {
    {"position", (getter)img_get_position, (setter)img_set_position,
     "the subscriber position: bytes consumed so far in this stream", NULL},
    {"term_length", (getter)img_get_term_length, NULL, "term length in bytes", NULL},
    {"initial_term_id", (getter)img_get_initial_term_id, NULL, "initial term id", NULL},
    {"is_closed", (getter)img_get_is_closed, NULL, "True once closed", NULL},
    {"is_reclaimed", (getter)img_get_is_reclaimed, NULL,
     "True once the driver took this image's position counter back (its client was timed "
     "out, or the image removed): it reads nothing more", NULL},
    {"_whole_messages", (getter)img_get_whole_messages, (setter)img_set_whole_messages,
     "True for a group's image: a waiter wakes for whole messages only", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef img_methods[] = {
    {"poll", (PyCFunction)(void (*)(void))img_poll, METH_FASTCALL,
     "poll(handler, fragment_limit) -> int\n\nCall handler(buffer, header) for up to "
     "fragment_limit fragments from the current position, then advance it. The buffer is a "
     "read-only memoryview valid only during the call. Returns the number of fragments. If the "
     "handler raises, the fragment counts as consumed and the exception propagates."},
    {"controlled_poll", (PyCFunction)(void (*)(void))img_controlled_poll, METH_FASTCALL,
     "controlled_poll(handler, fragment_limit) -> int\n\nLike poll, but the handler returns an "
     "Action: ABORT (not consumed, stop), BREAK (consumed, stop), COMMIT (consumed, position "
     "saved now), CONTINUE (or None)."},
    {"_scan", (PyCFunction)img_scan, METH_VARARGS, NULL},
    {"_close_core", (PyCFunction)img_close_core, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ImageCoreType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.ImageCore", ImageCore,
                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
                     "The term reader behind Image."),
    NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, img_init, img_dealloc),
    .tp_traverse = (traverseproc)img_traverse,
    .tp_clear = (inquiry)img_clear,
    .tp_methods = img_methods,
    .tp_getset = img_getset,
};

/* What the module's import prepares for the readers; -1 with an exception. */
int image_module_init(void)
{
    release_str = PyUnicode_InternFromString("release");
    large_payload_str = PyUnicode_InternFromString("_large_payload");
    large_bytes_str = PyUnicode_InternFromString("_large_bytes");
    large_gone = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    if (large_gone == NULL)
        return -1;
    return release_str == NULL || large_payload_str == NULL || large_bytes_str == NULL ? -1 : 0;
}
