/*
 * GroupMemberCore: one member of a subscription group, competing consumers that claim whole
 * messages at a shared position (shmbus/streams/subscription_group.py); the driver's side of the same
 * records is shmbus/driver/group_claims.py.
 *
 * Runs in client processes, on the thread that polls, with the GIL held (handlers are Python
 * callables). A responder (calls.c) claims one request at a time through group_next_message
 * and group_message_done.
 *
 * The members of a group on one log share a claim position (the grp-pos counter: everything
 * before it has been claimed). Each member has a claim record (its grp-claim counter), and the
 * driver hands a departed member's unfinished claim to the others through the group's orphan
 * record (grp-orphan). These live in 64-byte counter slots of cnc.dat: the value word (offset
 * 0) is what flow control counts, the second word (offset 32) is the claim's end, or for
 * grp-pos the group's claim lock (the token of the member inside a claim, 0 when free).
 *
 * A record (start, end) owns [start, end) when start < end; start is GROUP_IDLE otherwise.
 * Only the member writes its record (the driver only after the member has left). To claim, a
 * member first announces an empty claim at the source's start (end = start, then start, which
 * flow control counts: nothing from there on is cleaned meanwhile), finds a run of whole
 * messages without the lock, then under the lock checks the source has not moved, stores its
 * end (from here on it owns the range) and moves the source on (grp-pos to the end, or the
 * orphan to idle). The driver resolves a member that left inside the lock from its record:
 * end > start means the claim happened, and the driver completes the move.
 *
 * Delivery moves start past each whole message once its last fragment's handler returns, so
 * a member that dies leaves at most the message in its handler unfinished: only that one is
 * delivered again (at least once).
 */
#include "types.h"

#include <sched.h>

#define GROUP_SECOND_WORD 32
#define GROUP_IDLE INT64_MAX
#define GROUP_LOCK_SPINS 256

typedef struct {
    ImageCore image;          /* its position is the group's claim position (grp-pos) */
    int64_t *lock;            /* grp-pos's second word */
    int64_t *start;           /* this member's claim record */
    int64_t *end;
    int64_t *orphan_start;    /* the group's orphan record (written by the driver) */
    int64_t *orphan_end;
    int64_t token;            /* this member's lock token (> 0) */
    int handed_on;            /* the message being delivered heads a claim handed on */
} GroupMemberCore;

static int group_lock(GroupMemberCore *self)
{
    for (int i = 0; i < GROUP_LOCK_SPINS; i++) {
        int64_t expected = 0;
        if (CAS(self->lock, &expected, self->token))
            return 1;
        if (i % 32 == 31)
            sched_yield();  /* the holder may be descheduled: let it finish */
    }
    return 0;
}

static void group_unlock(GroupMemberCore *self)
{
    STORE_RELEASE(self->lock, (int64_t)0);
}

/* Announces an empty claim at `position`: flow control holds the log from there on. */
static void group_announce(GroupMemberCore *self, int64_t position)
{
    __atomic_store_n(self->end, position, __ATOMIC_RELAXED);
    __atomic_store_n(self->start, position, __ATOMIC_SEQ_CST);
}

static void group_go_idle(GroupMemberCore *self)
{
    STORE_RELEASE(self->start, (int64_t)GROUP_IDLE);
    if (!self->image.closed)
        wake_word(meta_i32(&self->image.g, META_PROGRESS_WAKE),
                  meta_i32(&self->image.g, META_PROGRESS_WAITERS));
}

/* The end of a run of whole messages from `position`: up to `limit` fragments, more only to
 * finish a fragmented message, never past the term. Padding at the end of the term joins the
 * run. `*bad` is set if a frame length is out of bounds (stale or corrupt). Not the readers'
 * next_frame (image.c): this runs before the claim, without the lock, so a bad length may be a
 * stale read of bytes another member already claimed; group_claim raises only if the group
 * position has not moved meanwhile. */
static int64_t group_scan(GroupMemberCore *self, int64_t position, long limit, int *bad)
{
    const LogGeometry *g = &self->image.g;
    int32_t start = (int32_t)(position & (g->term_length - 1));
    uint8_t *term = term_at(g, (int)((position >> g->position_bits) % PARTITION_COUNT));
    int32_t offset = start, run_end = start;
    long fragments = 0;
    *bad = 0;
    while (offset < g->term_length) {
        int32_t length = LOAD_ACQUIRE((int32_t *)(term + offset));
        if (length <= 0)
            break;
        if (length < HEADER_LENGTH ||
            (int64_t)offset + ALIGN((int64_t)length, FRAME_ALIGNMENT) > g->term_length) {
            *bad = 1;
            break;
        }
        uint8_t *frame = term + offset;
        offset += (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        if (rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD) {
            run_end = offset;
            continue;
        }
        fragments++;
        if (frame[FLAGS_OFFSET] & END_FLAG) {
            run_end = offset;
            if (fragments >= limit)
                break;
        }
    }
    return position + (run_end - start);
}

/* Claims the orphan if there is one: 1 when this member now owns it. */
static int group_take_orphan(GroupMemberCore *self)
{
    int64_t start = LOAD_ACQUIRE(self->orphan_start);
    if (start == GROUP_IDLE)
        return 0;
    int64_t end = LOAD_ACQUIRE(self->orphan_end);
    group_announce(self, start);
    if (!group_lock(self)) {
        STORE_RELEASE(self->start, (int64_t)GROUP_IDLE);
        return 0;
    }
    int taken = LOAD_ACQUIRE(self->orphan_start) == start;
    if (taken) {
        STORE_RELEASE(self->end, end);
        STORE_RELEASE(self->orphan_start, (int64_t)GROUP_IDLE);
        /* its first message is the one the departed member may have been handling */
        self->handed_on = 1;
    }
    group_unlock(self);
    if (!taken)
        STORE_RELEASE(self->start, (int64_t)GROUP_IDLE);
    return taken;
}

/* Claims a new run at the group position: 1 when claimed, 0 when there is nothing (or the
 * lock stayed busy), -1 with an exception for a corrupt log. */
static int group_claim(GroupMemberCore *self, long limit)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        int64_t position = LOAD_ACQUIRE(self->image.position);
        group_announce(self, position);
        int bad;
        int64_t end = group_scan(self, position, limit, &bad);
        if (end == position) {
            STORE_RELEASE(self->start, (int64_t)GROUP_IDLE);
            if (bad && LOAD_ACQUIRE(self->image.position) == position) {
                PyErr_Format(PyExc_RuntimeError, "corrupt log: bad frame at group position "
                             "%lld", (long long)position);
                return -1;
            }
            return 0;
        }
        if (!group_lock(self))
            break;
        int claimed = LOAD_ACQUIRE(self->image.position) == position;
        if (claimed) {
            STORE_RELEASE(self->end, end);
            STORE_RELEASE(self->image.position, end);
        }
        group_unlock(self);
        if (claimed)
            return 1;
    }
    STORE_RELEASE(self->start, (int64_t)GROUP_IDLE);
    return 0;
}

/* The committed length of the claimed frame at term offset `offset` (position `position`), or
 * -1 with RuntimeError when it is no longer the claim's: the writer lapped this member. */
static int32_t claimed_length(ImageCore *image, const uint8_t *frame, int32_t offset,
                              int64_t position)
{
    int32_t length = LOAD_ACQUIRE((const int32_t *)frame);
    if (frame_ok(image, frame, offset, length, position))
        return length;
    if (!PyErr_Occurred())
        PyErr_SetString(PyExc_RuntimeError, "a claimed message was overwritten: the writer "
                        "lapped this member (it was dropped as dead)");
    return -1;
}

/* Hands the fragments of this member's claim to the handler, moving the record's start past
 * each whole message. Returns the fragments delivered, or -1 with an exception. */
static long group_deliver(GroupMemberCore *self, PyObject *handler)
{
    ImageCore *image = &self->image;
    const LogGeometry *g = &image->g;
    int64_t position = LOAD_ACQUIRE(self->start);
    int64_t end = LOAD_ACQUIRE(self->end);
    long fragments = 0;
    int failed = 0;
    while (position < end && !image->closed) {
        int32_t offset = (int32_t)(position & (g->term_length - 1));
        uint8_t *frame = term_at(g, (int)((position >> g->position_bits) % PARTITION_COUNT)) +
                         offset;
        int32_t length = claimed_length(image, frame, offset, position);
        if (length < 0)
            return -1;
        position += ALIGN(length, FRAME_ALIGNMENT);
        if (rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD)
            continue;
        int last = (frame[FLAGS_OFFSET] & END_FLAG) != 0;
        if (!failed) {
            fragments++;
            PyObject *r = deliver(image, handler, frame, length);
            if (r == large_gone) {
                Py_DECREF(r);
                r = NULL;
                PyErr_SetString(PyExc_RuntimeError, "a claimed large message's block was "
                                "freed: this member was dropped as dead");
            }
            if (r == NULL)
                failed = 1;  /* the message counts as done: skip its other fragments */
            else
                Py_DECREF(r);
        }
        if (last) {
            self->handed_on = 0;
            STORE_RELEASE(self->start, position >= end ? (int64_t)GROUP_IDLE : position);
            if (failed || image->closed || position >= end)
                break;  /* once closed the log may be gone: the record keeps the rest */
        }
    }
    if (position >= end && !image->closed)
        group_go_idle(self);
    return failed ? -1 : fragments;
}

/* Makes sure this member holds a claim: the rest of its own, else the orphan, else a new run
 * of up to `limit` fragments. 1 when it holds one, 0 when there is nothing to claim, -1 with
 * an exception for a corrupt log. */
static int group_hold_claim(GroupMemberCore *self, long limit)
{
    int64_t start = LOAD_ACQUIRE(self->start);
    if (start != GROUP_IDLE && start < LOAD_ACQUIRE(self->end))
        return 1;
    int claimed = group_take_orphan(self);
    return claimed ? claimed : group_claim(self, limit);
}

/* The request/reply path (calls.c) claims and answers one message at a time without a
 * Python call per fragment: group_next_message finds the next message of this member's claim
 * (claiming one when it holds none) and group_message_done marks it done once answered, as
 * group_deliver does when a handler returns.
 *
 * 1 with *payload and *length the message's payload, *next the position past it: an
 * unfragmented message is read in the log; a fragmented one is put together into a new bytes
 * object, *assembled (the caller's reference; NULL otherwise), that *payload points into.
 * 2 when the next message is large or not a whole message (the caller delivers it with
 * poll(handler, 1), which handles both); 0 when there is nothing to claim; -1 with an
 * exception for a corrupt or lapped log. *handed_on: it heads a claim handed on from a member
 * that left. */
int group_next_message(PyObject *member, const uint8_t **payload, int32_t *length,
                       int64_t *next, int *handed_on, PyObject **assembled)
{
    *assembled = NULL;
    GroupMemberCore *self = (GroupMemberCore *)member;
    ImageCore *image = &self->image;
    if (image->closed)
        return 0;
    int held = group_hold_claim(self, 1);
    if (held <= 0)
        return held;
    const LogGeometry *g = &image->g;
    int64_t position = LOAD_ACQUIRE(self->start);
    int64_t end = LOAD_ACQUIRE(self->end);
    while (position < end) {
        int32_t offset = (int32_t)(position & (g->term_length - 1));
        uint8_t *term = term_at(g, (int)((position >> g->position_bits) % PARTITION_COUNT));
        uint8_t *frame = term + offset;
        int32_t frame_length = claimed_length(image, frame, offset, position);
        if (frame_length < 0)
            return -1;
        if (rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD) {  /* padding joins the claim */
            position += ALIGN(frame_length, FRAME_ALIGNMENT);
            STORE_RELEASE(self->start, position >= end ? (int64_t)GROUP_IDLE : position);
            if (position >= end) {
                group_go_idle(self);
                return 0;
            }
            continue;
        }
        uint8_t flags = frame[FLAGS_OFFSET];
        *handed_on = self->handed_on;
        if (!(flags & BEGIN_FLAG) || IS_REFERENCE(flags))
            return 2;
        if (!(flags & END_FLAG)) {
            int32_t stop;
            Py_ssize_t total = message_extent(image, term, offset, position, &stop);
            if (total == -3)
                return -1;
            if (total < 0 || position + (stop - offset) > end)
                return 2;  /* not one whole message of the claim: poll(handler, 1) says why */
            *assembled = gather_fragments(term, offset, stop, total);
            if (*assembled == NULL)
                return -1;
            *payload = (const uint8_t *)PyBytes_AS_STRING(*assembled);
            *length = (int32_t)total;
            *next = position + (stop - offset);
            return 1;
        }
        *payload = frame + HEADER_LENGTH;
        *length = frame_length - HEADER_LENGTH;
        *next = position + ALIGN(frame_length, FRAME_ALIGNMENT);
        return 1;
    }
    return 0;
}

/* Marks the message group_next_message returned done: the claim's start moves to `next`. */
void group_message_done(PyObject *member, int64_t next)
{
    GroupMemberCore *self = (GroupMemberCore *)member;
    self->handed_on = 0;
    int64_t end = LOAD_ACQUIRE(self->end);
    STORE_RELEASE(self->start, next >= end ? (int64_t)GROUP_IDLE : next);
    if (next >= end && !self->image.closed)
        group_go_idle(self);
}

/* take() -> bytes | None: the next whole message of this member's claim, copied out and done
 * (claiming one message when the member holds no claim); None when there is nothing to claim.
 * A claim starts and ends at message boundaries, in one term, so a fragmented message's
 * fragments lie one after another in it; a fragment without its first is skipped, as
 * FragmentAssembler skips it. */
static PyObject *group_take(GroupMemberCore *self, PyObject *Py_UNUSED(ignored))
{
    ImageCore *image = &self->image;
    if (image->closed)
        Py_RETURN_NONE;
    int held = group_hold_claim(self, 1);
    if (held <= 0)
        return held < 0 ? NULL : Py_NewRef(Py_None);
    const LogGeometry *g = &image->g;
    int64_t position = LOAD_ACQUIRE(self->start);
    int64_t end = LOAD_ACQUIRE(self->end);
    uint8_t *term = term_at(g, (int)((position >> g->position_bits) % PARTITION_COUNT));
    int32_t first = -1;       /* term offset of the message's first fragment */
    Py_ssize_t total = 0;     /* its payload bytes so far */
    PyObject *message = NULL;
    while (position < end && message == NULL) {
        int32_t offset = (int32_t)(position & (g->term_length - 1));
        uint8_t *frame = term + offset;
        int32_t length = LOAD_ACQUIRE((int32_t *)frame);
        if (!frame_ok(image, frame, offset, length, position)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "a claimed message was overwritten: the "
                                "writer lapped this member (it was dropped as dead)");
            return NULL;
        }
        position += ALIGN(length, FRAME_ALIGNMENT);
        if (rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD)
            continue;
        uint8_t flags = frame[FLAGS_OFFSET];
        if (flags & BEGIN_FLAG) {
            first = offset;
            total = 0;
        }
        if (first < 0)
            continue;
        total += length - HEADER_LENGTH;
        if (!(flags & END_FLAG))
            continue;
        if (IS_REFERENCE(flags)) {  /* one reference frame: the message is in its block */
            message = large_bytes(image, frame, length);
            if (message == Py_None) {
                Py_CLEAR(message);
                PyErr_SetString(PyExc_RuntimeError, "a claimed large message's block was "
                                "freed: this member was dropped as dead");
            } else if (message == NULL && PyErr_ExceptionMatches(PyExc_ValueError)) {
                /* a reference no writer made (CorruptReferenceError): the message is done,
                 * the error raised once, as poll does */
                self->handed_on = 0;
                STORE_RELEASE(self->start, position >= end ? (int64_t)GROUP_IDLE : position);
                if (position >= end)
                    group_go_idle(self);
            }
            if (message == NULL)
                return NULL;
            break;
        }
        message = PyBytes_FromStringAndSize(NULL, total);
        if (message == NULL)
            return NULL;
        char *out = PyBytes_AS_STRING(message);
        for (int32_t at = first; at <= offset;) {
            int32_t frame_length = rd_i32(term + at);
            memcpy(out, term + at + HEADER_LENGTH, (size_t)(frame_length - HEADER_LENGTH));
            out += frame_length - HEADER_LENGTH;
            at += (int32_t)ALIGN(frame_length, FRAME_ALIGNMENT);
        }
    }
    self->handed_on = 0;  /* the message is done as take returns it */
    STORE_RELEASE(self->start, position >= end ? (int64_t)GROUP_IDLE : position);
    if (position >= end)
        group_go_idle(self);
    return message != NULL ? message : Py_NewRef(Py_None);
}

/* poll(handler, fragment_limit) -> fragments: finish this member's claim, else take the
 * orphan, else claim up to fragment_limit fragments (whole messages) at the group position. */
static PyObject *group_poll(GroupMemberCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "poll(handler, fragment_limit)");
        return NULL;
    }
    long limit = PyLong_AsLong(args[1]);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (self->image.closed || limit <= 0)
        return PyLong_FromLong(0);
    int held = group_hold_claim(self, limit);
    if (held <= 0)
        return held < 0 ? NULL : PyLong_FromLong(0);
    long fragments = group_deliver(self, args[0]);
    return fragments < 0 ? NULL : PyLong_FromLong(fragments);
}

static PyObject *group_refuse(GroupMemberCore *self, PyObject *args)
{
    PyErr_SetString(PyExc_TypeError, "a group member delivers only with poll(); controlled "
                    "and batch polls would let a claim be split across members");
    return NULL;
}

static PyObject *group_get_claim(GroupMemberCore *self, void *c)
{
    return Py_BuildValue("(LL)", (long long)LOAD_ACQUIRE(self->start),
                         (long long)LOAD_ACQUIRE(self->end));
}

static PyObject *group_get_handed_on(GroupMemberCore *self, void *c)
{ return PyBool_FromLong(self->handed_on); }

static PyObject *group_get_position(GroupMemberCore *self, void *c)
{ return PyLong_FromLongLong(LOAD_ACQUIRE(self->image.position)); }

static int group_init(GroupMemberCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"log_buffer", "term_length", "initial_term_id", "counters",
                             "group_offset", "claim_offset", "orphan_offset", "token", NULL};
    PyObject *log, *counters;
    int term_length, initial_term_id;
    Py_ssize_t group_offset, claim_offset, orphan_offset;
    long long token;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!iiO!nnnL", kwlist, &AtomicBufferType, &log,
                                     &term_length, &initial_term_id, &AtomicBufferType,
                                     &counters, &group_offset, &claim_offset, &orphan_offset,
                                     &token))
        return -1;
    if (token <= 0) {
        PyErr_Format(PyExc_ValueError, "lock token %lld must be positive", token);
        return -1;
    }
    PyObject *base_args = Py_BuildValue("(OiiOn)", log, term_length, initial_term_id, counters,
                                        group_offset);
    if (base_args == NULL)
        return -1;
    int r = ImageCoreType.tp_init((PyObject *)self, base_args, NULL);
    Py_DECREF(base_args);
    if (r < 0)
        return -1;
    if ((self->lock = position_ptr(counters, group_offset + GROUP_SECOND_WORD)) == NULL ||
        (self->start = position_ptr(counters, claim_offset)) == NULL ||
        (self->end = position_ptr(counters, claim_offset + GROUP_SECOND_WORD)) == NULL ||
        (self->orphan_start = position_ptr(counters, orphan_offset)) == NULL ||
        (self->orphan_end = position_ptr(counters, orphan_offset + GROUP_SECOND_WORD)) == NULL)
        return -1;
    self->token = token;
    return 0;
}

static PyGetSetDef group_getset[] = {
    {"position", (getter)group_get_position, NULL,
     "the group's claim position: everything before it has been claimed by a member", NULL},
    {"claim", (getter)group_get_claim, NULL,
     "this member's claim record (start, end): it owns [start, end) while start < end", NULL},
    {"handed_on", (getter)group_get_handed_on, NULL,
     "True while the handler gets the first message of a claim handed on from a member that "
     "left: that member may have been handling it when it went", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef group_methods[] = {
    {"poll", (PyCFunction)(void (*)(void))group_poll, METH_FASTCALL,
     "poll(handler, fragment_limit) -> int\n\nDeliver this member's claim to handler(buffer, "
     "header): the rest of an unfinished one, else the group's orphan, else a new run of whole "
     "messages (up to fragment_limit fragments, more to finish a fragmented message). Each "
     "message is done once its last fragment's handler returns (or raises: the exception "
     "propagates, the rest of the claim stays this member's). Returns the fragments."},
    {"take", (PyCFunction)group_take, METH_NOARGS,
     "take() -> bytes | None\n\nThe next whole message of this member's claim, copied out and "
     "done (claiming one message when it holds no claim); None when there is nothing to "
     "claim."},
    {"controlled_poll", (PyCFunction)group_refuse, METH_VARARGS, NULL},
    {"_scan", (PyCFunction)group_refuse, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

PyTypeObject GroupMemberCoreType = {
    /* Py_TPFLAGS_HAVE_GC, dealloc, traverse and clear are inherited from ImageCore */
    NATIVE_TYPE_HEAD("shmbus.shm._native.GroupMemberCore", GroupMemberCore,
                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
                     "One member of a subscription group on one log: claims and delivers "
                     "whole messages no other member gets."),
    .tp_base = &ImageCoreType,
    .tp_init = (initproc)group_init,
    .tp_methods = group_methods,
    .tp_getset = group_getset,
};
