/*
 * shmbus.shm._native: the only code that touches memory another process writes concurrently.
 *
 *   AtomicBuffer      bounds-checked plain/acquire/release/atomic access over any writable buffer
 *                     (Agrona's AtomicBuffer): a bad offset raises IndexError, never crashes.
 *   PublicationCore   the term appender for exclusive (one writer) and concurrent (many threads
 *                     and processes) publications: offer, gather, offer_many, claim/commit/abort,
 *                     end-of-term padding and log rotation.
 *   ImageCore         the term reader: poll, controlled_poll and the batch scan.
 *   Header            a copy of one frame's 32-byte header, handed to fragment handlers.
 *
 * Log buffer layout (see shmbus/log_buffer.py for the Python mirror of these offsets):
 *   term 0 | term 1 | term 2 | metadata (4096 bytes)
 * Frame header (little-endian, the wire DATA header of Aeron):
 *   0 frame_length i32 | 4 version u8 | 5 flags u8 | 6 type u16 | 8 term_offset i32 |
 *   12 session_id i32 | 16 stream_id i32 | 20 term_id i32 | 24 reserved_value i64
 *
 * Memory ordering: a frame is published by a release store of its positive length; readers load
 * the length with acquire and never look past a length <= 0. Concurrent appenders reserve space
 * with fetch-add on the active term's tail counter and rotate terms with compare-and-set.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- atomics (gcc/clang builtins; x86-64 and aarch64) ------------------------------------ */

#define LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define CAS(p, expected_ptr, desired) \
    __atomic_compare_exchange_n((p), (expected_ptr), (desired), 0, __ATOMIC_SEQ_CST, \
                                __ATOMIC_SEQ_CST)

/* ---- layout constants ---------------------------------------------------------------------- */

#define HEADER_LENGTH 32
#define FRAME_ALIGNMENT 32
#define PARTITION_COUNT 3
#define LOG_META_DATA_LENGTH 4096

#define FRAME_LENGTH_OFFSET 0
#define VERSION_OFFSET 4
#define FLAGS_OFFSET 5
#define TYPE_OFFSET 6
#define TERM_OFFSET_OFFSET 8
#define SESSION_ID_OFFSET 12
#define STREAM_ID_OFFSET 16
#define TERM_ID_OFFSET 20
#define RESERVED_VALUE_OFFSET 24

#define HDR_TYPE_PAD 0
#define HDR_TYPE_DATA 1
#define BEGIN_FLAG 0x80
#define END_FLAG 0x40
#define UNFRAGMENTED 0xC0

/* metadata offsets, relative to the start of the metadata section */
#define META_TAIL_COUNTERS 0
#define META_ACTIVE_TERM_COUNT 24
#define META_END_OF_STREAM_POSITION 128
#define META_IS_CONNECTED 136
#define META_INITIAL_TERM_ID 264    /* i32, written once when the log is created */
/* flow control and wake-ups (see shmbus/shm/log_buffer.py for the diagram) */
#define META_FC_LOCK 512            /* i64: pid of the process cleaning and raising pub-lmt */
#define META_FC_CLEAN_POSITION 520  /* i64: the log is zero from here on (behind consumers) */
#define META_DATA_WAKE 576          /* i32 futex word: bumped by writers when readers sleep */
#define META_DATA_WAITERS 580       /* i32: readers asleep on META_DATA_WAKE */
#define META_PROGRESS_WAKE 640      /* i32 futex word: bumped by readers when writers sleep */
#define META_PROGRESS_WAITERS 644   /* i32: writers asleep on META_PROGRESS_WAKE */
#define META_FC_VERSION 704         /* i32 seqlock over the counted set: odd while written */
#define META_FC_COUNT 708           /* i32: counters in the set (0: nobody counts) */
#define META_FC_WINDOW 712          /* i32: pub-lmt = slowest counted position + window */
#define META_FC_CLEAN_LAG 716       /* i32: bytes kept uncleaned behind the slowest (retransmits) */
#define META_FC_COUNTER_IDS 1024    /* i32[FC_MAX_COUNTED]: the counted position counters */
#define FC_MAX_COUNTED 768
#define COUNTER_LENGTH 64

/* publication result codes, Aeron's values */
#define NOT_CONNECTED (-1)
#define BACK_PRESSURED (-2)
#define ADMIN_ACTION (-3)
#define CLOSED (-4)
#define MAX_POSITION_EXCEEDED (-5)

/* controlled poll actions, Aeron's order */
#define ACTION_ABORT 1
#define ACTION_BREAK 2
#define ACTION_COMMIT 3
#define ACTION_CONTINUE 4

#define ALIGN(v, a) (((v) + ((a) - 1)) & ~((a) - 1))

static inline int32_t rd_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline int64_t rd_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline void wr_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static inline void wr_i64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }
static inline uint16_t rd_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static inline int32_t term_id_of(int64_t raw_tail) { return (int32_t)(raw_tail >> 32); }
static inline int64_t term_offset_of(int64_t raw_tail) { return raw_tail & 0xFFFFFFFFLL; }
static inline int64_t pack_tail(int32_t term_id, int32_t offset)
{
    return (int64_t)(((uint64_t)(uint32_t)term_id << 32) | (uint32_t)offset);
}

/* term count between two term ids, correct across the int32 wrap */
static inline int64_t term_count_between(int32_t term_id, int32_t initial_term_id)
{
    return (int64_t)(int32_t)((uint32_t)term_id - (uint32_t)initial_term_id);
}

/* ====================================================================================== */
/* AtomicBuffer                                                                            */
/* ====================================================================================== */

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    uint8_t *data;
    Py_ssize_t capacity;
    int has_view;
} AtomicBuffer;

static PyTypeObject AtomicBufferType;

static int atomic_buffer_init(AtomicBuffer *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", NULL};
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &obj))
        return -1;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->has_view = 1;
    self->data = (uint8_t *)self->view.buf;
    self->capacity = self->view.len;
    return 0;
}

static void atomic_buffer_dealloc(AtomicBuffer *self)
{
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ab_check(AtomicBuffer *self, Py_ssize_t offset, Py_ssize_t length, Py_ssize_t align)
{
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "AtomicBuffer is closed");
        return -1;
    }
    if (offset < 0 || length < 0 || offset > self->capacity - length) {
        PyErr_Format(PyExc_IndexError,
                     "offset %zd length %zd is outside the buffer of capacity %zd", offset, length,
                     self->capacity);
        return -1;
    }
    if (align > 1 && (((uintptr_t)(self->data + offset)) % (uintptr_t)align) != 0) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not %zd-byte aligned for an atomic access",
                     offset, align);
        return -1;
    }
    return 0;
}

#define AB_OFFSET_ARG(name)                                   \
    Py_ssize_t name;                                          \
    if (!PyArg_ParseTuple(args, "n", &name)) return NULL;

static PyObject *ab_get_int32(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 4, 1)) return NULL;
    return PyLong_FromLong(rd_i32(self->data + off));
}

static PyObject *ab_get_int64(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 8, 1)) return NULL;
    return PyLong_FromLongLong(rd_i64(self->data + off));
}

static PyObject *ab_get_int32_acquire(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 4, 4)) return NULL;
    return PyLong_FromLong(LOAD_ACQUIRE((int32_t *)(self->data + off)));
}

static PyObject *ab_get_int64_acquire(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 8, 8)) return NULL;
    return PyLong_FromLongLong(LOAD_ACQUIRE((int64_t *)(self->data + off)));
}

static PyObject *ab_put_int32(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int v;
    if (!PyArg_ParseTuple(args, "ni", &off, &v)) return NULL;
    if (ab_check(self, off, 4, 1)) return NULL;
    wr_i32(self->data + off, v);
    Py_RETURN_NONE;
}

static PyObject *ab_put_int64(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long v;
    if (!PyArg_ParseTuple(args, "nL", &off, &v)) return NULL;
    if (ab_check(self, off, 8, 1)) return NULL;
    wr_i64(self->data + off, v);
    Py_RETURN_NONE;
}

static PyObject *ab_put_int32_release(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int v;
    if (!PyArg_ParseTuple(args, "ni", &off, &v)) return NULL;
    if (ab_check(self, off, 4, 4)) return NULL;
    STORE_RELEASE((int32_t *)(self->data + off), (int32_t)v);
    Py_RETURN_NONE;
}

static PyObject *ab_put_int64_release(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long v;
    if (!PyArg_ParseTuple(args, "nL", &off, &v)) return NULL;
    if (ab_check(self, off, 8, 8)) return NULL;
    STORE_RELEASE((int64_t *)(self->data + off), (int64_t)v);
    Py_RETURN_NONE;
}

static PyObject *ab_get_and_add_int32(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int v;
    if (!PyArg_ParseTuple(args, "ni", &off, &v)) return NULL;
    if (ab_check(self, off, 4, 4)) return NULL;
    return PyLong_FromLong(FETCH_ADD((int32_t *)(self->data + off), (int32_t)v));
}

static PyObject *ab_get_and_add_int64(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long v;
    if (!PyArg_ParseTuple(args, "nL", &off, &v)) return NULL;
    if (ab_check(self, off, 8, 8)) return NULL;
    return PyLong_FromLongLong(FETCH_ADD((int64_t *)(self->data + off), (int64_t)v));
}

static PyObject *ab_compare_and_set_int32(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int expected, desired;
    if (!PyArg_ParseTuple(args, "nii", &off, &expected, &desired)) return NULL;
    if (ab_check(self, off, 4, 4)) return NULL;
    int32_t e = (int32_t)expected;
    return PyBool_FromLong(CAS((int32_t *)(self->data + off), &e, (int32_t)desired));
}

static PyObject *ab_compare_and_set_int64(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long expected, desired;
    if (!PyArg_ParseTuple(args, "nLL", &off, &expected, &desired)) return NULL;
    if (ab_check(self, off, 8, 8)) return NULL;
    int64_t e = (int64_t)expected;
    return PyBool_FromLong(CAS((int64_t *)(self->data + off), &e, (int64_t)desired));
}

static PyObject *ab_get_bytes(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off, len;
    if (!PyArg_ParseTuple(args, "nn", &off, &len)) return NULL;
    if (ab_check(self, off, len, 1)) return NULL;
    return PyBytes_FromStringAndSize((const char *)self->data + off, len);
}

static PyObject *ab_put_bytes(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; Py_buffer src;
    if (!PyArg_ParseTuple(args, "ny*", &off, &src)) return NULL;
    if (ab_check(self, off, src.len, 1)) { PyBuffer_Release(&src); return NULL; }
    memcpy(self->data + off, src.buf, (size_t)src.len);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
}

static PyObject *ab_set_memory(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off, len; int value;
    if (!PyArg_ParseTuple(args, "nni", &off, &len, &value)) return NULL;
    if (ab_check(self, off, len, 1)) return NULL;
    memset(self->data + off, value, (size_t)len);
    Py_RETURN_NONE;
}

static PyObject *ab_release(AtomicBuffer *self, PyObject *Py_UNUSED(ignored))
{
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
        self->data = NULL;
        self->capacity = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *ab_get_capacity(AtomicBuffer *self, void *closure)
{
    return PyLong_FromSsize_t(self->capacity);
}

static PyMethodDef atomic_buffer_methods[] = {
    {"get_int32", (PyCFunction)ab_get_int32, METH_VARARGS, "get_int32(offset) -> int: plain load"},
    {"get_int64", (PyCFunction)ab_get_int64, METH_VARARGS, "get_int64(offset) -> int: plain load"},
    {"get_int32_acquire", (PyCFunction)ab_get_int32_acquire, METH_VARARGS,
     "get_int32_acquire(offset) -> int: load with acquire ordering (offset 4-aligned)"},
    {"get_int64_acquire", (PyCFunction)ab_get_int64_acquire, METH_VARARGS,
     "get_int64_acquire(offset) -> int: load with acquire ordering (offset 8-aligned)"},
    {"put_int32", (PyCFunction)ab_put_int32, METH_VARARGS, "put_int32(offset, value): plain store"},
    {"put_int64", (PyCFunction)ab_put_int64, METH_VARARGS, "put_int64(offset, value): plain store"},
    {"put_int32_release", (PyCFunction)ab_put_int32_release, METH_VARARGS,
     "put_int32_release(offset, value): store with release ordering"},
    {"put_int64_release", (PyCFunction)ab_put_int64_release, METH_VARARGS,
     "put_int64_release(offset, value): store with release ordering"},
    {"get_and_add_int32", (PyCFunction)ab_get_and_add_int32, METH_VARARGS,
     "get_and_add_int32(offset, delta) -> previous value (atomic)"},
    {"get_and_add_int64", (PyCFunction)ab_get_and_add_int64, METH_VARARGS,
     "get_and_add_int64(offset, delta) -> previous value (atomic)"},
    {"compare_and_set_int32", (PyCFunction)ab_compare_and_set_int32, METH_VARARGS,
     "compare_and_set_int32(offset, expected, desired) -> bool (atomic)"},
    {"compare_and_set_int64", (PyCFunction)ab_compare_and_set_int64, METH_VARARGS,
     "compare_and_set_int64(offset, expected, desired) -> bool (atomic)"},
    {"get_bytes", (PyCFunction)ab_get_bytes, METH_VARARGS, "get_bytes(offset, length) -> bytes"},
    {"put_bytes", (PyCFunction)ab_put_bytes, METH_VARARGS, "put_bytes(offset, data)"},
    {"set_memory", (PyCFunction)ab_set_memory, METH_VARARGS,
     "set_memory(offset, length, value): fill with a byte value"},
    {"release", (PyCFunction)ab_release, METH_NOARGS,
     "release(): drop the underlying buffer; later accesses raise ValueError"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef atomic_buffer_getset[] = {
    {"capacity", (getter)ab_get_capacity, NULL, "length of the buffer in bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject AtomicBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.AtomicBuffer",
    .tp_basicsize = sizeof(AtomicBuffer),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "AtomicBuffer(buffer): bounds-checked atomic access over a writable buffer.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)atomic_buffer_init,
    .tp_dealloc = (destructor)atomic_buffer_dealloc,
    .tp_methods = atomic_buffer_methods,
    .tp_getset = atomic_buffer_getset,
};

/* Resolve (AtomicBuffer, offset) to an aligned int64 pointer, keeping a reference. */
static int64_t *position_ptr(PyObject *buffer, Py_ssize_t offset)
{
    if (!PyObject_TypeCheck(buffer, &AtomicBufferType)) {
        PyErr_SetString(PyExc_TypeError, "a position must live in an AtomicBuffer");
        return NULL;
    }
    if (ab_check((AtomicBuffer *)buffer, offset, 8, 8)) return NULL;
    return (int64_t *)(((AtomicBuffer *)buffer)->data + offset);
}

/* ====================================================================================== */
/* Log geometry shared by appender and reader                                            */
/* ====================================================================================== */

typedef struct {
    uint8_t *terms;           /* start of term 0 */
    uint8_t *meta;            /* start of the metadata section */
    int32_t term_length;
    int position_bits;        /* log2(term_length) */
    int32_t initial_term_id;
} LogGeometry;

static int geometry_from(AtomicBuffer *log, int32_t term_length, int32_t initial_term_id,
                         LogGeometry *g)
{
    if (term_length < 65536 || (term_length & (term_length - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "term length %d is not a power of two >= 65536",
                     term_length);
        return -1;
    }
    if (ab_check(log, 0, (Py_ssize_t)term_length * PARTITION_COUNT + LOG_META_DATA_LENGTH, 8))
        return -1;
    g->terms = log->data;
    g->meta = log->data + (Py_ssize_t)term_length * PARTITION_COUNT;
    g->term_length = term_length;
    g->position_bits = __builtin_ctz((unsigned)term_length);
    g->initial_term_id = initial_term_id;
    return 0;
}

static inline uint8_t *term_at(const LogGeometry *g, int index)
{
    return g->terms + (Py_ssize_t)index * g->term_length;
}

static inline int64_t *tail_ptr(const LogGeometry *g, int index)
{
    return (int64_t *)(g->meta + META_TAIL_COUNTERS + 8 * index);
}

static inline int32_t *active_term_count_ptr(const LogGeometry *g)
{
    return (int32_t *)(g->meta + META_ACTIVE_TERM_COUNT);
}

static inline int64_t term_begin_position(const LogGeometry *g, int32_t term_id)
{
    return term_count_between(term_id, g->initial_term_id) << g->position_bits;
}

/* ====================================================================================== */
/* Wake-ups: futex words in shared memory, signalled only when someone sleeps              */
/* ====================================================================================== */

/*
 * A sleeper increments the waiters count, reads the word, re-checks its condition and only
 * then sleeps on the word's value; a signaller makes its change visible, then (after a full
 * fence) reads the waiters count and, if anyone sleeps, bumps the word and wakes them. Either
 * the signaller sees the sleeper or the sleeper sees the change: no lost wake-up, and no
 * syscall on the signalling side while nobody sleeps.
 */
static inline int32_t *meta_i32(const LogGeometry *g, int offset)
{
    return (int32_t *)(g->meta + offset);
}

static inline int64_t *meta_i64(const LogGeometry *g, int offset)
{
    return (int64_t *)(g->meta + offset);
}

static void wake_word(int32_t *word, int32_t *waiters)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiters, __ATOMIC_RELAXED) > 0) {
        __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* Sleeps on up to `count` words until one changes from its expected value or `timeout_ns`
 * passes (< 0: forever). The GIL must be released by the caller. */
/* futex_waitv(2) (Linux 5.16), declared here since libc headers may predate it */
struct wait_entry {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};
#define WAIT_ENTRY_U32 0x02
#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

static void wait_words(int32_t **words, const int32_t *expected, int count, int64_t timeout_ns)
{
    struct wait_entry waiters[128];
    if (count > 128) count = 128;
    for (int i = 0; i < count; i++) {
        waiters[i].val = (uint32_t)expected[i];
        waiters[i].uaddr = (uintptr_t)words[i];
        waiters[i].flags = WAIT_ENTRY_U32;
        waiters[i].reserved = 0;
    }
    struct timespec deadline, *deadline_ptr = NULL;
    if (timeout_ns >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        int64_t ns = deadline.tv_nsec + timeout_ns % 1000000000LL;
        deadline.tv_sec += (time_t)(timeout_ns / 1000000000LL + ns / 1000000000LL);
        deadline.tv_nsec = (long)(ns % 1000000000LL);
        deadline_ptr = &deadline;
    }
    long r = syscall(SYS_futex_waitv, waiters, (unsigned)count, 0, deadline_ptr,
                     CLOCK_MONOTONIC);
    if (r < 0 && errno == ENOSYS) {
        /* kernels before 5.16: sleep on the first word only, in short slices */
        struct timespec slice = {0, 1000000};
        if (timeout_ns >= 0 && timeout_ns < 1000000) slice.tv_nsec = (long)timeout_ns;
        syscall(SYS_futex, words[0], FUTEX_WAIT, expected[0], &slice, NULL, 0);
    }
}

static int64_t timeout_to_ns(double timeout_s)
{
    if (timeout_s < 0) return -1;
    if (timeout_s > 1e9) return -1;
    return (int64_t)(timeout_s * 1e9);
}

/* ====================================================================================== */
/* IPC flow control: pub-lmt follows the slowest counted position, raised by the publisher  */
/* ====================================================================================== */

/*
 * The driver decides which position counters count (tethered, live subscribers; the sender
 * of a network publication) and publishes their ids in the log metadata under a seqlock.
 * Whoever needs the limit raised (a publisher that reached it, or the driver's timer) reads
 * the counted positions, then, holding the log's flow-control lock (a CAS on META_FC_LOCK
 * holding its pid), zeroes the consumed bytes behind the slowest and raises pub-lmt to the
 * slowest + window. Cleaning precedes the raise, so a writer never enters an unclean term. A
 * holder that dies leaves its pid in the lock; the driver clears a dead holder's lock.
 */

/* Reads the counted set's slowest position. Returns the set version, or -1 when the set is
 * being written or empty (nobody counts). */
static int64_t fc_slowest(const LogGeometry *g, const uint8_t *values, Py_ssize_t values_len,
                          int64_t *slowest)
{
    int32_t version = LOAD_ACQUIRE(meta_i32(g, META_FC_VERSION));
    if (version & 1)
        return -1;
    int32_t count = LOAD_ACQUIRE(meta_i32(g, META_FC_COUNT));
    if (count <= 0 || count > FC_MAX_COUNTED)
        return -1;
    int64_t lowest = INT64_MAX;
    const int32_t *ids = meta_i32(g, META_FC_COUNTER_IDS);
    for (int32_t i = 0; i < count; i++) {
        int32_t id = __atomic_load_n(ids + i, __ATOMIC_RELAXED);
        if (id < 0 || (Py_ssize_t)id * COUNTER_LENGTH + 8 > values_len)
            return -1;
        int64_t p = LOAD_ACQUIRE((const int64_t *)(values + (Py_ssize_t)id * COUNTER_LENGTH));
        if (p < lowest) lowest = p;
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (__atomic_load_n(meta_i32(g, META_FC_VERSION), __ATOMIC_RELAXED) != version)
        return -1;
    *slowest = lowest;
    return version;
}

static int fc_lock(const LogGeometry *g)
{
    int64_t expected = 0;
    return CAS(meta_i64(g, META_FC_LOCK), &expected, (int64_t)getpid());
}

static void fc_unlock(const LogGeometry *g)
{
    STORE_RELEASE(meta_i64(g, META_FC_LOCK), (int64_t)0);
}

/* Zeroes the log from the clean position up to `position`, term by term; the first 8 bytes of
 * each span last, with a release store. Caller holds the lock. */
static void fc_clean_to(const LogGeometry *g, int64_t position)
{
    int64_t *clean_ptr = meta_i64(g, META_FC_CLEAN_POSITION);
    int64_t clean = LOAD_ACQUIRE(clean_ptr);
    int64_t mask = g->term_length - 1;
    while (position > clean) {
        int index = (int)((clean >> g->position_bits) % PARTITION_COUNT);
        int64_t offset = clean & mask;
        int64_t length = position - clean;
        if (length > g->term_length - offset) length = g->term_length - offset;
        uint8_t *start = term_at(g, index) + offset;
        if (length > 8)
            memset(start + 8, 0, (size_t)(length - 8));
        STORE_RELEASE((int64_t *)start, (int64_t)0);
        clean += length;
        STORE_RELEASE(clean_ptr, clean);
    }
}

/* The position the log is written up to (the active term's tail; a half-done rotation counts
 * as the start of the new term). */
static int64_t log_producer_position(const LogGeometry *g)
{
    int32_t count = LOAD_ACQUIRE(active_term_count_ptr(g));
    int64_t raw = LOAD_ACQUIRE(tail_ptr(g, count % PARTITION_COUNT));
    int64_t begin = (int64_t)count << g->position_bits;
    int32_t initial_term_id = LOAD_ACQUIRE(meta_i32(g, META_INITIAL_TERM_ID));
    if (term_count_between(term_id_of(raw), initial_term_id) != count)
        return begin;
    int64_t offset = term_offset_of(raw);
    return begin + (offset < g->term_length ? offset : g->term_length);
}

enum { FC_RAISE = 0, FC_PULL_BACK = 1, FC_CLEAN_ONLY = 2 };

/*
 * Cleans behind `slowest` and, by mode, raises the limit to max(limit, slowest + window),
 * pulls it back to `slowest` exactly (nobody counts any more), or leaves it. `version` >= 0
 * aborts the move when the counted set changed meanwhile. Returns 1 if done, 0 if the lock
 * was busy.
 */
static int fc_advance(const LogGeometry *g, int64_t *limit, int64_t slowest, int mode,
                      int64_t version)
{
    if (!fc_lock(g))
        return 0;
    if (version >= 0 && LOAD_ACQUIRE(meta_i32(g, META_FC_VERSION)) != (int32_t)version) {
        fc_unlock(g);
        return 1;
    }
    /* a position another process wrote is only trusted between 0 and what was written */
    int64_t produced = log_producer_position(g);
    if (slowest > produced) slowest = produced;
    if (slowest < 0) slowest = 0;
    int64_t *clean_ptr = meta_i64(g, META_FC_CLEAN_POSITION);
    /* a reader behind the clean position (flow control taken over mid-stream) must not find
     * stale frames three terms on: clean from it instead */
    if (slowest >= 0 && slowest < LOAD_ACQUIRE(clean_ptr))  /* below 0: nothing consumed */
        STORE_RELEASE(clean_ptr, slowest);
    fc_clean_to(g, slowest - LOAD_ACQUIRE(meta_i32(g, META_FC_CLEAN_LAG)));
    if (mode == FC_PULL_BACK) {
        STORE_RELEASE(limit, slowest);
    } else if (mode == FC_RAISE) {
        int64_t proposed = slowest + LOAD_ACQUIRE(meta_i32(g, META_FC_WINDOW));
        if (proposed > LOAD_ACQUIRE(limit))
            STORE_RELEASE(limit, proposed);
    }
    fc_unlock(g);
    wake_word(meta_i32(g, META_PROGRESS_WAKE), meta_i32(g, META_PROGRESS_WAITERS));
    return 1;
}

/* Raises the limit from the counted set, if that moves it; `producer` is the writer's
 * position. Returns 1 if the limit moved. */
static int fc_raise(const LogGeometry *g, const uint8_t *values, Py_ssize_t values_len,
                    int64_t *limit, int64_t producer)
{
    int64_t slowest;
    int64_t version = fc_slowest(g, values, values_len, &slowest);
    if (version < 0)
        return 0;
    /* readers write their own counters: one beyond the writer (a scribble) must not send
     * cleaning into unread data, nor the limit past what a window allows */
    if (slowest > producer)
        slowest = producer;
    int64_t before = LOAD_ACQUIRE(limit);
    if (slowest + LOAD_ACQUIRE(meta_i32(g, META_FC_WINDOW)) <= before)
        return 0;
    fc_advance(g, limit, slowest, FC_RAISE, version);
    return LOAD_ACQUIRE(limit) > before;
}

/* ====================================================================================== */
/* PublicationCore: the term appender                                                     */
/* ====================================================================================== */

typedef struct {
    PyObject_HEAD
    PyObject *log_buffer;     /* AtomicBuffer over the whole log file */
    PyObject *limit_buffer;   /* AtomicBuffer holding the publication-limit position */
    PyObject *counters_buffer;/* AtomicBuffer of counter values (None: never self-raise) */
    LogGeometry g;
    int64_t *limit;
    int64_t limit_registration; /* the limit counter's registration id while it is ours */
    const uint8_t *values;    /* counter values, to raise the limit from counted positions */
    Py_ssize_t values_len;
    int sleeping;             /* threads of this process asleep in _await_progress */
    uint32_t generation;      /* bumped whenever the sleepers are let go (close, detach, init) */
    int32_t session_id;
    int32_t stream_id;
    int32_t mtu;
    int32_t max_payload;
    int32_t max_message;
    int64_t max_possible_position;
    int exclusive;
    int closed;
    int64_t refusal;          /* what offers return once closed: CLOSED, or NOT_CONNECTED when
                               * detached from a lost driver (see _detach_core) */
    /* exclusive publications only: the single writer's own view of the tail */
    int32_t x_term_offset;
    int32_t x_term_id;
    int32_t x_term_count;
    int64_t x_term_begin_position;
} PublicationCore;

typedef struct {
    const uint8_t *ptr;
    Py_ssize_t len;
} Piece;

/* Copies n bytes out of a list of pieces, advancing the cursor (*pi, *po). */
static void gather_copy(uint8_t *dst, const Piece *pieces, Py_ssize_t *pi, Py_ssize_t *po,
                        Py_ssize_t n)
{
    while (n > 0) {
        Py_ssize_t avail = pieces[*pi].len - *po;
        if (avail == 0) { (*pi)++; *po = 0; continue; }
        Py_ssize_t take = avail < n ? avail : n;
        memcpy(dst, pieces[*pi].ptr + *po, (size_t)take);
        dst += take; *po += take; n -= take;
    }
}

static inline void write_header(PublicationCore *self, uint8_t *frame, int32_t frame_length,
                                uint8_t flags, uint16_t type, int32_t term_offset,
                                int32_t term_id, int64_t reserved_value)
{
    /* The negative length goes in first, so a writer that dies here leaves a frame the reader
     * stops at and the driver can later recognise as blocked. */
    STORE_RELEASE((int32_t *)frame, -frame_length);
    frame[VERSION_OFFSET] = 0;
    frame[FLAGS_OFFSET] = flags;
    memcpy(frame + TYPE_OFFSET, &type, 2);
    wr_i32(frame + TERM_OFFSET_OFFSET, term_offset);
    wr_i32(frame + SESSION_ID_OFFSET, self->session_id);
    wr_i32(frame + STREAM_ID_OFFSET, self->stream_id);
    wr_i32(frame + TERM_ID_OFFSET, term_id);
    wr_i64(frame + RESERVED_VALUE_OFFSET, reserved_value);
}

static inline void write_padding(PublicationCore *self, uint8_t *term, int32_t offset,
                                 int32_t length, int32_t term_id)
{
    write_header(self, term + offset, length, UNFRAGMENTED, HDR_TYPE_PAD, offset, term_id, 0);
    STORE_RELEASE((int32_t *)(term + offset), length);
}

/* Space a message of `length` bytes takes in the term, all fragments included. */
static inline int32_t required_length(const PublicationCore *self, Py_ssize_t length)
{
    if (length <= self->max_payload)
        return (int32_t)ALIGN(length + HEADER_LENGTH, FRAME_ALIGNMENT);
    Py_ssize_t full = length / self->max_payload;
    Py_ssize_t rest = length % self->max_payload;
    Py_ssize_t required = full * ALIGN(self->max_payload + HEADER_LENGTH, FRAME_ALIGNMENT);
    if (rest > 0)
        required += ALIGN(rest + HEADER_LENGTH, FRAME_ALIGNMENT);
    return (int32_t)required;
}

/* Writes one message (maybe fragmented) at term[offset]; the space is already reserved. */
static void write_message(PublicationCore *self, uint8_t *term, int32_t offset, int32_t term_id,
                          const Piece *pieces, Py_ssize_t length, int64_t reserved_value)
{
    Py_ssize_t pi = 0, po = 0;
    if (length <= self->max_payload) {
        int32_t frame_length = (int32_t)length + HEADER_LENGTH;
        write_header(self, term + offset, frame_length, UNFRAGMENTED, HDR_TYPE_DATA, offset,
                     term_id, reserved_value);
        gather_copy(term + offset + HEADER_LENGTH, pieces, &pi, &po, length);
        STORE_RELEASE((int32_t *)(term + offset), frame_length);
        return;
    }
    Py_ssize_t remaining = length;
    uint8_t flags = BEGIN_FLAG;
    while (remaining > 0) {
        Py_ssize_t chunk = remaining < self->max_payload ? remaining : self->max_payload;
        int32_t frame_length = (int32_t)chunk + HEADER_LENGTH;
        if (remaining == chunk)
            flags |= END_FLAG;
        write_header(self, term + offset, frame_length, flags, HDR_TYPE_DATA, offset, term_id,
                     reserved_value);
        gather_copy(term + offset + HEADER_LENGTH, pieces, &pi, &po, chunk);
        STORE_RELEASE((int32_t *)(term + offset), frame_length);
        offset += (int32_t)ALIGN(frame_length, FRAME_ALIGNMENT);
        remaining -= chunk;
        flags = 0;
    }
}

/* Moves the log to the next term (Aeron's rotateLog); safe for concurrent callers. */
static void rotate_log(const LogGeometry *g, int32_t term_count, int32_t term_id)
{
    int32_t next_term_id = (int32_t)((uint32_t)term_id + 1u);
    int32_t next_term_count = term_count + 1;
    int next_index = next_term_count % PARTITION_COUNT;
    int32_t expected_term_id = (int32_t)((uint32_t)next_term_id - PARTITION_COUNT);
    int64_t new_raw_tail = pack_tail(next_term_id, 0);
    int64_t *tail = tail_ptr(g, next_index);
    for (;;) {
        int64_t raw = LOAD_ACQUIRE(tail);
        if (term_id_of(raw) != expected_term_id)
            break;
        if (CAS(tail, &raw, new_raw_tail))
            break;
    }
    int32_t expected_count = term_count;
    CAS(active_term_count_ptr(g), &expected_count, next_term_count);
}

static int64_t back_pressure_status(PublicationCore *self, int64_t position, int32_t length)
{
    if (position + length >= self->max_possible_position)
        return MAX_POSITION_EXCEEDED;
    if (LOAD_ACQUIRE((int32_t *)(self->g.meta + META_IS_CONNECTED)) == 1)
        return BACK_PRESSURED;
    return NOT_CONNECTED;
}

/* A writer that reached its limit raises it from the counted positions, if they allow, and
 * while the limit counter is its own: a process stopped past its liveness may find it freed
 * (its registration id cleared) and given to someone else. */
static inline int64_t current_limit(PublicationCore *self, int64_t position, int64_t limit)
{
    if (position < limit || self->values == NULL ||
        LOAD_ACQUIRE(self->limit + 1) != self->limit_registration)
        return limit;
    fc_raise(&self->g, self->values, self->values_len, self->limit, position);
    return LOAD_ACQUIRE(self->limit);
}

static inline void wake_readers(PublicationCore *self)
{
    wake_word(meta_i32(&self->g, META_DATA_WAKE), meta_i32(&self->g, META_DATA_WAITERS));
}

/* The state a writer sees before appending; see reserve(). */
typedef struct {
    int32_t term_count;
    int32_t term_id;
    int64_t term_offset;      /* may exceed the term length for concurrent writers */
    int64_t position;
    int64_t limit;
} AppendState;

/* Reads the current tail. Returns 0, or ADMIN_ACTION while a rotation is half done. */
static int64_t read_state(PublicationCore *self, AppendState *s)
{
    s->limit = LOAD_ACQUIRE(self->limit);
    if (self->exclusive) {
        s->term_count = self->x_term_count;
        s->term_id = self->x_term_id;
        s->term_offset = self->x_term_offset;
        s->position = self->x_term_begin_position + self->x_term_offset;
        return 0;
    }
    s->term_count = LOAD_ACQUIRE(active_term_count_ptr(&self->g));
    int64_t raw = LOAD_ACQUIRE(tail_ptr(&self->g, s->term_count % PARTITION_COUNT));
    s->term_id = term_id_of(raw);
    s->term_offset = term_offset_of(raw);
    if (term_count_between(s->term_id, self->g.initial_term_id) != s->term_count)
        return ADMIN_ACTION;
    int64_t offset = s->term_offset < self->g.term_length ? s->term_offset : self->g.term_length;
    s->position = term_begin_position(&self->g, s->term_id) + offset;
    return 0;
}

/*
 * Reserves `length` bytes in the active term. On success returns 0 and sets *term_id and
 * *offset; the caller writes frames there. When the reservation does not fit in the term, the
 * rest of the term is padded, the log rotated, and ADMIN_ACTION (or MAX_POSITION_EXCEEDED) is
 * returned; *fit_end receives how far the reservation is usable (for batches).
 */
static int64_t reserve(PublicationCore *self, const AppendState *s, int32_t length,
                       int32_t *term_id, int32_t *offset)
{
    const LogGeometry *g = &self->g;
    int index = s->term_count % PARTITION_COUNT;
    uint8_t *term = term_at(g, index);
    int64_t start;
    if (self->exclusive) {
        *term_id = s->term_id;
        start = s->term_offset;
        if (start + length <= g->term_length) {
            self->x_term_offset = (int32_t)(start + length);
            STORE_RELEASE(tail_ptr(g, index), pack_tail(*term_id, self->x_term_offset));
            *offset = (int32_t)start;
            return 0;
        }
    } else {
        int64_t raw = FETCH_ADD(tail_ptr(g, index), (int64_t)length);
        *term_id = term_id_of(raw);
        start = term_offset_of(raw);
        if (start + length <= g->term_length) {
            *offset = (int32_t)start;
            return 0;
        }
    }
    /* end of term: whoever's reservation covers the end pads it */
    if (start < g->term_length)
        write_padding(self, term, (int32_t)start, (int32_t)(g->term_length - start), *term_id);
    int64_t term_end_position = term_begin_position(g, *term_id) + g->term_length;
    if (term_end_position >= self->max_possible_position)
        return MAX_POSITION_EXCEEDED;
    if (self->exclusive) {
        STORE_RELEASE(tail_ptr(g, index), pack_tail(*term_id, g->term_length));
        rotate_log(g, s->term_count, *term_id);
        self->x_term_count = s->term_count + 1;
        self->x_term_id = (int32_t)((uint32_t)*term_id + 1u);
        self->x_term_offset = 0;
        self->x_term_begin_position = term_end_position;
    } else {
        rotate_log(g, s->term_count, *term_id);
    }
    return ADMIN_ACTION;
}

/* Appends one message given as pieces. Returns the new position or a negative code. */
static int64_t append_pieces(PublicationCore *self, const Piece *pieces, Py_ssize_t length,
                             int64_t reserved_value)
{
    if (self->closed)
        return self->refusal;
    AppendState s;
    int64_t status = read_state(self, &s);
    if (status < 0)
        return status;
    int32_t required = required_length(self, length);
    s.limit = current_limit(self, s.position, s.limit);
    if (s.position >= s.limit)
        return back_pressure_status(self, s.position, required);
    int32_t term_id, offset;
    status = reserve(self, &s, required, &term_id, &offset);
    if (status < 0)
        return status;
    write_message(self, term_at(&self->g, s.term_count % PARTITION_COUNT), offset, term_id,
                  pieces, length, reserved_value);
    wake_readers(self);
    return term_begin_position(&self->g, term_id) + offset + required;
}

static int check_length(PublicationCore *self, Py_ssize_t length)
{
    if (length > self->max_message) {
        PyErr_Format(PyExc_ValueError,
                     "message of %zd bytes exceeds the max message length of %d bytes "
                     "(min(term length / 8, 16 MiB))",
                     length, self->max_message);
        return -1;
    }
    return 0;
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

/* offer(*buffers, reserved_value=0) -> int: one message made of the buffers, concatenated. */
static PyObject *pub_offer(PublicationCore *self, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames)
{
    int64_t reserved;
    if (parse_reserved(kwnames, args, nargs, &reserved) < 0)
        return NULL;
    if (nargs == 1) {
        Py_buffer view;
        if (get_message_buffer(args[0], &view) < 0)
            return NULL;
        if (check_length(self, view.len) < 0) { PyBuffer_Release(&view); return NULL; }
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
    if (check_length(self, total) < 0)
        goto done;
    result = PyLong_FromLongLong(append_pieces(self, pieces, total, reserved));
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    return result;
}

/*
 * Appends messages[0..count) of a batch with a single reservation. get_piece(i) returns the
 * i-th message. Returns the number appended (>= 1), or a negative code when none was.
 */
typedef int (*piece_getter)(void *ctx, Py_ssize_t i, Piece *out);

static int64_t append_batch(PublicationCore *self, Py_ssize_t count, piece_getter get,
                            void *ctx)
{
    if (self->closed)
        return self->refusal;
    AppendState s;
    int64_t status = read_state(self, &s);
    if (status < 0)
        return status;
    s.limit = current_limit(self, s.position, s.limit);
    if (s.position >= s.limit) {
        Piece first;
        if (get(ctx, 0, &first) < 0) return INT64_MIN;
        return back_pressure_status(self, s.position, required_length(self, first.len));
    }
    /* admit messages while the batch starts below the limit and fits in the term */
    int64_t room = self->g.term_length - s.term_offset;
    int64_t total = 0;
    Py_ssize_t admitted = 0;
    for (; admitted < count; admitted++) {
        Piece p;
        if (get(ctx, admitted, &p) < 0) return INT64_MIN;
        int32_t required = required_length(self, p.len);
        if (admitted > 0 && (total + required > room || s.position + total >= s.limit))
            break;
        total += required;
    }
    int32_t term_id, offset;
    status = reserve(self, &s, (int32_t)total, &term_id, &offset);
    uint8_t *term = term_at(&self->g, s.term_count % PARTITION_COUNT);
    if (status == 0) {
        for (Py_ssize_t i = 0; i < admitted; i++) {
            Piece p;
            get(ctx, i, &p);
            write_message(self, term, offset, term_id, &p, p.len, 0);
            offset += required_length(self, p.len);
        }
        wake_readers(self);
        return admitted;
    }
    return status;
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
        if (check_length(self, record_length) < 0) { PyBuffer_Release(&block); return NULL; }
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
        if (check_length(self, views[got].len) < 0) { got++; goto done; }
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
    if (length < 0 || length > self->max_payload) {
        PyErr_Format(PyExc_ValueError,
                     "claim length %zd is outside 0..%d (the max payload, mtu - 32)", length,
                     self->max_payload);
        return NULL;
    }
    if (self->closed)
        return Py_BuildValue("(Ln)", (long long)self->refusal, (Py_ssize_t)-1);
    AppendState s;
    int64_t status = read_state(self, &s);
    if (status < 0)
        return Py_BuildValue("(Ln)", (long long)status, (Py_ssize_t)-1);
    int32_t frame_length = (int32_t)length + HEADER_LENGTH;
    int32_t required = (int32_t)ALIGN(frame_length, FRAME_ALIGNMENT);
    s.limit = current_limit(self, s.position, s.limit);
    if (s.position >= s.limit)
        return Py_BuildValue("(Ln)", (long long)back_pressure_status(self, s.position, required),
                             (Py_ssize_t)-1);
    int32_t term_id, offset;
    status = reserve(self, &s, required, &term_id, &offset);
    if (status < 0)
        return Py_BuildValue("(Ln)", (long long)status, (Py_ssize_t)-1);
    int index = s.term_count % PARTITION_COUNT;
    write_header(self, term_at(&self->g, index) + offset, frame_length, UNFRAGMENTED,
                 HDR_TYPE_DATA, offset, term_id, reserved);
    Py_ssize_t frame_offset = (Py_ssize_t)index * self->g.term_length + offset;
    return Py_BuildValue("(Ln)", (long long)(term_begin_position(&self->g, term_id) + offset +
                                             required), frame_offset);
}

static uint8_t *claimed_frame(PublicationCore *self, PyObject *arg)
{
    if (self->closed) {
        PyErr_SetString(PyExc_ValueError, "the publication is closed (its claims were aborted)");
        return NULL;
    }
    Py_ssize_t frame_offset = PyLong_AsSsize_t(arg);
    if (frame_offset == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t log_terms = (Py_ssize_t)self->g.term_length * PARTITION_COUNT;
    if (frame_offset < 0 || frame_offset > log_terms - HEADER_LENGTH ||
        frame_offset % FRAME_ALIGNMENT != 0) {
        PyErr_Format(PyExc_ValueError, "%zd is not a frame offset in this log", frame_offset);
        return NULL;
    }
    uint8_t *frame = self->g.terms + frame_offset;
    if (LOAD_ACQUIRE((int32_t *)frame) >= 0) {
        PyErr_SetString(PyExc_ValueError, "the claim was already committed or aborted");
        return NULL;
    }
    return frame;
}

static PyObject *pub_commit(PublicationCore *self, PyObject *arg)
{
    uint8_t *frame = claimed_frame(self, arg);
    if (frame == NULL)
        return NULL;
    STORE_RELEASE((int32_t *)frame, -rd_i32(frame));
    wake_readers(self);
    Py_RETURN_NONE;
}

static PyObject *pub_abort(PublicationCore *self, PyObject *arg)
{
    uint8_t *frame = claimed_frame(self, arg);
    if (frame == NULL)
        return NULL;
    uint16_t pad = HDR_TYPE_PAD;
    memcpy(frame + TYPE_OFFSET, &pad, 2);
    STORE_RELEASE((int32_t *)frame, -rd_i32(frame));
    wake_readers(self);
    Py_RETURN_NONE;
}

/* Writable memoryview over a claimed frame's payload (valid until commit/abort). */
static PyObject *pub_claim_view(PublicationCore *self, PyObject *args)
{
    Py_ssize_t frame_offset, length;
    if (!PyArg_ParseTuple(args, "nn", &frame_offset, &length))
        return NULL;
    Py_ssize_t log_terms = (Py_ssize_t)self->g.term_length * PARTITION_COUNT;
    if (self->closed || frame_offset < 0 || length < 0 ||
        frame_offset + HEADER_LENGTH + length > log_terms) {
        PyErr_SetString(PyExc_ValueError, "claim is outside this log");
        return NULL;
    }
    return PyMemoryView_FromMemory((char *)self->g.terms + frame_offset + HEADER_LENGTH, length,
                                   PyBUF_WRITE);
}

static PyObject *pub_get_position(PublicationCore *self, void *c)
{
    if (self->closed && self->refusal == CLOSED)
        return PyLong_FromLong(CLOSED);
    AppendState s;
    if (read_state(self, &s) < 0) {
        /* mid-rotation: the previous term is complete */
        int32_t count = LOAD_ACQUIRE(active_term_count_ptr(&self->g));
        return PyLong_FromLongLong((int64_t)count << self->g.position_bits);
    }
    return PyLong_FromLongLong(s.position);
}

/* Lets go of this process's threads asleep in _await_progress on the current log (with the
 * GIL, before the log is unmapped or replaced): they are woken, and their waiter counts taken
 * back for them, since they must not touch that log again (the generation tells them). */
static void release_sleepers(PublicationCore *self)
{
    if (!self->closed && self->sleeping > 0) {
        __atomic_fetch_sub(meta_i32(&self->g, META_PROGRESS_WAITERS), self->sleeping,
                           __ATOMIC_SEQ_CST);
        __atomic_fetch_add(meta_i32(&self->g, META_PROGRESS_WAKE), 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, meta_i32(&self->g, META_PROGRESS_WAKE), FUTEX_WAKE, INT_MAX, NULL,
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

/* _await_progress(timeout_s): sleep until a reader moves, the limit moves, or the timeout. */
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
    /* the log of this sleep: the core may be closed, detached or given another log meanwhile */
    int32_t *waiters = meta_i32(&self->g, META_PROGRESS_WAITERS);
    int32_t *word = meta_i32(&self->g, META_PROGRESS_WAKE);
    uint32_t generation = self->generation;
    __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
    self->sleeping++;
    int32_t seen = LOAD_ACQUIRE(word);
    AppendState s;
    int ready = read_state(self, &s) < 0 || current_limit(self, s.position, s.limit) > s.position;
    if (!ready) {
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
    self->g = g;
    self->limit = limit;
    if (counters != Py_None) {  /* the limit is a counter: value, registration id, ... */
        self->limit_registration = LOAD_ACQUIRE(limit + 1);
        self->values = ((AtomicBuffer *)counters)->data;
        self->values_len = ((AtomicBuffer *)counters)->capacity;
        Py_XSETREF(self->counters_buffer, Py_NewRef(counters));
    } else {
        self->values = NULL;
        self->values_len = 0;
        Py_CLEAR(self->counters_buffer);
    }
    Py_XSETREF(self->log_buffer, Py_NewRef(log));
    Py_XSETREF(self->limit_buffer, Py_NewRef(limit_buf));
    self->session_id = session_id;
    self->stream_id = stream_id;
    self->mtu = mtu;
    self->max_payload = mtu - HEADER_LENGTH;
    int32_t max_message = term_length / 8;
    self->max_message = max_message < (16 << 20) ? max_message : (16 << 20);
    self->max_possible_position = (int64_t)term_length << 31;
    self->exclusive = exclusive;
    self->closed = 0;
    self->refusal = CLOSED;
    self->x_term_count = self->x_term_id = self->x_term_offset = 0;
    self->x_term_begin_position = 0;
    if (exclusive) {
        int32_t count = LOAD_ACQUIRE(active_term_count_ptr(&self->g));
        int64_t raw = LOAD_ACQUIRE(tail_ptr(&self->g, count % PARTITION_COUNT));
        int64_t offset = term_offset_of(raw);
        self->x_term_count = count;
        self->x_term_id = term_id_of(raw);
        self->x_term_offset = (int32_t)(offset < term_length ? offset : term_length);
        self->x_term_begin_position = term_begin_position(&self->g, self->x_term_id);
    }
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

static void pub_dealloc(PublicationCore *self)
{
    PyObject_GC_UnTrack(self);
    pub_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *pub_get_max_payload(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->max_payload); }
static PyObject *pub_get_max_message(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->max_message); }
static PyObject *pub_get_session_id(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->session_id); }
static PyObject *pub_get_stream_id(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->stream_id); }
static PyObject *pub_get_term_length(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->g.term_length); }
static PyObject *pub_get_initial_term_id(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->g.initial_term_id); }
static PyObject *pub_get_mtu(PublicationCore *self, void *c)
{ return PyLong_FromLong(self->mtu); }
static PyObject *pub_get_is_closed(PublicationCore *self, void *c)
{ return PyBool_FromLong(self->closed && self->refusal == CLOSED); }
static PyObject *pub_get_max_possible_position(PublicationCore *self, void *c)
{ return PyLong_FromLongLong(self->max_possible_position); }
static PyObject *pub_get_position_limit(PublicationCore *self, void *c)
{ return PyLong_FromLongLong(LOAD_ACQUIRE(self->limit)); }
static PyObject *pub_get_is_connected(PublicationCore *self, void *c)
{
    return PyBool_FromLong(!self->closed &&
                           LOAD_ACQUIRE((int32_t *)(self->g.meta + META_IS_CONNECTED)) == 1);
}

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
    {"offer", (PyCFunction)(void (*)(void))pub_offer, METH_FASTCALL | METH_KEYWORDS,
     "offer(*buffers, reserved_value=0) -> int\n\nAppend one message made of the given buffers "
     "(a gather of up to 16). Returns the new stream position (> 0) or a negative code: "
     "NOT_CONNECTED, BACK_PRESSURED, ADMIN_ACTION, CLOSED, MAX_POSITION_EXCEEDED. Raises "
     "ValueError when the message exceeds max_message_length, TypeError for a non-buffer."},
    {"offer_many", (PyCFunction)pub_offer_many, METH_O,
     "offer_many(messages) -> int\n\nAppend several messages with one reservation. messages is "
     "a sequence of buffers, a 2-D array (one message per row) or a 1-D array of records (one "
     "message per record). Returns how many were appended from the front (>= 1), or a negative "
     "code when none was; 0 for an empty batch."},
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

static PyTypeObject PublicationCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.PublicationCore",
    .tp_basicsize = sizeof(PublicationCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The term appender behind ExclusivePublication and ConcurrentPublication.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pub_init,
    .tp_dealloc = (destructor)pub_dealloc,
    .tp_traverse = (traverseproc)pub_traverse,
    .tp_clear = (inquiry)pub_clear,
    .tp_methods = pub_methods,
    .tp_getset = pub_getset,
};

/* ====================================================================================== */
/* Header                                                                                  */
/* ====================================================================================== */

typedef struct {
    PyObject_HEAD
    uint8_t bytes[HEADER_LENGTH];
    int position_bits;
    int32_t initial_term_id;
} Header;

static PyTypeObject HeaderType;

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

static PyTypeObject HeaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.Header",
    .tp_basicsize = sizeof(Header),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The header of one fragment: a copy, safe to keep after the handler returns.",
    .tp_getset = header_getset,
    .tp_repr = (reprfunc)header_repr,
};

/* ====================================================================================== */
/* ImageCore: the term reader                                                             */
/* ====================================================================================== */

typedef struct {
    PyObject_HEAD
    PyObject *log_buffer;
    PyObject *position_buffer;
    LogGeometry g;
    int64_t *position;        /* the subscriber position: written only by this reader */
    /* An owned image's position is a driver counter lent to it (see image_owns_counter):
     * ids points at the counter's registration id (reference id two words on), NULL for an
     * image whose position is its own memory (a group's, a test's). */
    const int64_t *ids;
    int64_t registration_id, reference_id;
    int64_t local;            /* owned: the position this process has read up to */
    int64_t stored;           /* owned: the position this image last stored in the counter
                               * (behind local while messages taken one by one are not yet
                               * published, see consume) */
    int32_t partial;          /* bytes of a fragmented message's leading fragments that
                               * image_take found before the rest was committed */
    int reclaimed;            /* owned: the driver took the counter back; never store again */
    Header *header;           /* reused while nobody else holds it */
    int closed;               /* once set, the log may be unmapped: never touch it again */
    int sleeping;             /* threads of this process asleep in wait_for_data */
} ImageCore;

/*
 * Whether the image still holds its position counter. The driver frees a subscriber's counter
 * when it drops the reader (its client timed out: a process stopped past its liveness, or the
 * image was removed) and hands the id to another reader a reuse timeout later, while this
 * process may still hold the image. Its registration and reference ids then change (free()
 * clears them) or its value is not what this image stored; from then on the image reads and
 * stores nothing: the bytes under it are no longer held for it, and the counter is not its own.
 */
static inline int image_owns_counter(ImageCore *self)
{
    if (self->ids == NULL)
        return 1;
    /* the log bytes read before this call are ordered before the ids read here: ids still
     * ours afterwards mean the driver had not dropped the reader, so no writer could have
     * reused those bytes while they were read */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (!self->reclaimed && (LOAD_ACQUIRE(self->ids) != self->registration_id ||
                             LOAD_ACQUIRE(self->ids + 2) != self->reference_id ||
                             LOAD_ACQUIRE(self->position) != self->stored))
        self->reclaimed = 1;
    return !self->reclaimed;
}

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
    }
    if (!self->closed)
        wake_word(meta_i32(&self->g, META_PROGRESS_WAKE), meta_i32(&self->g, META_PROGRESS_WAITERS));
}

/* The position a poll starts from: the counter's (or an owned image's own). */
static inline int64_t image_position(ImageCore *self)
{
    return self->ids == NULL ? LOAD_ACQUIRE(self->position) : self->local;
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
static inline void flush_position(ImageCore *self)
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

/* Calls handler(memoryview, header) for one fragment; returns its result (new ref) or NULL. */
static PyObject *deliver(ImageCore *self, PyObject *handler, uint8_t *frame, int32_t length)
{
    PyObject *view = PyMemoryView_FromMemory((char *)frame + HEADER_LENGTH,
                                             length - HEADER_LENGTH, PyBUF_READ);
    if (view == NULL)
        return NULL;
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
static int frame_ok(ImageCore *self, const uint8_t *frame, int32_t offset, int32_t length,
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

/* Delivers up to `limit` fragments to handler(buffer, header); returns how many, or -1 with an
 * exception set (the fragments before it still count as consumed). */
static long image_poll(ImageCore *self, PyObject *handler, long limit)
{
    if (self->closed || !image_owns_counter(self))
        return 0;
    int64_t position = image_position(self);
    int32_t term_offset = (int32_t)(position & (self->g.term_length - 1));
    uint8_t *term = term_at(&self->g, (int)((position >> self->g.position_bits) % PARTITION_COUNT));
    int32_t offset = term_offset;
    long fragments = 0;
    int failed = 0;
    while (fragments < limit && offset < self->g.term_length) {
        int32_t length = LOAD_ACQUIRE((int32_t *)(term + offset));
        if (length <= 0)
            break;
        uint8_t *frame = term + offset;
        int pad = rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD;
        if (!pad && !frame_in_term(self, frame, position))
            break;
        if (!frame_ok(self, frame, offset, length, position)) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        offset += (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        if (pad)
            continue;
        fragments++;
        PyObject *r = deliver(self, handler, frame, length);
        if (r == NULL) { failed = 1; break; }
        Py_DECREF(r);
        if (self->closed)
            break;  /* the handler closed the image: its log may be gone */
    }
    if (offset != term_offset)
        advance(self, position + (offset - term_offset));
    return failed ? -1 : fragments;
}

/* Like image_poll, the handler returning an Action. */
static long image_controlled_poll(ImageCore *self, PyObject *handler, long limit)
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
        int32_t length = LOAD_ACQUIRE((int32_t *)(term + offset));
        if (length <= 0)
            break;
        uint8_t *frame = term + offset;
        int pad = rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD;
        if (!pad && !frame_in_term(self, frame, position))
            break;
        if (!frame_ok(self, frame, offset, length, position)) {
            failed = PyErr_Occurred() != NULL;
            break;
        }
        int32_t aligned = (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        offset += aligned;
        if (pad)
            continue;
        fragments++;
        PyObject *r = deliver(self, handler, frame, length);
        if (r == NULL) { failed = 1; break; }
        long action = r == Py_None ? ACTION_CONTINUE : PyLong_AsLong(r);
        Py_DECREF(r);
        if (action == -1 && PyErr_Occurred()) { failed = 1; break; }
        if (action == ACTION_ABORT) {
            fragments--;
            offset -= aligned;
            break;
        }
        if (action == ACTION_BREAK || self->closed)
            break;
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

/* The length of the message whose first fragment is at `offset` in its term: on return,
 * *end is the term offset just past its last fragment and the result is its payload length.
 * Returns -1 when the rest is not committed yet (*end: the first missing fragment), -2 when
 * the frames after it are not this message's (*end: where they start; they are read as
 * messages of their own), -3 with an exception set for a corrupt frame, -4 when the term was
 * lapped under the reader. */
static Py_ssize_t message_extent(ImageCore *self, const uint8_t *term, int32_t offset,
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
static PyObject *image_take(ImageCore *self)
{
    if (self->closed || !image_owns_counter(self))
        return NULL;
    for (;;) {
        int64_t position = image_position(self);
        int32_t offset = (int32_t)(position & (self->g.term_length - 1));
        uint8_t *term = term_at(&self->g, (int)((position >> self->g.position_bits) % PARTITION_COUNT));
        int32_t length = LOAD_ACQUIRE((int32_t *)(term + offset));
        if (length <= 0)
            return NULL;
        uint8_t *frame = term + offset;
        int pad = rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD;
        if ((!pad && !frame_in_term(self, frame, position)) ||
            !frame_ok(self, frame, offset, length, position))
            return NULL;
        int32_t aligned = (int32_t)ALIGN(length, FRAME_ALIGNMENT);
        uint8_t flags = frame[FLAGS_OFFSET];
        if (pad || !(flags & BEGIN_FLAG)) {
            consume(self, position + aligned);
            continue;
        }
        if (flags & END_FLAG) {
            PyObject *message = PyBytes_FromStringAndSize((char *)frame + HEADER_LENGTH,
                                                          length - HEADER_LENGTH);
            if (message != NULL) {
                prefetch_message(self, term, offset + aligned);
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
        prefetch_message(self, term, end);
        consume(self, position + (end - offset));
        return message;
    }
}

typedef long (*image_reader)(ImageCore *, PyObject *, long);

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
        int32_t length = LOAD_ACQUIRE((int32_t *)(term + offset));
        if (length <= 0)
            break;
        uint8_t *frame = term + offset;
        int pad = rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD;
        if (!pad && !frame_in_term(self, frame, position))
            break;
        if (!frame_ok(self, frame, offset, length, position)) {
            if (PyErr_Occurred())
                goto done;
            break;
        }
        if (!pad) {
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

/* True when a poll would find a frame (or the image is closed: the caller must look). */
static int image_ready(ImageCore *self)
{
    if (self->closed || !image_owns_counter(self))
        return self->closed;
    int64_t position = image_position(self);
    int32_t offset = (int32_t)(position & (self->g.term_length - 1)) + self->partial;
    uint8_t *term = term_at(&self->g, (int)((position >> self->g.position_bits) % PARTITION_COUNT));
    return LOAD_ACQUIRE((int32_t *)(term + offset)) > 0;
}

static PyObject *img_get_is_closed(ImageCore *self, void *c)
{ return PyBool_FromLong(self->closed); }

static PyObject *img_get_position(ImageCore *self, void *c)
{ return PyLong_FromLongLong(image_position(self)); }

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

static void img_dealloc(ImageCore *self)
{
    PyObject_GC_UnTrack(self);
    img_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyGetSetDef img_getset[] = {
    {"position", (getter)img_get_position, (setter)img_set_position,
     "the subscriber position: bytes consumed so far in this stream", NULL},
    {"term_length", (getter)img_get_term_length, NULL, "term length in bytes", NULL},
    {"initial_term_id", (getter)img_get_initial_term_id, NULL, "initial term id", NULL},
    {"is_closed", (getter)img_get_is_closed, NULL, "True once closed", NULL},
    {"is_reclaimed", (getter)img_get_is_reclaimed, NULL,
     "True once the driver took this image's position counter back (its client was timed "
     "out, or the image removed): it reads nothing more", NULL},
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

static PyTypeObject ImageCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.ImageCore",
    .tp_basicsize = sizeof(ImageCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The term reader behind Image.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)img_init,
    .tp_dealloc = (destructor)img_dealloc,
    .tp_traverse = (traverseproc)img_traverse,
    .tp_clear = (inquiry)img_clear,
    .tp_methods = img_methods,
    .tp_getset = img_getset,
};

/* ====================================================================================== */
/* SubscriptionCore: polling and waiting over a subscription's images                      */
/* ====================================================================================== */

/*
 * The images tuple is replaced whole (by the client conductor, under its lock) and read here as
 * a snapshot, so a poll never sees a half-made change. `wake` is a word in the client's own
 * memory that the conductor bumps whenever the images change or the client fails: a waiting
 * subscriber sleeps on it beside its images' data words. `error`, once set, is raised by every
 * later poll: the client is gone (driver timeout, client timeout).
 *
 * The lease is the client's heartbeat counter: while its registration id is the client's, the
 * driver has not timed the client out. A process stopped past its liveness learns it at its
 * next poll, or at the end of the poll it was stopped in, before the conductor thread does:
 * every poll checks the lease before reading and after, and calls on_lease_lost (which fails
 * the client and raises ClientTimeoutError) once it is gone.
 */
typedef struct {
    PyObject_HEAD
    PyObject *images;         /* tuple of ImageCore */
    PyObject *wake_buffer;    /* AtomicBuffer holding the wake word, or NULL */
    int32_t *wake;
    PyObject *error;          /* exception instance raised by polls, or NULL */
    Py_ssize_t round_robin;
    PyObject *lease_buffer;   /* AtomicBuffer holding the lease counter, or NULL */
    const int64_t *lease;     /* the heartbeat counter's registration id */
    int64_t lease_owner;      /* the client id it must hold */
    PyObject *on_lease_lost;  /* callable, or NULL */
    char closed;              /* `_closed`: set by Subscription.close */
} SubscriptionCore;

static int wait_images(PyObject *images, int32_t *wake, int32_t wake_expected,
                       int64_t timeout_ns);
static int word_at(PyObject *buffer, Py_ssize_t offset, int32_t **word);

/* Wakes the subscription's waiters (the images changed or the client failed). */
static void sub_ring(SubscriptionCore *self)
{
    if (self->wake != NULL) {
        __atomic_fetch_add(self->wake, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, self->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

static int sub_raise_error(SubscriptionCore *self)
{
    if (self->error == NULL)
        return 0;
    /* a copy each time: the kept instance must not hold a traceback's frames (and, through
     * them, the subscription and its client) alive */
    PyObject *type = (PyObject *)Py_TYPE(self->error);
    PyObject *args = PyObject_GetAttrString(self->error, "args");
    PyObject *copy = args != NULL && PyTuple_Check(args) ? PyObject_Call(type, args, NULL) : NULL;
    Py_XDECREF(args);
    if (copy == NULL) {
        PyErr_Clear();
        PyException_SetTraceback(self->error, Py_None);
        copy = Py_NewRef(self->error);
    }
    PyErr_SetObject(type, copy);
    Py_DECREF(copy);
    return -1;
}

/* 0 while the client holds its lease; else -1 with on_lease_lost's exception (or the
 * client's error) set. */
static int sub_check_lease(SubscriptionCore *self)
{
    if (self->lease == NULL || LOAD_ACQUIRE(self->lease) == self->lease_owner)
        return 0;
    /* held across the call: failing the client closes this subscription, which drops it */
    PyObject *on_lost = Py_NewRef(self->on_lease_lost);
    PyObject *r = PyObject_CallNoArgs(on_lost);
    Py_DECREF(on_lost);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    if (sub_raise_error(self) < 0)
        return -1;
    PyErr_SetString(PyExc_RuntimeError, "the client's heartbeat counter was reclaimed");
    return -1;
}

/* 0 while the client is usable: no error kept (the conductor thread may have failed it, and
 * dropped the lease, while a handler let go of the GIL) and its lease held; else -1 with the
 * exception set. Checked before reading and after. */
static int sub_check_usable(SubscriptionCore *self)
{
    return sub_raise_error(self) < 0 || sub_check_lease(self) < 0 ? -1 : 0;
}

/* One pass over the images, round-robin from one further along each call; -1 on error. */
static long sub_read(SubscriptionCore *self, image_reader read, PyObject *handler, long limit)
{
    if (sub_check_usable(self) < 0)
        return -1;
    PyObject *images = self->images;
    Py_ssize_t n = PyTuple_GET_SIZE(images);
    if (n == 0)
        return 0;
    Py_INCREF(images);  /* a handler may let the conductor replace the tuple */
    Py_ssize_t start = self->round_robin = (self->round_robin + 1) % n;
    long fragments = 0;
    for (Py_ssize_t i = 0; i < n && fragments < limit; i++) {
        long got = read((ImageCore *)PyTuple_GET_ITEM(images, (start + i) % n), handler,
                        limit - fragments);
        if (got < 0) { fragments = -1; break; }
        fragments += got;
    }
    Py_DECREF(images);
    /* stopped inside a handler past its liveness: what it was handed may have been reused */
    if (fragments > 0 && sub_check_usable(self) < 0)
        return -1;
    return fragments;
}

static double monotonic_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Reads; with a timeout, sleeps until something arrives (or the images change) and reads
 * again, until it got a fragment or the timeout passed. */
static long sub_read_waiting(SubscriptionCore *self, image_reader read, PyObject *handler,
                             long limit, double timeout)
{
    double deadline = timeout > 0 ? monotonic_s() + timeout : 0;
    for (;;) {
        int32_t seen = self->wake != NULL ? LOAD_ACQUIRE(self->wake) : 0;
        long got = sub_read(self, read, handler, limit);
        if (got != 0 || timeout <= 0 || limit == 0)
            return got;
        double remaining = deadline - monotonic_s();
        if (remaining <= 0)
            return 0;
        PyObject *images = Py_NewRef(self->images);
        int ready = wait_images(images, self->wake, seen, timeout_to_ns(remaining));
        Py_DECREF(images);
        if (ready < 0)
            return -1;
    }
}

/* A timeout argument in seconds: None gives `none`; ValueError for a negative or NaN one.
 * Returns -1 with the exception set on error. */
static int timeout_arg(PyObject *obj, double none, double *timeout)
{
    if (obj == Py_None) {
        *timeout = none;
        return 0;
    }
    *timeout = PyFloat_AsDouble(obj);
    if (*timeout == -1 && PyErr_Occurred())
        return -1;
    if (*timeout < 0 || *timeout != *timeout) {
        PyErr_Format(PyExc_ValueError, "timeout must be None or >= 0 seconds, not %R", obj);
        return -1;
    }
    return 0;
}

static const char *poll_keywords[] = {"handler", "fragment_limit", "timeout", NULL};

static PyObject *sub_poll_with(SubscriptionCore *self, image_reader read, PyObject *const *args,
                               Py_ssize_t nargs, PyObject *kwnames, const char *name)
{
    PyObject *handler = NULL, *limit_obj = NULL, *timeout_obj = Py_None;
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs > 3 || nargs < 1 - nkw) goto usage;
    PyObject *slots[3] = {NULL, NULL, NULL};
    for (Py_ssize_t i = 0; i < nargs; i++) slots[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        const char *key = PyUnicode_AsUTF8(PyTuple_GET_ITEM(kwnames, k));
        int j = 0;
        while (poll_keywords[j] != NULL && (key == NULL || strcmp(key, poll_keywords[j]) != 0))
            j++;
        if (poll_keywords[j] == NULL || slots[j] != NULL) goto usage;
        slots[j] = args[nargs + k];
    }
    handler = slots[0];
    limit_obj = slots[1];
    if (slots[2] != NULL) timeout_obj = slots[2];
    if (handler == NULL) goto usage;
    long limit = 10;
    if (limit_obj != NULL) {
        limit = PyLong_AsLong(limit_obj);
        if (limit == -1 && PyErr_Occurred()) return NULL;
        if (limit < 0) {
            PyErr_Format(PyExc_ValueError, "fragment_limit must be >= 0, not %ld", limit);
            return NULL;
        }
    }
    double timeout;
    if (timeout_arg(timeout_obj, 0, &timeout) < 0)
        return NULL;
    long got = sub_read_waiting(self, read, handler, limit, timeout);
    return got < 0 ? NULL : PyLong_FromLong(got);
usage:
    PyErr_Format(PyExc_TypeError, "%s(handler, fragment_limit=10, timeout=None)", name);
    return NULL;
}

static PyObject *sub_poll(SubscriptionCore *self, PyObject *const *args, size_t nargsf,
                          PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL && nargs == 2 && self->error == NULL) {  /* the hot path */
        long limit = PyLong_AsLong(args[1]);
        if (limit >= 0) {
            long got = sub_read(self, image_poll, args[0], limit);
            return got < 0 ? NULL : PyLong_FromLong(got);
        }
        if (PyErr_Occurred()) return NULL;
    }
    return sub_poll_with(self, image_poll, args, nargs, kwnames, "poll");
}

static PyObject *sub_controlled_poll(SubscriptionCore *self, PyObject *const *args,
                                     size_t nargsf, PyObject *kwnames)
{
    return sub_poll_with(self, image_controlled_poll, args, PyVectorcall_NARGS(nargsf), kwnames,
                         "controlled_poll");
}

static PyObject *sub_wait(SubscriptionCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "wait(timeout=None)");
        return NULL;
    }
    double timeout;  /* None: forever (-1) */
    if (timeout_arg(nargs == 1 ? args[0] : Py_None, -1, &timeout) < 0)
        return NULL;
    double deadline = timeout >= 0 ? monotonic_s() + timeout : 0;
    for (;;) {
        if (sub_raise_error(self) < 0)
            return NULL;
        int32_t seen = self->wake != NULL ? LOAD_ACQUIRE(self->wake) : 0;
        PyObject *images = Py_NewRef(self->images);
        int ready = 0;
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(images) && !ready; i++) {
            ImageCore *image = (ImageCore *)PyTuple_GET_ITEM(images, i);
            ready = !image->closed && image_ready(image);
        }
        double remaining = timeout >= 0 ? deadline - monotonic_s() : -1;
        if (!ready && (timeout < 0 || remaining > 0))
            ready = wait_images(images, self->wake, seen, timeout < 0 ? -1
                                : timeout_to_ns(remaining));
        Py_DECREF(images);
        if (ready < 0)
            return NULL;
        if (ready || (timeout >= 0 && monotonic_s() >= deadline))
            return PyBool_FromLong(ready);
    }
}

/* Publishes the positions image_take held back (see consume). */
static void sub_flush_positions(SubscriptionCore *self)
{
    PyObject *images = self->images;
    for (Py_ssize_t i = 0; images != NULL && i < PyTuple_GET_SIZE(images); i++)
        flush_position((ImageCore *)PyTuple_GET_ITEM(images, i));
}

/* The next whole message from the images, round-robin from one further along each call;
 * NULL with no exception when there is none (then the held-back positions are published),
 * NULL with an exception when the client failed or a log is corrupt. */
static PyObject *sub_take(SubscriptionCore *self)
{
    if (sub_check_usable(self) < 0)
        return NULL;
    PyObject *images = self->images;
    Py_ssize_t n = PyTuple_GET_SIZE(images);
    if (n == 0)
        return NULL;
    Py_INCREF(images);
    Py_ssize_t start = self->round_robin = (self->round_robin + 1) % n;
    PyObject *message = NULL;
    for (Py_ssize_t i = 0; i < n && message == NULL && !PyErr_Occurred(); i++)
        message = image_take((ImageCore *)PyTuple_GET_ITEM(images, (start + i) % n));
    if (message == NULL && !PyErr_Occurred())
        sub_flush_positions(self);
    Py_DECREF(images);
    /* stopped past its liveness while copying: the bytes may have been reused */
    if (message != NULL && sub_check_usable(self) < 0)
        Py_CLEAR(message);
    return message;
}

static PyObject *sub_take_method(SubscriptionCore *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *message = sub_take(self);
    if (message == NULL && !PyErr_Occurred())
        Py_RETURN_NONE;
    return message;
}

/* ---- MessageIterator: Subscription.messages() ---------------------------------------- */

typedef struct {
    PyObject_HEAD
    SubscriptionCore *subscription;
    double timeout;           /* seconds without a message before it stops; < 0: never */
    int ended;                /* stopped once: stays stopped, as iterators do */
} MessageIterator;

static PyTypeObject MessageIteratorType;

static PyObject *messages_next(MessageIterator *self)
{
    SubscriptionCore *sub = self->subscription;
    double deadline = self->timeout > 0 ? monotonic_s() + self->timeout : 0;
    while (!self->ended) {
        int32_t seen = sub->wake != NULL ? LOAD_ACQUIRE(sub->wake) : 0;
        PyObject *message = sub_take(sub);
        if (message != NULL || PyErr_Occurred())
            return message;
        double remaining = self->timeout > 0 ? deadline - monotonic_s() : 1.0;
        double slice = remaining < 1.0 ? remaining : 1.0;  /* 1 s: to look at signals */
        self->ended = sub->closed || self->timeout == 0 || slice <= 0;
        if (self->ended)
            return NULL;
        PyObject *images = Py_NewRef(sub->images);
        int ready = wait_images(images, sub->wake, seen, timeout_to_ns(slice));
        Py_DECREF(images);
        if (ready < 0 || PyErr_CheckSignals() < 0)
            return NULL;
    }
    return NULL;
}

static void messages_dealloc(MessageIterator *self)
{
    if (self->subscription != NULL)
        sub_flush_positions(self->subscription);
    Py_CLEAR(self->subscription);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject MessageIteratorType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.MessageIterator",
    .tp_basicsize = sizeof(MessageIterator),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Whole messages of a subscription as bytes: see Subscription.messages.",
    .tp_dealloc = (destructor)messages_dealloc,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)messages_next,
};

static PyObject *sub_messages(SubscriptionCore *self, PyObject *const *args, Py_ssize_t nargs,
                              PyObject *kwnames)
{
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    if (nargs + nkw > 1 || (nkw == 1 && PyUnicode_CompareWithASCIIString(
                                            PyTuple_GET_ITEM(kwnames, 0), "timeout") != 0)) {
        PyErr_SetString(PyExc_TypeError, "messages(timeout=1.0)");
        return NULL;
    }
    double timeout = 1.0;  /* not given: 1 s; None: until closed (-1) */
    if (nargs + nkw == 1 && timeout_arg(args[0], -1, &timeout) < 0)
        return NULL;
    MessageIterator *it = PyObject_New(MessageIterator, &MessageIteratorType);
    if (it == NULL)
        return NULL;
    it->subscription = (SubscriptionCore *)Py_NewRef(self);
    it->timeout = timeout;
    it->ended = 0;
    return (PyObject *)it;
}

static PyObject *sub_fail(SubscriptionCore *self, PyObject *error)
{
    if (!PyExceptionInstance_Check(error)) {
        PyErr_SetString(PyExc_TypeError, "_fail takes an exception instance");
        return NULL;
    }
    Py_XSETREF(self->error, Py_NewRef(error));
    sub_ring(self);
    Py_RETURN_NONE;
}

static PyObject *sub_drop_lease(SubscriptionCore *self, PyObject *Py_UNUSED(ignored))
{
    self->lease = NULL;
    Py_CLEAR(self->lease_buffer);
    Py_CLEAR(self->on_lease_lost);
    Py_RETURN_NONE;
}

static PyObject *sub_check_client(SubscriptionCore *self, PyObject *Py_UNUSED(ignored))
{
    if (sub_check_usable(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *sub_set_lease(SubscriptionCore *self, PyObject *args)
{
    PyObject *buffer, *on_lost;
    Py_ssize_t offset;
    long long owner;
    if (!PyArg_ParseTuple(args, "OnLO", &buffer, &offset, &owner, &on_lost))
        return NULL;
    if (!PyCallable_Check(on_lost)) {
        PyErr_SetString(PyExc_TypeError, "_set_lease(buffer, offset, owner_id, on_lost): "
                        "on_lost must be callable");
        return NULL;
    }
    const int64_t *lease = position_ptr(buffer, offset);
    if (lease == NULL)
        return NULL;
    self->lease = lease;
    self->lease_owner = owner;
    Py_XSETREF(self->lease_buffer, Py_NewRef(buffer));
    Py_XSETREF(self->on_lease_lost, Py_NewRef(on_lost));
    Py_RETURN_NONE;
}

static PyObject *sub_wake(SubscriptionCore *self, PyObject *Py_UNUSED(ignored))
{
    sub_ring(self);
    Py_RETURN_NONE;
}

static PyObject *sub_get_images(SubscriptionCore *self, void *c)
{
    return Py_NewRef(self->images);
}

static int sub_set_images(SubscriptionCore *self, PyObject *value, void *c)
{
    if (value == NULL || !PyTuple_Check(value)) {
        PyErr_SetString(PyExc_TypeError, "images must be a tuple of Image");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(value); i++) {
        if (!PyObject_TypeCheck(PyTuple_GET_ITEM(value, i), &ImageCoreType)) {
            PyErr_SetString(PyExc_TypeError, "images must be a tuple of Image");
            return -1;
        }
    }
    Py_SETREF(self->images, Py_NewRef(value));
    sub_ring(self);
    return 0;
}

static int sub_init(SubscriptionCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"wake_buffer", "wake_offset", NULL};
    PyObject *wake_buffer = Py_None;
    Py_ssize_t wake_offset = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|On", kwlist, &wake_buffer, &wake_offset))
        return -1;
    if (wake_buffer != Py_None) {
        if (word_at(wake_buffer, wake_offset, &self->wake) < 0)
            return -1;
        Py_XSETREF(self->wake_buffer, Py_NewRef(wake_buffer));
    }
    Py_XSETREF(self->images, PyTuple_New(0));
    return self->images == NULL ? -1 : 0;
}

static int sub_traverse(SubscriptionCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->images);
    Py_VISIT(self->wake_buffer);
    Py_VISIT(self->error);
    Py_VISIT(self->lease_buffer);
    Py_VISIT(self->on_lease_lost);
    return 0;
}

static int sub_clear(SubscriptionCore *self)
{
    Py_CLEAR(self->images);
    Py_CLEAR(self->wake_buffer);
    Py_CLEAR(self->error);
    Py_CLEAR(self->lease_buffer);
    Py_CLEAR(self->on_lease_lost);
    self->wake = NULL;
    self->lease = NULL;
    return 0;
}

static void sub_dealloc(SubscriptionCore *self)
{
    PyObject_GC_UnTrack(self);
    sub_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef sub_members[] = {
    {"_closed", T_BOOL, offsetof(SubscriptionCore, closed), 0,
     "True once Subscription.close ran (set by it)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef sub_getset[] = {
    {"images", (getter)sub_get_images, (setter)sub_set_images,
     "the current images, a tuple (a snapshot: it is replaced, never changed)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *sub_arm_watcher(SubscriptionCore *self, PyObject *arg);

static PyMethodDef sub_methods[] = {
    {"poll", (PyCFunction)(void (*)(void))sub_poll, METH_FASTCALL | METH_KEYWORDS,
     "poll(handler, fragment_limit=10, timeout=None) -> int\n\nCall handler(buffer, header) "
     "for up to fragment_limit fragments over the images, round-robin from one further along "
     "each call. With a timeout (seconds), sleep until a fragment arrives, woken by the "
     "writer, at most that long. Returns the number of fragments (0 when the timeout passed). "
     "Raises the client's error once it is gone (DriverTimeoutError, ClientTimeoutError)."},
    {"controlled_poll", (PyCFunction)(void (*)(void))sub_controlled_poll,
     METH_FASTCALL | METH_KEYWORDS,
     "controlled_poll(handler, fragment_limit=10, timeout=None) -> int\n\nLike poll, the "
     "handler returning an Action."},
    {"wait", (PyCFunction)sub_wait, METH_FASTCALL,
     "wait(timeout=None) -> bool\n\nSleep until an image has a fragment to read (True) or "
     "timeout seconds passed (False; None waits forever). Costs no CPU while asleep."},
    {"messages", (PyCFunction)(void (*)(void))sub_messages, METH_FASTCALL | METH_KEYWORDS,
     "messages(timeout=1.0) -> Iterator[bytes]\n\nWhole messages, reassembled, as bytes, "
     "round-robin over the images, until none arrives for timeout seconds (None: until the "
     "subscription is closed; 0: until none is there). Sleeps (no CPU) while there is nothing "
     "to read, woken by the writer. A message is consumed as it is handed out: leaving the "
     "loop loses nothing. Raises the client's error once it is gone."},
    {"_take", (PyCFunction)sub_take_method, METH_NOARGS,
     "_take() -> bytes | None: the next whole message, or None"},
    {"_fail", (PyCFunction)sub_fail, METH_O, NULL},
    {"_set_lease", (PyCFunction)sub_set_lease, METH_VARARGS, NULL},
    {"_check_client", (PyCFunction)sub_check_client, METH_NOARGS, NULL},
    {"_drop_lease", (PyCFunction)sub_drop_lease, METH_NOARGS, NULL},
    {"_wake", (PyCFunction)sub_wake, METH_NOARGS, NULL},
    {"_arm_watcher", (PyCFunction)sub_arm_watcher, METH_O,
     "_arm_watcher(watcher) -> bool\n\nArm a FutexRing or LogWatcher to make its fd readable "
     "once an image has a fragment to read, or the images change, or the client fails. False "
     "(nothing armed) when a poll would find something now."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject SubscriptionCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.SubscriptionCore",
    .tp_basicsize = sizeof(SubscriptionCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The image set, polls and waits behind Subscription.",
    .tp_members = sub_members,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sub_init,
    .tp_dealloc = (destructor)sub_dealloc,
    .tp_traverse = (traverseproc)sub_traverse,
    .tp_clear = (inquiry)sub_clear,
    .tp_methods = sub_methods,
    .tp_getset = sub_getset,
};

/* ====================================================================================== */
/* FragmentAssembler: reassembly of fragmented messages, per session                       */
/* ====================================================================================== */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *delegate;
    PyObject *builders;       /* dict: session id -> bytearray of the message so far */
} Assembler;

static PyTypeObject AssemblerType;

/* The flags and session id of a Header (or of any object with those attributes). */
static int header_fields(PyObject *header, int *flags, int32_t *session_id)
{
    if (PyObject_TypeCheck(header, &HeaderType)) {
        *flags = ((Header *)header)->bytes[FLAGS_OFFSET];
        *session_id = rd_i32(((Header *)header)->bytes + SESSION_ID_OFFSET);
        return 0;
    }
    PyObject *f = PyObject_GetAttrString(header, "flags");
    PyObject *s = f ? PyObject_GetAttrString(header, "session_id") : NULL;
    long fv = f ? PyLong_AsLong(f) : -1, sv = s ? PyLong_AsLong(s) : -1;
    Py_XDECREF(f);
    Py_XDECREF(s);
    if (PyErr_Occurred())
        return -1;
    *flags = (int)fv;
    *session_id = (int32_t)sv;
    return 0;
}

static int append_buffer(PyObject *bytearray, PyObject *buffer)
{
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return -1;
    Py_ssize_t old = PyByteArray_GET_SIZE(bytearray);
    int rc = PyByteArray_Resize(bytearray, old + view.len);
    if (rc == 0)
        memcpy(PyByteArray_AS_STRING(bytearray) + old, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return rc;
}

static PyObject *assembler_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    Assembler *self = (Assembler *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a fragment handler takes (buffer, header)");
        return NULL;
    }
    int flags;
    int32_t session_id;
    if (header_fields(args[1], &flags, &session_id) < 0)
        return NULL;
    flags &= UNFRAGMENTED;
    if (flags == UNFRAGMENTED)
        return PyObject_Vectorcall(self->delegate, args, 2, NULL);
    PyObject *key = PyLong_FromLong(session_id);
    if (key == NULL)
        return NULL;
    PyObject *result = NULL;
    if (flags & BEGIN_FLAG) {
        PyObject *builder = PyByteArray_FromStringAndSize(NULL, 0);
        if (builder != NULL && append_buffer(builder, args[0]) == 0 &&
            PyDict_SetItem(self->builders, key, builder) == 0)
            result = Py_NewRef(Py_None);
        Py_XDECREF(builder);
        Py_DECREF(key);
        return result;
    }
    PyObject *builder = PyDict_GetItemWithError(self->builders, key);  /* borrowed */
    if (builder == NULL) {
        Py_DECREF(key);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;  /* joined in the middle of a message: dropped */
    }
    Py_INCREF(builder);
    if (append_buffer(builder, args[0]) < 0)
        goto done;
    if (!(flags & END_FLAG)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (PyDict_DelItem(self->builders, key) < 0)
        goto done;
    PyObject *view = PyMemoryView_FromObject(builder);
    if (view == NULL)
        goto done;
    PyObject *call_args[2] = {view, args[1]};
    result = PyObject_Vectorcall(self->delegate, call_args, 2, NULL);
    Py_DECREF(view);
done:
    Py_DECREF(builder);
    Py_DECREF(key);
    return result;
}

static int assembler_init(Assembler *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"delegate", NULL};
    PyObject *delegate;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &delegate))
        return -1;
    if (!PyCallable_Check(delegate)) {
        PyErr_SetString(PyExc_TypeError, "the delegate must be callable (buffer, header)");
        return -1;
    }
    Py_XSETREF(self->delegate, Py_NewRef(delegate));
    Py_XSETREF(self->builders, PyDict_New());
    if (self->builders == NULL)
        return -1;
    self->vectorcall = assembler_vectorcall;
    return 0;
}

static PyObject *assembler_free_session(Assembler *self, PyObject *session_id)
{
    if (self->builders != NULL && PyDict_Contains(self->builders, session_id) == 1 &&
        PyDict_DelItem(self->builders, session_id) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int assembler_traverse(Assembler *self, visitproc visit, void *arg)
{
    Py_VISIT(self->delegate);
    Py_VISIT(self->builders);
    return 0;
}

static int assembler_clear(Assembler *self)
{
    Py_CLEAR(self->delegate);
    Py_CLEAR(self->builders);
    return 0;
}

static void assembler_dealloc(Assembler *self)
{
    PyObject_GC_UnTrack(self);
    assembler_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef assembler_members[] = {
    {"delegate", T_OBJECT, offsetof(Assembler, delegate), READONLY,
     "the handler that gets whole messages"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef assembler_methods[] = {
    {"free_session", (PyCFunction)assembler_free_session, METH_O,
     "free_session(session_id): forget a partial message of a session that went away"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject AssemblerType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.FragmentAssembler",
    .tp_basicsize = sizeof(Assembler),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "FragmentAssembler(delegate): a fragment handler that calls delegate(buffer, "
              "header) once per whole message.\n\nUnfragmented messages pass straight through "
              "(zero copy). Fragments are copied into a per-session buffer until the E flag "
              "arrives; the delegate then gets a memoryview of the whole message and the header "
              "of the last fragment. A fragment without a begun message (joined mid-message) is "
              "dropped.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)assembler_init,
    .tp_dealloc = (destructor)assembler_dealloc,
    .tp_traverse = (traverseproc)assembler_traverse,
    .tp_clear = (inquiry)assembler_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Assembler, vectorcall),
    .tp_members = assembler_members,
    .tp_methods = assembler_methods,
};

/* ====================================================================================== */
/* Heartbeat: a native thread that keeps a client alive without the GIL                    */
/* ====================================================================================== */

typedef struct {
    PyObject_HEAD
    Py_buffer view;           /* our own export of the mapping: it cannot be unmapped under us */
    int has_view;
    int64_t *slot;
    int64_t owner_id;         /* the registration id the counter holds while it is ours */
    int64_t interval_ns;
    int running;              /* atomic: 1 while the thread should run */
    int started;
    pid_t owner_pid;          /* a forked child has no thread to stop */
    pthread_t thread;
} Heartbeat;

static int64_t epoch_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void *heartbeat_run(void *arg)
{
    Heartbeat *self = arg;
    int64_t last = LOAD_ACQUIRE(self->slot);
    while (LOAD_ACQUIRE(&self->running)) {
        /* the driver timed the client out (this process was stopped past its liveness) and
         * may have handed the counter to someone else: never write it again */
        int64_t now = epoch_ms();
        if (LOAD_ACQUIRE(self->slot + 1) != self->owner_id ||
            !__atomic_compare_exchange_n(self->slot, &last, now, 0, __ATOMIC_RELEASE,
                                         __ATOMIC_RELAXED))
            break;
        last = now;
        int64_t left = self->interval_ns;
        while (left > 0 && LOAD_ACQUIRE(&self->running)) {
            int64_t step = left < 20000000 ? left : 20000000;
            struct timespec ts = {0, (long)step};
            nanosleep(&ts, NULL);
            left -= step;
        }
    }
    return NULL;
}

static void heartbeat_stop_thread(Heartbeat *self)
{
    if (self->started && self->owner_pid == getpid()) {
        STORE_RELEASE(&self->running, 0);
        Py_BEGIN_ALLOW_THREADS
        pthread_join(self->thread, NULL);
        Py_END_ALLOW_THREADS
    }
    self->started = 0;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
}

static int heartbeat_init(Heartbeat *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", "offset", "interval", "owner_id", NULL};
    PyObject *buffer;
    Py_ssize_t offset;
    double interval;
    long long owner_id;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!ndL", kwlist, &AtomicBufferType, &buffer,
                                     &offset, &interval, &owner_id))
        return -1;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "heartbeat already started");
        return -1;
    }
    AtomicBuffer *ab = (AtomicBuffer *)buffer;
    if (ab_check(ab, offset, 16, 8) < 0)
        return -1;
    if (!(interval > 0.0 && interval < 3600.0)) {
        PyErr_Format(PyExc_ValueError, "heartbeat interval %f s is not in (0, 3600)", interval);
        return -1;
    }
    if (PyObject_GetBuffer(ab->view.obj, &self->view, PyBUF_WRITABLE) < 0)
        return -1;
    self->has_view = 1;
    self->slot = (int64_t *)((uint8_t *)self->view.buf + (ab->data - (uint8_t *)ab->view.buf) +
                             offset);
    self->interval_ns = (int64_t)(interval * 1e9);
    self->owner_id = owner_id;
    self->owner_pid = getpid();
    STORE_RELEASE(self->slot, epoch_ms());
    self->running = 1;
    if (pthread_create(&self->thread, NULL, heartbeat_run, self) != 0) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
        PyErr_SetString(PyExc_OSError, "cannot start the heartbeat thread");
        return -1;
    }
    self->started = 1;
    return 0;
}

static PyObject *heartbeat_stop(Heartbeat *self, PyObject *Py_UNUSED(ignored))
{
    heartbeat_stop_thread(self);
    Py_RETURN_NONE;
}

static void heartbeat_dealloc(Heartbeat *self)
{
    heartbeat_stop_thread(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *heartbeat_get_running(Heartbeat *self, void *c)
{ return PyBool_FromLong(self->started && self->owner_pid == getpid()); }

static PyMethodDef heartbeat_methods[] = {
    {"stop", (PyCFunction)heartbeat_stop, METH_NOARGS,
     "stop(): stop the thread and let go of the buffer. Idempotent; a no-op after fork."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef heartbeat_getset[] = {
    {"running", (getter)heartbeat_get_running, NULL, "True while the thread runs", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject HeartbeatType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.Heartbeat",
    .tp_basicsize = sizeof(Heartbeat),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Heartbeat(buffer, offset, interval): a thread (no GIL) that stores the epoch time "
              "in ms at buffer[offset] every interval seconds until stop().",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)heartbeat_init,
    .tp_dealloc = (destructor)heartbeat_dealloc,
    .tp_methods = heartbeat_methods,
    .tp_getset = heartbeat_getset,
};

static PyObject *native_epoch_ms(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(epoch_ms());
}

static PyObject *native_acquire_fence(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    Py_RETURN_NONE;
}

static PyObject *native_release_fence(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    __atomic_thread_fence(__ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *native_full_fence(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyMethodDef native_functions[] = {
    {"epoch_ms", native_epoch_ms, METH_NOARGS, "epoch_ms() -> int: the clock heartbeats use"},
    {"acquire_fence", native_acquire_fence, METH_NOARGS,
     "acquire_fence(): loads before it are not reordered with loads and stores after it"},
    {"release_fence", native_release_fence, METH_NOARGS,
     "release_fence(): loads and stores before it are not reordered with stores after it"},
    {"full_fence", native_full_fence, METH_NOARGS, "full_fence(): a sequentially consistent fence"},
    {NULL, NULL, 0, NULL},
};

/* ====================================================================================== */
/* netbridge wire helpers: the per-frame loops of the UDP sender and receiver              */
/* ====================================================================================== */
/*
 * term_scan        the sender's scan of committed frames from a term offset (one datagram's
 *                  worth), instead of a Python loop over frame headers.
 * validate_datagram the receiver's check of every frame header of a DATA/PAD datagram against
 *                  its place in the term, instead of a Python loop over headers.
 * insert_frames    the receiver's copy of validated frames into an image term, the first
 *                  frame's length last with a release store (Aeron's TermRebuilder.insert).
 *
 * All three are bounds-checked against the buffers they are given: bad arguments raise
 * IndexError/ValueError and a bad datagram is an error code, never a read or write outside a
 * buffer. Frames are read as the log layout above says (little-endian 32-byte headers).
 */

#define WIRE_INVALID (-1)

static inline int64_t align_frame(int64_t length)
{
    return (length + FRAME_ALIGNMENT - 1) & ~(int64_t)(FRAME_ALIGNMENT - 1);
}

/* Committed whole frames of `term` from term_offset on (see term_scan below): sets *available
 * to the bytes of them to send and *padding to the bytes skipped after them. */
static void scan_frames(const uint8_t *term, int64_t term_length, int64_t term_offset,
                        int64_t max_length, int64_t stop, int64_t *available, int64_t *padding)
{
    int64_t sent = 0, skipped = 0;
    if (stop > term_length)
        stop = term_length;
    while (sent < max_length) {
        int64_t offset = term_offset + sent;
        if (offset >= stop)
            break;
        int32_t frame_length = LOAD_ACQUIRE((const int32_t *)(term + offset));
        if (frame_length <= 0)
            break;
        int64_t aligned = align_frame(frame_length);
        if (offset + aligned > term_length)
            break; /* not a frame this log could hold: never step past the term */
        if (rd_u16(term + offset + TYPE_OFFSET) == HDR_TYPE_PAD) {
            if (sent + HEADER_LENGTH <= max_length) {
                sent += HEADER_LENGTH;
                skipped = aligned - HEADER_LENGTH;
            }
            break;
        }
        if (sent + aligned > max_length)
            break;
        sent += aligned;
    }
    *available = sent;
    *padding = skipped;
}

/* term_scan(buffer, term_start, term_length, term_offset, max_length, stop) -> (length, padding)
 *
 * Committed whole frames of the term at buffer[term_start : term_start + term_length], from
 * term_offset on: `length` is how many bytes of them to send, `padding` the bytes skipped after
 * them. Stops at an uncommitted frame (length <= 0, read with acquire), before a frame that
 * would take the scan past max_length or past the end of the term, at a frame starting at or
 * after `stop`, and after a PAD frame: a PAD is sent as its 32-byte header and the rest of its
 * (aligned) length is the returned padding. */
static PyObject *native_term_scan(PyObject *m, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t term_start, term_length, term_offset, max_length, stop;
    if (!PyArg_ParseTuple(args, "O!nnnnn", &AtomicBufferType, &obj, &term_start, &term_length,
                          &term_offset, &max_length, &stop))
        return NULL;
    AtomicBuffer *ab = (AtomicBuffer *)obj;
    if (term_length <= 0 || term_length % FRAME_ALIGNMENT) {
        PyErr_Format(PyExc_ValueError, "term length %zd is not a positive multiple of %d",
                     term_length, FRAME_ALIGNMENT);
        return NULL;
    }
    if (ab_check(ab, term_start, term_length, 8) < 0)
        return NULL;
    if (term_offset < 0 || term_offset > term_length || term_offset % FRAME_ALIGNMENT) {
        PyErr_Format(PyExc_IndexError, "term offset %zd is not a 32-byte aligned offset in a "
                     "term of %zd bytes", term_offset, term_length);
        return NULL;
    }
    int64_t available, padding;
    scan_frames(ab->data + term_start, term_length, term_offset, max_length, stop, &available,
                &padding);
    return Py_BuildValue("LL", (long long)available, (long long)padding);
}

/* validate_datagram(datagram, term_offset, session_id, stream_id, term_id, term_length, below)
 *     -> (end, span, skip), or WIRE_INVALID (-1)
 *
 * Walks every frame of a DATA/PAD datagram whose first frame is at term_offset of term
 * term_id: each header must have version 0, type DATA (length >= 32, within the datagram) or
 * PAD (length >= 32; it ends the datagram, sent as its header), the session, stream and term
 * id given, and its own term offset = term_offset + its place in the datagram; the frames
 * (a PAD with its whole length) must end inside the term. `end` is the bytes of the datagram to
 * copy, `span` the bytes of the stream it covers, `skip` the leading bytes of frames that end
 * at or below `below` (the rebuild position minus the datagram's position: frames already in
 * the log, not rewritten). A heartbeat (DATA of length 0) is not for this function: invalid. */
/* validate_datagram's walk: 1 and (*end, *span_out, *skip_out) if every frame is valid. */
static int validate_frames(const uint8_t *d, int64_t size, int64_t term_offset,
                           int32_t session_id, int32_t stream_id, int32_t term_id,
                           int64_t term_length, int64_t below, int64_t *end, int64_t *span_out,
                           int64_t *skip_out)
{
    int64_t offset = 0, skip = 0, span = 0;
    int valid = term_offset >= 0 && term_offset < term_length && term_length > 0 &&
                term_offset % FRAME_ALIGNMENT == 0 && size >= HEADER_LENGTH;
    while (valid) {
        const uint8_t *h = d + offset;
        int32_t frame_length = rd_i32(h + FRAME_LENGTH_OFFSET);
        uint16_t type = rd_u16(h + TYPE_OFFSET);
        if (h[VERSION_OFFSET] != 0 || rd_i32(h + TERM_OFFSET_OFFSET) != term_offset + offset ||
            rd_i32(h + SESSION_ID_OFFSET) != session_id ||
            rd_i32(h + STREAM_ID_OFFSET) != stream_id || rd_i32(h + TERM_ID_OFFSET) != term_id ||
            frame_length < HEADER_LENGTH) {
            valid = 0;
            break;
        }
        int64_t aligned = align_frame(frame_length);
        if (type == HDR_TYPE_DATA) {
            if (offset + frame_length > size) {
                valid = 0;
                break;
            }
            if (skip == offset && offset + aligned <= below)
                skip = offset + aligned;
            offset += aligned;
            span = offset;
        } else if (type == HDR_TYPE_PAD) {
            if (skip == offset && offset + aligned <= below)
                skip = offset + HEADER_LENGTH;
            span = offset + aligned;
            offset += HEADER_LENGTH;
            break;
        } else {
            valid = 0;
            break;
        }
        if (offset >= size)
            break;
        if (size - offset < HEADER_LENGTH) {
            valid = 0;
            break;
        }
    }
    if (!valid || term_offset + span > term_length)
        return 0;
    *end = offset < size ? offset : size;
    *span_out = span;
    *skip_out = skip;
    return 1;
}

static PyObject *native_validate_datagram(PyObject *m, PyObject *args)
{
    Py_buffer view;
    Py_ssize_t term_offset, term_length;
    int session_id, stream_id, term_id;
    long long below;
    if (!PyArg_ParseTuple(args, "y*niiinL", &view, &term_offset, &session_id, &stream_id,
                          &term_id, &term_length, &below))
        return NULL;
    int64_t end, span, skip;
    int valid = validate_frames((const uint8_t *)view.buf, view.len, term_offset, session_id,
                                stream_id, term_id, term_length, below, &end, &span, &skip);
    PyBuffer_Release(&view);
    if (!valid)
        return PyLong_FromLong(WIRE_INVALID);
    return Py_BuildValue("LLL", (long long)end, (long long)span, (long long)skip);
}

/* insert_frames(buffer, at, datagram, start, end) -> bytes inserted (end - start)
 *
 * Copies datagram[start:end] (whole frames) to buffer[at:], the first frame's 4-byte length
 * last with a release store, so a reader that sees that length sees every byte after it. */
static PyObject *native_insert_frames(PyObject *m, PyObject *args)
{
    PyObject *obj;
    Py_ssize_t at, start, end;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "O!ny*nn", &AtomicBufferType, &obj, &at, &view, &start, &end))
        return NULL;
    AtomicBuffer *ab = (AtomicBuffer *)obj;
    if (start < 0 || end > view.len || end - start < 4) {
        PyErr_Format(PyExc_IndexError, "frames [%zd, %zd) are not inside a datagram of %zd "
                     "bytes (or shorter than a frame length)", start, end, view.len);
        PyBuffer_Release(&view);
        return NULL;
    }
    if (ab_check(ab, at, end - start, 4) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *src = (const uint8_t *)view.buf + start;
    memcpy(ab->data + at + 4, src + 4, (size_t)(end - start - 4));
    STORE_RELEASE((int32_t *)(ab->data + at), rd_i32(src));
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(end - start);
}


/* ====================================================================================== */
/* Waiting and flow control from Python: the driver, the client conductor, subscriptions    */
/* ====================================================================================== */

static int word_at(PyObject *buffer, Py_ssize_t offset, int32_t **word)
{
    if (!PyObject_TypeCheck(buffer, &AtomicBufferType)) {
        PyErr_SetString(PyExc_TypeError, "a wake-up word must live in an AtomicBuffer");
        return -1;
    }
    if (ab_check((AtomicBuffer *)buffer, offset, 4, 4) < 0)
        return -1;
    *word = (int32_t *)(((AtomicBuffer *)buffer)->data + offset);
    return 0;
}

/* signal_word(buffer, offset): bump the word and wake everyone asleep on it (always a
 * syscall: for rare events such as commands to the driver and broadcasts to clients). */
static PyObject *native_signal_word(PyObject *m, PyObject *args)
{
    PyObject *buffer;
    Py_ssize_t offset;
    int32_t *word;
    if (!PyArg_ParseTuple(args, "On", &buffer, &offset) || word_at(buffer, offset, &word) < 0)
        return NULL;
    __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    Py_RETURN_NONE;
}

/* wait_word(buffer, offset, expected, timeout_s): sleep, without the GIL, while the word holds
 * `expected` (read before the caller checked its condition), at most timeout_s seconds. */
static PyObject *native_wait_word(PyObject *m, PyObject *args)
{
    PyObject *buffer;
    Py_ssize_t offset;
    int expected;
    double timeout;
    int32_t *word;
    if (!PyArg_ParseTuple(args, "Onid", &buffer, &offset, &expected, &timeout) ||
        word_at(buffer, offset, &word) < 0)
        return NULL;
    int64_t ns = timeout_to_ns(timeout);
    int32_t value = (int32_t)expected;
    Py_BEGIN_ALLOW_THREADS
    wait_words(&word, &value, 1, ns);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* Sleeps until one of `images` (a tuple of ImageCore; the first 127 count) has a frame at its
 * position, *wake (when not NULL) differs from wake_expected, or timeout_ns passes (< 0:
 * forever). Returns 1 when an image has a frame (or was closed) after the sleep, 0 when none
 * has, -1 with TypeError for an item that is not an image. Writers signal only while someone
 * sleeps (see wake_word). The caller holds the GIL; it is released while asleep. */
static int wait_images(PyObject *images, int32_t *wake, int32_t wake_expected,
                       int64_t timeout_ns)
{
    Py_ssize_t n = PyTuple_GET_SIZE(images);
    if (n > 127) n = 127;
    int32_t *words[128];
    int32_t expected[128];
    ImageCore *sleeping[127];
    int count = 0, slept = 0, ready = 0;
    if (wake != NULL) {
        words[0] = wake;
        expected[0] = wake_expected;
        count = 1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(images, i);
        if (!PyObject_TypeCheck(item, &ImageCoreType)) {
            PyErr_SetString(PyExc_TypeError, "images must be a tuple of Image");
            ready = -1;
            break;
        }
        ImageCore *image = (ImageCore *)item;
        if (image->closed) { ready = 1; continue; }
        __atomic_fetch_add(meta_i32(&image->g, META_DATA_WAITERS), 1, __ATOMIC_SEQ_CST);
        image->sleeping++;
        sleeping[slept++] = image;
        words[count] = meta_i32(&image->g, META_DATA_WAKE);
        expected[count] = LOAD_ACQUIRE(words[count]);
        count++;
    }
    for (int i = 0; i < slept && !ready; i++)
        ready = image_ready(sleeping[i]);
    if (!ready && count > 0) {
        Py_BEGIN_ALLOW_THREADS
        wait_words(words, expected, count, timeout_ns);
        Py_END_ALLOW_THREADS
    } else if (!ready && timeout_ns != 0) {
        /* nothing to sleep on: no images and no wake word */
        int64_t ns = timeout_ns < 0 ? 1000000000LL : timeout_ns;
        struct timespec ts = {(time_t)(ns / 1000000000LL), (long)(ns % 1000000000LL)};
        Py_BEGIN_ALLOW_THREADS
        nanosleep(&ts, NULL);
        Py_END_ALLOW_THREADS
    }
    if (ready >= 0)
        ready = 0;
    for (int i = 0; i < slept; i++) {
        if (sleeping[i]->closed)
            continue;  /* img_close_core took its waiter count back */
        __atomic_fetch_sub(meta_i32(&sleeping[i]->g, META_DATA_WAITERS), 1, __ATOMIC_SEQ_CST);
        sleeping[i]->sleeping--;
        if (ready >= 0)
            ready = ready || image_ready(sleeping[i]);
    }
    return ready;
}

/* wait_for_data(images, timeout_s, wake=None) -> bool: wait_images from Python; wake is
 * (buffer, offset, expected) of a word that also ends the sleep when it changes. */
static PyObject *native_wait_for_data(PyObject *m, PyObject *args)
{
    PyObject *images, *wake = Py_None;
    double timeout;
    if (!PyArg_ParseTuple(args, "O!d|O", &PyTuple_Type, &images, &timeout, &wake))
        return NULL;
    int32_t *word = NULL;
    int value = 0;
    if (wake != Py_None) {
        PyObject *buffer;
        Py_ssize_t offset;
        if (!PyArg_ParseTuple(wake, "Oni", &buffer, &offset, &value) ||
            word_at(buffer, offset, &word) < 0)
            return NULL;
    }
    int ready = wait_images(images, word, value, timeout_to_ns(timeout));
    return ready < 0 ? NULL : PyBool_FromLong(ready);
}

/* The metadata of a log's AtomicBuffer, or NULL with an exception set. */
static uint8_t *log_meta(PyObject *arg, const char *caller)
{
    if (!PyObject_TypeCheck(arg, &AtomicBufferType)) {
        PyErr_Format(PyExc_TypeError, "%s takes a log's AtomicBuffer", caller);
        return NULL;
    }
    AtomicBuffer *log = (AtomicBuffer *)arg;
    if (log->capacity < LOG_META_DATA_LENGTH) {
        PyErr_SetString(PyExc_ValueError, "the buffer is shorter than a log's metadata");
        return NULL;
    }
    return log->data + log->capacity - LOG_META_DATA_LENGTH;
}

/* wake_log_readers(log_buffer): wake readers asleep on a log whose frames were written by
 * other means than PublicationCore (the netbridge's insert_frames). */
static PyObject *native_wake_log_readers(PyObject *m, PyObject *arg)
{
    uint8_t *meta = log_meta(arg, "wake_log_readers");
    if (meta == NULL)
        return NULL;
    wake_word((int32_t *)(meta + META_DATA_WAKE), (int32_t *)(meta + META_DATA_WAITERS));
    Py_RETURN_NONE;
}

/* wake_log_writers(log_buffer): wake publishers asleep on a log whose limit a position other
 * than a subscriber's holds back (the netbridge sender's, after it moved). */
static PyObject *native_wake_log_writers(PyObject *m, PyObject *arg)
{
    uint8_t *meta = log_meta(arg, "wake_log_writers");
    if (meta == NULL)
        return NULL;
    wake_word((int32_t *)(meta + META_PROGRESS_WAKE), (int32_t *)(meta + META_PROGRESS_WAITERS));
    Py_RETURN_NONE;
}

static int log_geometry_arg(PyObject *log, int term_length, LogGeometry *g)
{
    if (!PyObject_TypeCheck(log, &AtomicBufferType)) {
        PyErr_SetString(PyExc_TypeError, "the log must be an AtomicBuffer");
        return -1;
    }
    return geometry_from((AtomicBuffer *)log, term_length, 0, g);
}

/* flow_control_set(log_buffer, term_length, counter_ids): the driver publishes which position
 * counters count for this log's limit (seqlock; the driver is the only writer). */
static PyObject *native_flow_control_set(PyObject *m, PyObject *args)
{
    PyObject *log, *ids;
    int term_length;
    LogGeometry g;
    if (!PyArg_ParseTuple(args, "OiO", &log, &term_length, &ids) ||
        log_geometry_arg(log, term_length, &g) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(ids, "counter_ids must be a sequence of counter ids");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > FC_MAX_COUNTED) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%zd positions count for one log; at most %d may",
                     n, FC_MAX_COUNTED);
        return NULL;
    }
    int32_t values[FC_MAX_COUNTED];
    for (Py_ssize_t i = 0; i < n; i++) {
        long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (v == -1 && PyErr_Occurred()) { Py_DECREF(seq); return NULL; }
        values[i] = (int32_t)v;
    }
    Py_DECREF(seq);
    int32_t *version = meta_i32(&g, META_FC_VERSION);
    int32_t v = __atomic_load_n(version, __ATOMIC_RELAXED);
    STORE_RELEASE(version, v + 1);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    int32_t *dst = meta_i32(&g, META_FC_COUNTER_IDS);
    for (Py_ssize_t i = 0; i < n; i++)
        __atomic_store_n(dst + i, values[i], __ATOMIC_RELAXED);
    __atomic_store_n(meta_i32(&g, META_FC_COUNT), (int32_t)n, __ATOMIC_RELAXED);
    STORE_RELEASE(version, v + 2);
    Py_RETURN_NONE;
}

/* flow_control_advance(log_buffer, term_length, limit_buffer, limit_offset, slowest, mode)
 * -> bool: clean behind `slowest` and move the limit by mode (0 raise, 1 pull back, 2 clean
 * only; see fc_advance). False when another process holds the flow-control lock: try again. */
static PyObject *native_flow_control_advance(PyObject *m, PyObject *args)
{
    PyObject *log, *limit_buffer;
    int term_length, mode;
    Py_ssize_t limit_offset;
    long long slowest;
    LogGeometry g;
    if (!PyArg_ParseTuple(args, "OiOnLi", &log, &term_length, &limit_buffer, &limit_offset,
                          &slowest, &mode) ||
        log_geometry_arg(log, term_length, &g) < 0)
        return NULL;
    if (mode < FC_RAISE || mode > FC_CLEAN_ONLY) {
        PyErr_Format(PyExc_ValueError, "flow-control mode %d is not 0, 1 or 2", mode);
        return NULL;
    }
    int64_t *limit = position_ptr(limit_buffer, limit_offset);
    if (limit == NULL)
        return NULL;
    return PyBool_FromLong(fc_advance(&g, limit, (int64_t)slowest, mode, -1));
}

static PyMethodDef netbridge_wire_functions[] = {
    {"term_scan", native_term_scan, METH_VARARGS,
     "term_scan(buffer, term_start, term_length, term_offset, max_length, stop) -> (length, "
     "padding): committed whole frames to send from term_offset (see _native.c)"},
    {"validate_datagram", native_validate_datagram, METH_VARARGS,
     "validate_datagram(datagram, term_offset, session_id, stream_id, term_id, term_length, "
     "below) -> (end, span, skip) or -1 if any frame header is invalid (see _native.c)"},
    {"insert_frames", native_insert_frames, METH_VARARGS,
     "insert_frames(buffer, at, datagram, start, end) -> int: copy datagram[start:end] to "
     "buffer[at:], the first frame's length last with a release store"},
    {"wake_log_readers", native_wake_log_readers, METH_O,
     "wake_log_readers(log_buffer): wake readers asleep on the log (after insert_frames)"},
    {"wake_log_writers", native_wake_log_writers, METH_O,
     "wake_log_writers(log_buffer): wake publishers asleep on the log (after the sender "
     "position moved)"},
    {"signal_word", native_signal_word, METH_VARARGS,
     "signal_word(buffer, offset): bump a wake-up word and wake its sleepers"},
    {"wait_word", native_wait_word, METH_VARARGS,
     "wait_word(buffer, offset, expected, timeout_s): sleep while the word holds expected"},
    {"wait_for_data", native_wait_for_data, METH_VARARGS,
     "wait_for_data(images, timeout_s, wake=None) -> bool: sleep until an image has a frame"},
    {"flow_control_set", native_flow_control_set, METH_VARARGS,
     "flow_control_set(log_buffer, term_length, counter_ids): the positions that count"},
    {"flow_control_advance", native_flow_control_advance, METH_VARARGS,
     "flow_control_advance(log_buffer, term_length, limit_buffer, limit_offset, slowest, "
     "mode) -> bool: clean behind slowest; mode 0 raises pub-lmt, 1 pulls it back, 2 leaves it"},
    {NULL, NULL, 0, NULL},
};

/* ====================================================================================== */
/* Subscription groups: competing consumers claim whole messages at a shared position     */
/* ====================================================================================== */

/*
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
 * run. `*bad` is set if a frame length is out of bounds (stale or corrupt). */
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
        int32_t length = LOAD_ACQUIRE((int32_t *)frame);
        if (!frame_ok(image, frame, offset, length, position)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_RuntimeError, "a claimed message was overwritten: the "
                                "writer lapped this member (it was dropped as dead)");
            return -1;
        }
        position += ALIGN(length, FRAME_ALIGNMENT);
        if (rd_u16(frame + TYPE_OFFSET) == HDR_TYPE_PAD)
            continue;
        int last = (frame[FLAGS_OFFSET] & END_FLAG) != 0;
        if (!failed) {
            fragments++;
            PyObject *r = deliver(image, handler, frame, length);
            if (r == NULL)
                failed = 1;  /* the message counts as done: skip its other fragments */
            else
                Py_DECREF(r);
        }
        if (last) {
            STORE_RELEASE(self->start, position >= end ? (int64_t)GROUP_IDLE : position);
            if (failed || image->closed || position >= end)
                break;  /* once closed the log may be gone: the record keeps the rest */
        }
    }
    if (position >= end && !image->closed)
        group_go_idle(self);
    return failed ? -1 : fragments;
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
    int64_t start = LOAD_ACQUIRE(self->start);
    if (start == GROUP_IDLE || start >= LOAD_ACQUIRE(self->end)) {
        int claimed = group_take_orphan(self);
        if (!claimed)
            claimed = group_claim(self, limit);
        if (claimed <= 0)
            return claimed < 0 ? NULL : PyLong_FromLong(0);
    }
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
    int r = img_init(&self->image, base_args, NULL);
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
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef group_methods[] = {
    {"poll", (PyCFunction)(void (*)(void))group_poll, METH_FASTCALL,
     "poll(handler, fragment_limit) -> int\n\nDeliver this member's claim to handler(buffer, "
     "header): the rest of an unfinished one, else the group's orphan, else a new run of whole "
     "messages (up to fragment_limit fragments, more to finish a fragmented message). Each "
     "message is done once its last fragment's handler returns (or raises: the exception "
     "propagates, the rest of the claim stays this member's). Returns the fragments."},
    {"controlled_poll", (PyCFunction)group_refuse, METH_VARARGS, NULL},
    {"_scan", (PyCFunction)group_refuse, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject GroupMemberCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.GroupMemberCore",
    .tp_basicsize = sizeof(GroupMemberCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "One member of a subscription group on one log: claims and delivers whole "
              "messages no other member gets.",
    .tp_base = &ImageCoreType,
    .tp_init = (initproc)group_init,
    .tp_dealloc = (destructor)img_dealloc,
    .tp_traverse = (traverseproc)img_traverse,
    .tp_clear = (inquiry)img_clear,
    .tp_methods = group_methods,
    .tp_getset = group_getset,
};

/* ====================================================================================== */
/* netbridge datagram batches: recvmmsg/sendmmsg, in-order receive, the publication watcher */
/* ====================================================================================== */
/*
 * receive_batch    one recvmmsg into a batch of slots; DATA that continues an image exactly
 *                  at its high-water mark (inside its window) is validated and inserted
 *                  here; the first datagram of an image that does not, and every one of that
 *                  image after it, is handed back for the Python receiver (control frames,
 *                  loss, new sessions), so its sans-IO rules see each image's datagrams in the
 *                  order they came (a datagram that names no one image: every one after it).
 * scan_datagrams   the sender's DATA loop: whole datagrams of committed frames from the sender
 *                  position up to its limit, as (buffer offset, length) spans of the log.
 * send_batch       sendmmsg of such spans to one destination, straight from the log.
 * LogWatcher       a thread (no GIL) asleep on logs' wake words that makes an eventfd
 *                  readable once a frame is committed where a sender waits (publication logs'
 *                  data words) or a subscriber reads up to where a status message falls due
 *                  (image logs' progress words), so the netbridge can block in poll() on its
 *                  sockets and that eventfd. An asyncio subscriber arms one too
 *                  (SubscriptionCore._arm_watcher: its images' data words and its own word).
 * IPv4 only, as the netbridge's transport is.
 */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#define BATCH_MAX 64
#define BATCH_SLOT 65536
/* UDP generic segmentation (Linux 4.18), declared here since libc headers may predate it */
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define GSO_SEGMENTS_MAX 64   /* UDP_MAX_SEGMENTS of the oldest kernels that have it */
#define UDP_PAYLOAD_MAX 65507
#define SEND_SPANS_MAX 1024   /* datagrams per sendmmsg at most */
#define WATCH_MAX 127
#define HDR_TYPE_SETUP 0x05
#define HDR_TYPE_RTTM 0x06

/* (host, port) as the socket module gives a received IPv4 datagram's source */
static PyObject *source_tuple(const struct sockaddr_in *a)
{
    char host[INET_ADDRSTRLEN];
    if (a->sin_family != AF_INET || !inet_ntop(AF_INET, &a->sin_addr, host, sizeof host))
        Py_RETURN_NONE;
    return Py_BuildValue("(si)", host, (int)ntohs(a->sin_port));
}

static int sockaddr_arg(PyObject *destination, struct sockaddr_in *a)
{
    const char *host;
    int port;
    if (!PyArg_ParseTuple(destination, "si", &host, &port))
        return -1;
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    if (port < 0 || port > 65535 || inet_pton(AF_INET, host, &a->sin_addr) != 1) {
        PyErr_Format(PyExc_ValueError, "destination %R is not a numeric IPv4 (host, port)",
                     destination);
        return -1;
    }
    return 0;
}

typedef struct {
    AtomicBuffer *log;
    uint8_t *meta;
    int32_t session_id, stream_id, initial_term_id;
    int64_t term_length;
    int position_bits;
    int64_t position; /* the image's high-water mark: the next in-order datagram starts here */
    int64_t limit;    /* data may not end past this (the image's window) */
    int64_t datagrams, bytes;
    int last;     /* the batch slot of its latest datagram, -1 while none */
    int diverted; /* one of its datagrams went to Python: so do the rest of the batch's */
} InOrderImage;

static int in_order_image_arg(PyObject *item, InOrderImage *image)
{
    PyObject *log;
    int term_length;
    long long position, limit;
    if (!PyTuple_Check(item) ||
        !PyArg_ParseTuple(item, "O!iiiiLL", &AtomicBufferType, &log, &image->session_id,
                          &image->stream_id, &term_length, &image->initial_term_id, &position,
                          &limit))
        return -1;
    LogGeometry g;
    if (geometry_from((AtomicBuffer *)log, term_length, 0, &g) < 0)
        return -1;
    image->log = (AtomicBuffer *)log;
    image->meta = g.meta;
    image->term_length = term_length;
    image->position_bits = g.position_bits;
    image->position = position;
    image->limit = limit;
    image->datagrams = image->bytes = 0;
    image->last = -1;
    image->diverted = 0;
    return 0;
}

/* Inserts datagram d if it is DATA/PAD continuing one of the images exactly at its position,
 * valid (validate_frames) and inside its window; returns that image, or NULL (untouched). */
static InOrderImage *insert_in_order(InOrderImage *images, Py_ssize_t count, const uint8_t *d,
                                     int64_t size)
{
    if (size < HEADER_LENGTH)
        return NULL;
    uint16_t type = rd_u16(d + TYPE_OFFSET);
    if ((type != HDR_TYPE_DATA && type != HDR_TYPE_PAD) ||
        (type == HDR_TYPE_DATA && rd_i32(d + FRAME_LENGTH_OFFSET) == 0))
        return NULL; /* not data, or a heartbeat */
    int32_t session_id = rd_i32(d + SESSION_ID_OFFSET), stream_id = rd_i32(d + STREAM_ID_OFFSET);
    InOrderImage *image = NULL;
    for (Py_ssize_t i = 0; i < count && image == NULL; i++)
        if (images[i].session_id == session_id && images[i].stream_id == stream_id)
            image = &images[i];
    if (image == NULL || image->diverted)
        return NULL;
    int64_t term_offset = rd_i32(d + TERM_OFFSET_OFFSET);
    int32_t term_id = rd_i32(d + TERM_ID_OFFSET);
    int64_t term_length = image->term_length;
    if (term_offset < 0 || term_offset >= term_length)
        return NULL;
    int64_t position = (term_count_between(term_id, image->initial_term_id)
                        << image->position_bits) + term_offset;
    int64_t end, span, skip;
    if (position != image->position ||
        !validate_frames(d, size, term_offset, session_id, stream_id, term_id, term_length, 0,
                         &end, &span, &skip) ||
        position + end > image->limit)
        return NULL;
    int index = (int)((position >> image->position_bits) % PARTITION_COUNT);
    uint8_t *at = image->log->data + index * term_length + term_offset;
    memcpy(at + 4, d + 4, (size_t)(end - 4));
    STORE_RELEASE((int32_t *)at, rd_i32(d));
    image->position = position + span;
    return image;
}

/* The (session, stream) a datagram for Python concerns alone: DATA/PAD (the receiver reads only
 * its first frame), or a datagram of one SETUP or RTTM frame. 0 when it may concern several. */
static int datagram_key(const uint8_t *d, int64_t size, int32_t *session_id, int32_t *stream_id)
{
    if (size < HEADER_LENGTH)
        return 0;
    uint16_t type = rd_u16(d + TYPE_OFFSET);
    if (type == HDR_TYPE_DATA || type == HDR_TYPE_PAD || type == HDR_TYPE_SETUP) {
        if (type == HDR_TYPE_SETUP && rd_i32(d + FRAME_LENGTH_OFFSET) != size)
            return 0;
        *session_id = rd_i32(d + SESSION_ID_OFFSET);
        *stream_id = rd_i32(d + STREAM_ID_OFFSET);
        return 1;
    }
    if (type == HDR_TYPE_RTTM /* session and stream right after its 8-byte header */ &&
        rd_i32(d + FRAME_LENGTH_OFFSET) == size) {
        *session_id = rd_i32(d + 8);
        *stream_id = rd_i32(d + 12);
        return 1;
    }
    return 0;
}

/* receive_batch(fd, slots, images) -> (received, in_order, rest)
 *
 * One recvmmsg (non-blocking) of up to len(slots) // 65536 datagrams (at most 64) into
 * `slots`, 65536 bytes each. `images` is a tuple of (log buffer, session id, stream id, term
 * length, initial term id, position, limit), `position` the end of the highest data placed.
 * Each datagram, in order, that is DATA/PAD of one of them starting exactly at its position,
 * valid, and ending at or below its limit is inserted into its log (the first frame's length
 * last, with a release store) and moves its position; from the first datagram of an image
 * that is not on, none of that image's is (after one that concerns no single image
 * (datagram_key), none at all). `in_order` has one entry per image: None, or (position, datagrams, bytes,
 * source of the latest); `rest` lists the others as (slot offset, length, source), in order.
 * Readers asleep on a log that got data are woken. A socket with nothing to read gives 0;
 * OSError for a bad descriptor. */
static PyObject *native_receive_batch(PyObject *m, PyObject *args)
{
    int fd;
    Py_buffer slots;
    PyObject *image_args;
    if (!PyArg_ParseTuple(args, "iw*O!", &fd, &slots, &PyTuple_Type, &image_args))
        return NULL;
    PyObject *result = NULL, *in_order = NULL, *rest = NULL;
    Py_ssize_t image_count = PyTuple_GET_SIZE(image_args);
    InOrderImage *images = PyMem_Calloc((size_t)(image_count ? image_count : 1),
                                        sizeof(InOrderImage));
    if (images == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < image_count; i++)
        if (in_order_image_arg(PyTuple_GET_ITEM(image_args, i), &images[i]) < 0)
            goto done;
    Py_ssize_t capacity = slots.len / BATCH_SLOT;
    if (capacity > BATCH_MAX)
        capacity = BATCH_MAX;
    if (capacity < 1) {
        PyErr_Format(PyExc_ValueError, "slots of %zd bytes hold no %d-byte slot", slots.len,
                     BATCH_SLOT);
        goto done;
    }
    struct mmsghdr msgs[BATCH_MAX];
    struct iovec iov[BATCH_MAX];
    struct sockaddr_in sources[BATCH_MAX];
    memset(msgs, 0, sizeof(struct mmsghdr) * (size_t)capacity);
    for (Py_ssize_t i = 0; i < capacity; i++) {
        iov[i].iov_base = (uint8_t *)slots.buf + i * BATCH_SLOT;
        iov[i].iov_len = BATCH_SLOT;
        msgs[i].msg_hdr.msg_iov = &iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_name = &sources[i];
        msgs[i].msg_hdr.msg_namelen = sizeof sources[i];
    }
    int received = recvmmsg(fd, msgs, (unsigned)capacity, MSG_DONTWAIT, NULL);
    if (received < 0) {
        if (errno == EBADF || errno == ENOTSOCK || errno == EFAULT || errno == EINVAL) {
            PyErr_SetFromErrno(PyExc_OSError);
            goto done;
        }
        received = 0; /* nothing there, or an ICMP error reported late: not ours to handle */
    }
    if ((in_order = PyTuple_New(image_count)) == NULL || (rest = PyList_New(0)) == NULL)
        goto done;
    int diverted = 0;
    for (int i = 0; i < received; i++) {
        const uint8_t *d = iov[i].iov_base;
        int64_t size = msgs[i].msg_len;
        InOrderImage *image = diverted ? NULL : insert_in_order(images, image_count, d, size);
        if (image != NULL) {
            image->datagrams++;
            image->bytes += size;
            image->last = i;
            continue;
        }
        int32_t session_id, stream_id;
        if (!datagram_key(d, size, &session_id, &stream_id)) {
            diverted = 1;
        } else {
            for (Py_ssize_t j = 0; j < image_count; j++)
                if (images[j].session_id == session_id && images[j].stream_id == stream_id)
                    images[j].diverted = 1;
        }
        PyObject *source = source_tuple(&sources[i]);
        PyObject *entry = source == NULL ? NULL : Py_BuildValue(
            "(nLN)", (Py_ssize_t)(i * BATCH_SLOT), (long long)size, source);
        if (entry == NULL || PyList_Append(rest, entry) < 0) {
            Py_XDECREF(entry);
            goto done;
        }
        Py_DECREF(entry);
    }
    for (Py_ssize_t i = 0; i < image_count; i++) {
        InOrderImage *image = &images[i];
        PyObject *entry;
        if (image->last < 0) {
            entry = Py_NewRef(Py_None);
        } else {
            wake_word((int32_t *)(image->meta + META_DATA_WAKE),
                      (int32_t *)(image->meta + META_DATA_WAITERS));
            PyObject *source = source_tuple(&sources[image->last]);
            entry = source == NULL ? NULL : Py_BuildValue(
                "(LLLN)", (long long)image->position, (long long)image->datagrams,
                (long long)image->bytes, source);
            if (entry == NULL)
                goto done;
        }
        PyTuple_SET_ITEM(in_order, i, entry);
    }
    result = Py_BuildValue("(iOO)", received, in_order, rest);
done:
    Py_XDECREF(in_order);
    Py_XDECREF(rest);
    PyMem_Free(images);
    PyBuffer_Release(&slots);
    return result;
}

/* One datagram of a scan: where it is in the log buffer and how long. */
typedef struct {
    int64_t offset;
    int64_t length;
} Span;

/* What one DATA scan found (see scan_datagrams). */
typedef struct {
    int64_t position; /* where the next scan starts */
    int64_t bytes;    /* the datagrams' total length */
    int count, back_pressured, more;
} Scan;

/* The loop of scan_datagrams over a log whose geometry `g` is checked, into `out` (room for
 * max_datagrams spans). Touches no Python object: runs without the GIL. */
static Scan scan_spans(const LogGeometry *g, int64_t position, int64_t limit, int mtu,
                       int max_datagrams, Span *out)
{
    Scan scan = {.position = position};
    int64_t term_length = g->term_length, mask = term_length - 1;
    for (;;) {
        int64_t window = limit - scan.position;
        int index = (int)((scan.position >> g->position_bits) % PARTITION_COUNT);
        int64_t term_offset = scan.position & mask;
        const uint8_t *term = g->terms + (int64_t)index * term_length;
        int committed = LOAD_ACQUIRE((const int32_t *)(term + term_offset)) > 0;
        if (window <= 0) {
            scan.back_pressured = committed;
            break;
        }
        if (scan.count >= max_datagrams) {
            scan.more = 1;
            break;
        }
        int64_t length, padding;
        scan_frames(term, term_length, term_offset, window < mtu ? window : mtu, term_length,
                    &length, &padding);
        if (length == 0) {
            scan.back_pressured = window < mtu && committed;
            break;
        }
        out[scan.count].offset = (int64_t)index * term_length + term_offset;
        out[scan.count].length = length;
        scan.count++;
        scan.bytes += length;
        scan.position += length + padding;
    }
    return scan;
}

/* scan_datagrams(log_buffer, term_length, position, limit, mtu, max_datagrams)
 *     -> (position, spans, bytes, back_pressured, more)
 *
 * The sender's DATA loop: from stream `position`, datagrams of committed whole frames (see
 * term_scan: at most `mtu` bytes each and never past `limit`; a PAD ends a datagram as its
 * header and the position skips its padding) until the limit, uncommitted data, or
 * `max_datagrams` of them (then `more` is True). `spans` packs each datagram as (offset in the
 * buffer, length), two little-endian int64s; `bytes` is their total length. `back_pressured`: a committed frame waits that the
 * limit leaves no room for. `position` is where the next scan starts. */
static PyObject *native_scan_datagrams(PyObject *m, PyObject *args)
{
    PyObject *obj;
    int term_length, mtu, max_datagrams;
    long long position, limit;
    if (!PyArg_ParseTuple(args, "O!iLLii", &AtomicBufferType, &obj, &term_length, &position,
                          &limit, &mtu, &max_datagrams))
        return NULL;
    LogGeometry g;
    if (geometry_from((AtomicBuffer *)obj, term_length, 0, &g) < 0)
        return NULL;
    if (position < 0 || position % FRAME_ALIGNMENT || mtu < HEADER_LENGTH || max_datagrams < 1 ||
        max_datagrams > 4096) {
        PyErr_Format(PyExc_ValueError, "scan_datagrams: position %lld (a multiple of 32 >= 0), "
                     "mtu %d (>= 32) or max_datagrams %d (1..4096) out of range", position, mtu,
                     max_datagrams);
        return NULL;
    }
    PyObject *spans = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)sizeof(Span) * max_datagrams);
    if (spans == NULL)
        return NULL;
    Scan scan = scan_spans(&g, position, limit, mtu, max_datagrams,
                           (Span *)PyBytes_AS_STRING(spans));
    if (_PyBytes_Resize(&spans, (Py_ssize_t)sizeof(Span) * scan.count) < 0)
        return NULL;
    return Py_BuildValue("(LNLOO)", (long long)scan.position, spans, (long long)scan.bytes,
                         scan.back_pressured ? Py_True : Py_False,
                         scan.more ? Py_True : Py_False);
}

/* Whether this process still sends with UDP_SEGMENT: cleared for good the first time the kernel
 * or the route refuses it (no such option, or a device without checksum offload). */
static int gso_enabled = 1;

/* How many spans from `first` go out as one segmented send: spans of one length (the segment
 * size), and at most one shorter span to end it, within UDP_PAYLOAD_MAX bytes in all. */
static int gso_run(const Span *spans, Py_ssize_t first, Py_ssize_t count)
{
    int64_t size = spans[first].length;
    int64_t total = size;
    int n = 1;
    while (first + n < count && n < GSO_SEGMENTS_MAX) {
        int64_t length = spans[first + n].length;
        if (length > size || total + length > UDP_PAYLOAD_MAX)
            break;
        total += length;
        n++;
        if (length < size)
            break;
    }
    return n;
}

/* Sends `count` spans of `data` to `to` as send_batch does; returns how many went, or -errno
 * when the socket is bad (EBADF, ENOTSOCK). Touches no Python object: runs without the GIL. */
static int send_spans(int fd, uint8_t *data, const Span *spans, Py_ssize_t count,
                      const struct sockaddr_in *to)
{
    int sent = 0;
    struct mmsghdr msgs[BATCH_MAX];
    struct iovec iov[SEND_SPANS_MAX];
    int runs[BATCH_MAX];
    union {
        char buf[CMSG_SPACE(sizeof(uint16_t))];
        struct cmsghdr align;
    } control[BATCH_MAX];
    for (Py_ssize_t first = 0; first < count;) {
        int n = 0, spanned = 0;
        for (Py_ssize_t at = first;
             n < BATCH_MAX && at < count && spanned + GSO_SEGMENTS_MAX <= SEND_SPANS_MAX; n++) {
            int run = gso_enabled ? gso_run(spans, at, count) : 1;
            memset(&msgs[n], 0, sizeof msgs[n]);
            for (int k = 0; k < run; k++) {
                iov[spanned + k].iov_base = data + spans[at + k].offset;
                iov[spanned + k].iov_len = (size_t)spans[at + k].length;
            }
            msgs[n].msg_hdr.msg_iov = &iov[spanned];
            msgs[n].msg_hdr.msg_iovlen = (size_t)run;
            msgs[n].msg_hdr.msg_name = (void *)to;
            msgs[n].msg_hdr.msg_namelen = sizeof *to;
            if (run > 1) {
                memset(&control[n], 0, sizeof control[n]);
                msgs[n].msg_hdr.msg_control = control[n].buf;
                msgs[n].msg_hdr.msg_controllen = sizeof control[n].buf;
                struct cmsghdr *c = CMSG_FIRSTHDR(&msgs[n].msg_hdr);
                c->cmsg_level = IPPROTO_UDP;
                c->cmsg_type = UDP_SEGMENT;
                c->cmsg_len = CMSG_LEN(sizeof(uint16_t));
                uint16_t segment = (uint16_t)spans[at].length;
                memcpy(CMSG_DATA(c), &segment, sizeof segment);
            }
            runs[n] = run;
            spanned += run;
            at += run;
        }
        int done = sendmmsg(fd, msgs, (unsigned)n, MSG_DONTWAIT);
        if (done > 0) {
            for (int k = 0; k < done; k++) {
                sent += runs[k];
                first += runs[k];
            }
        } else if (done < 0 && errno == EINTR) {
            continue;
        } else if (done < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS)) {
            break;
        } else if (done < 0 && (errno == EBADF || errno == ENOTSOCK)) {
            return -errno;
        } else if (runs[0] > 1 && (errno == EINVAL || errno == EIO || errno == ENOPROTOOPT ||
                                   errno == EOPNOTSUPP)) {
            gso_enabled = 0;  /* refused segmentation: send these again, one by one */
        } else {
            first += runs[0]; /* refused (e.g. unreachable): skip it */
        }
    }
    return sent;
}

/* send_batch(fd, buffer, spans, destination) -> datagrams sent
 *
 * Sends each (offset, length) span of `buffer` (as scan_datagrams packs them) as one datagram
 * to `destination`, a numeric IPv4 (host, port), straight from the log, non-blocking. Runs of
 * equal-length spans go as one segmented send each (UDP_SEGMENT: the kernel cuts it into the
 * same datagrams, one trip through the stack for the run), all in one sendmmsg; where the
 * kernel has no segmentation, one datagram per message. A full socket buffer ends the batch
 * (the rest is lost, and NAKed by the receiver as any loss); a datagram the kernel refuses is
 * skipped. ValueError for spans outside the buffer or a bad destination. */
static PyObject *native_send_batch(PyObject *m, PyObject *args)
{
    int fd;
    PyObject *obj, *destination;
    Py_buffer packed;
    if (!PyArg_ParseTuple(args, "iO!y*O", &fd, &AtomicBufferType, &obj, &packed, &destination))
        return NULL;
    AtomicBuffer *ab = (AtomicBuffer *)obj;
    struct sockaddr_in to;
    Py_ssize_t count = packed.len / (Py_ssize_t)sizeof(Span);
    Span *spans = NULL;
    int sent = 0;
    if (sockaddr_arg(destination, &to) < 0 || ab_check(ab, 0, 0, 1) < 0)
        goto fail;
    if (packed.len % (Py_ssize_t)sizeof(Span)) {
        PyErr_Format(PyExc_ValueError, "spans of %zd bytes are not (offset, length) pairs",
                     packed.len);
        goto fail;
    }
    spans = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(Span));
    if (spans == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t offset = rd_i64((const uint8_t *)packed.buf + i * sizeof(Span));
        int64_t length = rd_i64((const uint8_t *)packed.buf + i * sizeof(Span) + 8);
        if (offset < 0 || length <= 0 || length > UDP_PAYLOAD_MAX ||
            offset > ab->capacity - length) {
            PyErr_Format(PyExc_ValueError, "span (%lld, %lld) is not a datagram inside the "
                         "buffer of %zd bytes", (long long)offset, (long long)length,
                         ab->capacity);
            goto fail;
        }
        spans[i].offset = offset;
        spans[i].length = length;
    }
    sent = send_spans(fd, ab->data, spans, count, &to);
    if (sent < 0) {
        errno = -sent;
        PyErr_SetFromErrno(PyExc_OSError);
        goto fail;
    }
    PyMem_Free(spans);
    PyBuffer_Release(&packed);
    return PyLong_FromLong(sent);
fail:
    PyMem_Free(spans);
    PyBuffer_Release(&packed);
    return NULL;
}

/* ---- LogWatcher ----------------------------------------------------------------------------- */

/* One of three kinds: a data watch (frame set), a progress watch (counter set) or a word watch
 * (neither: ready once `wake` differs from `threshold`; its ringer always wakes, so no waiters
 * count). */
typedef struct {
    const int32_t *frame;   /* data watch: the frame length where the reader waits, or NULL */
    const int64_t *counter; /* progress watch: a subscriber position counter */
    int64_t threshold;      /* progress: ready once the counter reaches it; word: the value seen */
    int32_t *wake;          /* the log's META_DATA_WAKE (data) or META_PROGRESS_WAKE, or the word */
    int32_t *waiters;       /* the matching waiters count (NULL for a word watch) */
} Watch;

typedef struct {
    PyObject_HEAD
    int efd;
    int started, closing, armed, busy;
    uint64_t generation;
    int32_t control; /* futex word: bumped to cut the thread's wait short */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int count;
    Watch watches[WATCH_MAX];
    PyObject *held; /* the log buffers of `watches` */
} LogWatcher;

static PyTypeObject LogWatcherType;

static int is_ready(const Watch *w)
{
    if (w->frame != NULL)
        return LOAD_ACQUIRE(w->frame) > 0;
    if (w->counter != NULL)
        return LOAD_ACQUIRE(w->counter) >= w->threshold;
    return LOAD_ACQUIRE(w->wake) != (int32_t)w->threshold;
}

static int watch_ready(const Watch *watches, int count)
{
    for (int i = 0; i < count; i++)
        if (is_ready(&watches[i]))
            return 1;
    return 0;
}

static void watcher_interrupt(LogWatcher *self)
{
    __atomic_fetch_add(&self->control, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, &self->control, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    pthread_cond_broadcast(&self->changed);
}

static void *watcher_main(void *arg)
{
    LogWatcher *self = arg;
    Watch watches[WATCH_MAX];
    int32_t *words[WATCH_MAX + 1];
    int32_t expected[WATCH_MAX + 1];
    pthread_mutex_lock(&self->lock);
    for (;;) {
        while (!self->armed && !self->closing)
            pthread_cond_wait(&self->changed, &self->lock);
        if (self->closing)
            break;
        int count = self->count;
        uint64_t generation = self->generation;
        memcpy(watches, self->watches, sizeof(Watch) * (size_t)count);
        words[0] = &self->control;
        expected[0] = __atomic_load_n(&self->control, __ATOMIC_SEQ_CST);
        self->busy = 1;
        pthread_mutex_unlock(&self->lock);

        for (int i = 0; i < count; i++) {
            if (watches[i].waiters != NULL)
                __atomic_fetch_add(watches[i].waiters, 1, __ATOMIC_SEQ_CST);
            words[i + 1] = watches[i].wake;
            expected[i + 1] = LOAD_ACQUIRE(watches[i].wake);
        }
        if (!watch_ready(watches, count))
            wait_words(words, expected, count + 1, -1);
        for (int i = 0; i < count; i++)
            if (watches[i].waiters != NULL)
                __atomic_fetch_sub(watches[i].waiters, 1, __ATOMIC_SEQ_CST);
        int ready = watch_ready(watches, count);

        pthread_mutex_lock(&self->lock);
        self->busy = 0;
        pthread_cond_broadcast(&self->changed);
        if (ready && self->armed && self->generation == generation) {
            self->armed = 0;
            uint64_t one = 1;
            ssize_t written = write(self->efd, &one, sizeof one);
            (void)written; /* a full eventfd is readable already */
        }
    }
    self->busy = 0;
    pthread_cond_broadcast(&self->changed);
    pthread_mutex_unlock(&self->lock);
    return NULL;
}

static int log_watcher_init(LogWatcher *self, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":LogWatcher"))
        return -1;
    if (self->started) {
        PyErr_SetString(PyExc_RuntimeError, "LogWatcher is initialized already");
        return -1;
    }
    self->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (self->efd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->changed, NULL);
    int error = pthread_create(&self->thread, NULL, watcher_main, self);
    if (error) {
        close(self->efd);
        self->efd = -1;
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->started = 1;
    return 0;
}

/* Stops the thread watching (synchronously when `wait`: once it returns, the thread touches
 * none of the logs it watched). The lock is held by the caller. */
static void watcher_disarm_locked(LogWatcher *self, int wait)
{
    self->armed = 0;
    self->generation++;
    watcher_interrupt(self);
    while (wait && self->busy)
        pthread_cond_wait(&self->changed, &self->lock);
}

/* Replaces the watches (armed when there are any), keeping `held` (a new reference: what owns
 * the watched memory) until the next. */
static void watcher_set(LogWatcher *self, const Watch *watches, int count, PyObject *held)
{
    pthread_mutex_lock(&self->lock);
    PyObject *previous = self->held;
    memcpy(self->watches, watches, sizeof(Watch) * (size_t)count);
    self->count = count;
    self->held = held;
    self->generation++;
    self->armed = count > 0;
    watcher_interrupt(self);
    pthread_mutex_unlock(&self->lock);
    Py_XDECREF(previous);
}

/* A data watch (log buffer, term length, position) or a progress watch (log buffer, term
 * length, counter buffer, counter offset, threshold). */
static int watch_arg(PyObject *item, int progress, Watch *w)
{
    PyObject *log, *counters = NULL;
    int term_length;
    long long position;
    Py_ssize_t offset = 0;
    LogGeometry g;
    if (!PyTuple_Check(item) ||
        !(progress ? PyArg_ParseTuple(item, "O!iOnL", &AtomicBufferType, &log, &term_length,
                                      &counters, &offset, &position)
                   : PyArg_ParseTuple(item, "O!iL", &AtomicBufferType, &log, &term_length,
                                      &position)) ||
        geometry_from((AtomicBuffer *)log, term_length, 0, &g) < 0)
        return -1;
    if (position < 0 || (!progress && position % FRAME_ALIGNMENT)) {
        PyErr_Format(PyExc_ValueError, "position %lld is not a%s >= 0", position,
                     progress ? " position" : " multiple of 32");
        return -1;
    }
    memset(w, 0, sizeof *w);
    if (progress) {
        if ((w->counter = position_ptr(counters, offset)) == NULL)
            return -1;
        w->threshold = position;
        w->wake = meta_i32(&g, META_PROGRESS_WAKE);
        w->waiters = meta_i32(&g, META_PROGRESS_WAITERS);
    } else {
        int index = (int)((position >> g.position_bits) % PARTITION_COUNT);
        w->frame = (const int32_t *)(term_at(&g, index) + (position & (term_length - 1)));
        w->wake = meta_i32(&g, META_DATA_WAKE);
        w->waiters = meta_i32(&g, META_DATA_WAITERS);
    }
    return 0;
}

static PyObject *log_watcher_arm(LogWatcher *self, PyObject *args)
{
    PyObject *lists[2];
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &lists[0], &PyTuple_Type, &lists[1]))
        return NULL;
    if (!self->started || self->closing) {
        PyErr_SetString(PyExc_ValueError, "LogWatcher is closed");
        return NULL;
    }
    Watch watches[WATCH_MAX];
    int count = 0;
    for (int progress = 0; progress < 2; progress++) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lists[progress]) && count < WATCH_MAX; i++) {
            if (watch_arg(PyTuple_GET_ITEM(lists[progress], i), progress, &watches[count]) < 0)
                return NULL;
            if (!is_ready(&watches[count]))
                count++; /* ready already: its owner has work, or waits on something else */
        }
    }
    PyObject *held = PyTuple_Pack(2, lists[0], lists[1]);
    if (held == NULL)
        return NULL;
    watcher_set(self, watches, count, held);
    Py_RETURN_NONE;
}

static PyObject *log_watcher_disarm(LogWatcher *self, PyObject *args)
{
    int wait = 0;
    if (!PyArg_ParseTuple(args, "|p", &wait))
        return NULL;
    if (!self->started)
        Py_RETURN_NONE;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    watcher_disarm_locked(self, wait);
    pthread_mutex_unlock(&self->lock);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *log_watcher_fileno(LogWatcher *self, PyObject *Py_UNUSED(ignored))
{
    if (self->efd < 0) {
        PyErr_SetString(PyExc_ValueError, "LogWatcher is closed");
        return NULL;
    }
    return PyLong_FromLong(self->efd);
}

static PyObject *log_watcher_clear(LogWatcher *self, PyObject *Py_UNUSED(ignored))
{
    uint64_t value;
    if (self->efd >= 0 && read(self->efd, &value, sizeof value) == (ssize_t)sizeof value)
        Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* ---- FutexRing: a futex wait an event loop can watch ------------------------------------ */

/*
 * An io_uring holding one futex_waitv request (Linux 6.7+): its fd turns readable as soon as
 * one of the words it waits on is woken, so an event loop (asyncio's add_reader, the
 * netbridge's poll) wakes straight from the writer's FUTEX_WAKE, with no thread between them. The LogWatcher thread does the same
 * where io_uring is missing or refused (older kernels, container seccomp profiles), one thread
 * hop later. Arming follows the blocking wait's protocol: count this process as a sleeper on
 * each image (image->sleeping too, so a closed image takes its count back), read the words,
 * look for data, then submit; disarm cancels a wait still pending and takes the counts back.
 * Used only by the thread that holds the GIL.
 */
#include <sys/mman.h>

/* The io_uring ABI this needs, declared here: the kernel headers of older build images (the
 * manylinux ones) have no linux/io_uring.h, or one without the futex opcodes (Linux 6.7). */
typedef struct {
    uint8_t opcode, flags;
    uint16_t ioprio;
    int32_t fd;
    uint64_t off, addr;
    uint32_t len, op_flags;
    uint64_t user_data;
    uint16_t buf_index, personality;
    int32_t splice_fd_in;
    uint64_t addr3, pad;
} UringSqe;
typedef struct {
    uint64_t user_data;
    int32_t res;
    uint32_t flags;
} UringCqe;
typedef struct {
    uint32_t head, tail, ring_mask, ring_entries, flags, dropped, array, resv1;
    uint64_t user_addr;
} UringSqOffsets;
typedef struct {
    uint32_t head, tail, ring_mask, ring_entries, overflow, cqes, flags, resv1;
    uint64_t user_addr;
} UringCqOffsets;
typedef struct {
    uint32_t sq_entries, cq_entries, flags, sq_thread_cpu, sq_thread_idle, features, wq_fd;
    uint32_t resv[3];
    UringSqOffsets sq_off;
    UringCqOffsets cq_off;
} UringParams;
_Static_assert(sizeof(UringSqe) == 64 && sizeof(UringCqe) == 16 && sizeof(UringParams) == 120,
               "io_uring ABI");
#define URING_SYS_SETUP 425 /* the same number on every architecture */
#define URING_SYS_ENTER 426
#define URING_SETUP_COOP_TASKRUN (1U << 8)
#define URING_FEAT_SINGLE_MMAP (1U << 0)
#define URING_ENTER_GETEVENTS (1U << 0)
#define URING_OFF_SQ_RING 0ULL
#define URING_OFF_SQES 0x10000000ULL
#define URING_OP_NOP 0
#define URING_OP_ASYNC_CANCEL 14
#define URING_OP_FUTEX_WAITV 53
#define URING_ENTRIES 4

typedef struct {
    PyObject_HEAD
    int fd;
    void *rings;
    size_t rings_size;
    UringSqe *sqes;
    size_t sqes_size;
    uint32_t *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    UringCqe *cqes;
    uint64_t sequence;   /* user_data of the latest wait */
    int pending;         /* the latest wait has not completed */
    PyObject *held;      /* what owns the watched words while armed, or NULL */
    struct {
        int32_t *waiters; /* the waiters count this process is counted in */
        ImageCore *image; /* a subscription's image (its `sleeping` too), or NULL */
    } counted[WATCH_MAX];
    int count;
    struct wait_entry waitv[WATCH_MAX + 1];
} FutexRing;

static PyTypeObject FutexRingType;

static int ring_submit(FutexRing *self, uint8_t opcode, uint64_t addr, uint32_t len,
                       uint64_t user_data, unsigned min_complete)
{
    uint32_t tail = *self->sq_tail, index = tail & *self->sq_mask;
    UringSqe *sqe = &self->sqes[index];
    memset(sqe, 0, sizeof *sqe);
    sqe->opcode = opcode;
    sqe->addr = addr;
    sqe->len = len;
    sqe->user_data = user_data;
    self->sq_array[index] = index;
    __atomic_store_n(self->sq_tail, tail + 1, __ATOMIC_RELEASE);
    long r = syscall(URING_SYS_ENTER, self->fd, 1, min_complete,
                     min_complete ? URING_ENTER_GETEVENTS : 0, NULL, 0);
    return r == 1 ? 0 : -1;
}

/* ring_drain's answer while the latest wait has not completed (a completed futex_waitv's
 * result is the index of the word woken, 0 for a no-op, or -errno) */
#define RING_PENDING INT_MIN

/* Consumes every completion; returns the latest wait's result if it completed, else
 * RING_PENDING. */
static int ring_drain(FutexRing *self)
{
    int latest = RING_PENDING;
    uint32_t head = *self->cq_head;
    while (head != __atomic_load_n(self->cq_tail, __ATOMIC_ACQUIRE)) {
        UringCqe *cqe = &self->cqes[head & *self->cq_mask];
        if (cqe->user_data == self->sequence) {
            latest = cqe->res;
            self->pending = 0;
        }
        head++;
    }
    __atomic_store_n(self->cq_head, head, __ATOMIC_RELEASE);
    return latest;
}

/* Takes the sleeper counts back and lets go of the watched memory. */
static void ring_release(FutexRing *self)
{
    for (int i = 0; i < self->count; i++) {
        ImageCore *image = self->counted[i].image;
        if (image != NULL) {
            if (image->closed)
                continue; /* img_close_core took its count back */
            image->sleeping--;
        }
        __atomic_fetch_sub(self->counted[i].waiters, 1, __ATOMIC_SEQ_CST);
    }
    self->count = 0;
    Py_CLEAR(self->held);
}

/* Cancels a pending wait and takes the sleeper counts back. */
static void ring_disarm(FutexRing *self)
{
    ring_drain(self);
    if (self->pending) {
        /* waits for both completions (the cancellation's and the wait's) and consumes them,
         * so that a disarmed ring is not readable */
        ring_submit(self, URING_OP_ASYNC_CANCEL, self->sequence, 0, 0, 2);
        ring_drain(self);
        self->pending = 0;
    }
    ring_release(self);
}

/* Counts this process asleep on `waiters` (and `image`, when given) and adds `wake`, as it
 * is now, to the words of the next wait (`n` of them so far). */
static void ring_count(FutexRing *self, int32_t *wake, int32_t *waiters, ImageCore *image,
                       int *n)
{
    __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
    if (image != NULL)
        image->sleeping++;
    self->counted[self->count].waiters = waiters;
    self->counted[self->count].image = image;
    self->count++;
    self->waitv[(*n)++] = (struct wait_entry){.val = (uint32_t)LOAD_ACQUIRE(wake),
                                              .uaddr = (uintptr_t)wake,
                                              .flags = WAIT_ENTRY_U32};
}

/* Submits the wait on the `n` words counted; with `now`, a no-op instead, so that the fd turns
 * readable at once. -1 with an exception set when the ring refuses. */
static int ring_submit_wait(FutexRing *self, int n, int now)
{
    self->sequence++;
    self->pending = 1;
    int r = now ? ring_submit(self, URING_OP_NOP, 0, 0, self->sequence, 0)
                : ring_submit(self, URING_OP_FUTEX_WAITV, (uintptr_t)self->waitv, (uint32_t)n,
                              self->sequence, 0);
    if (r < 0) {
        self->pending = 0;
        ring_release(self);
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return r;
}

static void ring_unmap(FutexRing *self)
{
    if (self->sqes != NULL) munmap(self->sqes, self->sqes_size);
    if (self->rings != NULL) munmap(self->rings, self->rings_size);
    if (self->fd >= 0) close(self->fd);
    self->sqes = NULL;
    self->rings = NULL;
    self->fd = -1;
}

static int futex_ring_init(FutexRing *self, PyObject *args, PyObject *kwds)
{
    if (!PyArg_ParseTuple(args, ":FutexRing"))
        return -1;
    if (self->fd >= 0) {
        PyErr_SetString(PyExc_RuntimeError, "FutexRing is initialized already");
        return -1;
    }
    UringParams p;
    memset(&p, 0, sizeof p);
    p.flags = URING_SETUP_COOP_TASKRUN;
    self->fd = (int)syscall(URING_SYS_SETUP, URING_ENTRIES, &p);
    if (self->fd < 0 && errno == EINVAL) { /* before 5.19 */
        memset(&p, 0, sizeof p);
        self->fd = (int)syscall(URING_SYS_SETUP, URING_ENTRIES, &p);
    }
    if (self->fd < 0)
        goto fail;
    if (!(p.features & URING_FEAT_SINGLE_MMAP)) {
        errno = ENOSYS;
        goto fail;
    }
    size_t sq_size = p.sq_off.array + p.sq_entries * sizeof(uint32_t);
    size_t cq_size = p.cq_off.cqes + p.cq_entries * sizeof(UringCqe);
    self->rings_size = sq_size > cq_size ? sq_size : cq_size;
    self->rings = mmap(NULL, self->rings_size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_POPULATE, self->fd, URING_OFF_SQ_RING);
    if (self->rings == MAP_FAILED) {
        self->rings = NULL;
        goto fail;
    }
    self->sqes_size = p.sq_entries * sizeof(UringSqe);
    self->sqes = mmap(NULL, self->sqes_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE,
                      self->fd, URING_OFF_SQES);
    if (self->sqes == MAP_FAILED) {
        self->sqes = NULL;
        goto fail;
    }
    uint8_t *r = self->rings;
    self->sq_tail = (uint32_t *)(r + p.sq_off.tail);
    self->sq_mask = (uint32_t *)(r + p.sq_off.ring_mask);
    self->sq_array = (uint32_t *)(r + p.sq_off.array);
    self->cq_head = (uint32_t *)(r + p.cq_off.head);
    self->cq_tail = (uint32_t *)(r + p.cq_off.tail);
    self->cq_mask = (uint32_t *)(r + p.cq_off.ring_mask);
    self->cqes = (UringCqe *)(r + p.cq_off.cqes);
    /* does this kernel wait on futexes? a word that is not its expected value answers at once */
    int32_t probe = 1;
    self->waitv[0] = (struct wait_entry){.val = 0, .uaddr = (uintptr_t)&probe,
                                         .flags = WAIT_ENTRY_U32};
    self->sequence = 1;
    self->pending = 1;
    if (ring_submit(self, URING_OP_FUTEX_WAITV, (uintptr_t)self->waitv, 1, 1, 1) < 0)
        goto fail;
    int res = ring_drain(self);
    if (res != -EAGAIN) {
        errno = res < 0 ? -res : ENOSYS;
        goto fail;
    }
    return 0;
fail:
    PyErr_SetFromErrno(PyExc_OSError);
    ring_unmap(self);
    return -1;
}

/* Arms `self` on the subscription (see sub_arm_watcher); 0 when a poll would find something
 * now (nothing armed), 1 when armed, -1 with an exception set. */
static int ring_arm(FutexRing *self, SubscriptionCore *sub)
{
    if (self->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "FutexRing is closed");
        return -1;
    }
    ring_disarm(self);
    int n = 0, ready = 0;
    if (sub->wake != NULL) /* the subscription's own word: rung, always woken, never counted */
        self->waitv[n++] = (struct wait_entry){.val = (uint32_t)LOAD_ACQUIRE(sub->wake),
                                               .uaddr = (uintptr_t)sub->wake,
                                               .flags = WAIT_ENTRY_U32};
    PyObject *images = sub->images;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(images) && self->count < WATCH_MAX; i++) {
        ImageCore *image = (ImageCore *)PyTuple_GET_ITEM(images, i);
        if (image->closed || !image_owns_counter(image))
            continue; /* nothing more to read there */
        ring_count(self, meta_i32(&image->g, META_DATA_WAKE),
                   meta_i32(&image->g, META_DATA_WAITERS), image, &n);
    }
    for (int i = 0; i < self->count && !ready; i++)
        ready = image_ready(self->counted[i].image);
    if (ready || n == 0) {
        ring_release(self);
        return 0;
    }
    self->held = PyTuple_Pack(2, images, sub->wake_buffer ? sub->wake_buffer : Py_None);
    if (self->held == NULL) {
        ring_release(self);
        return -1;
    }
    return ring_submit_wait(self, n, 0) < 0 ? -1 : 1;
}

/* arm(data, progress): LogWatcher.arm's watches, on the ring. */
static PyObject *futex_ring_arm(FutexRing *self, PyObject *args)
{
    PyObject *lists[2];
    if (!PyArg_ParseTuple(args, "O!O!", &PyTuple_Type, &lists[0], &PyTuple_Type, &lists[1]))
        return NULL;
    if (self->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "FutexRing is closed");
        return NULL;
    }
    ring_disarm(self);
    Watch watches[WATCH_MAX];
    int count = 0, n = 0, ready = 0;
    for (int progress = 0; progress < 2; progress++) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lists[progress]) && count < WATCH_MAX; i++) {
            if (watch_arg(PyTuple_GET_ITEM(lists[progress], i), progress, &watches[count]) < 0)
                return NULL;
            if (!is_ready(&watches[count]))
                count++; /* ready already: its owner has work, or waits on something else */
        }
    }
    if (count == 0)
        Py_RETURN_NONE;
    for (int i = 0; i < count; i++)
        ring_count(self, watches[i].wake, watches[i].waiters, NULL, &n);
    ready = watch_ready(watches, count); /* since the count: its writer may not have woken us */
    self->held = PyTuple_Pack(2, lists[0], lists[1]);
    if (self->held == NULL) {
        ring_release(self);
        return NULL;
    }
    if (ring_submit_wait(self, n, ready) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *futex_ring_disarm(FutexRing *self, PyObject *args)
{
    int wait = 0; /* LogWatcher's signature; a ring's disarm is always synchronous */
    if (!PyArg_ParseTuple(args, "|p", &wait))
        return NULL;
    if (self->fd >= 0)
        ring_disarm(self);
    Py_RETURN_NONE;
}

static PyObject *futex_ring_clear(FutexRing *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fd < 0 || ring_drain(self) == RING_PENDING)
        Py_RETURN_FALSE;
    ring_release(self); /* it fired: disarmed, as a LogWatcher that fired is */
    Py_RETURN_TRUE;
}

static PyObject *futex_ring_fileno(FutexRing *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "FutexRing is closed");
        return NULL;
    }
    return PyLong_FromLong(self->fd);
}

static PyObject *futex_ring_close(FutexRing *self, PyObject *Py_UNUSED(ignored))
{
    if (self->fd >= 0) {
        ring_disarm(self);
        ring_unmap(self);
    }
    Py_RETURN_NONE;
}

static PyObject *futex_ring_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    FutexRing *self = (FutexRing *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->fd = -1;
    return (PyObject *)self;
}

static void futex_ring_dealloc(FutexRing *self)
{
    Py_XDECREF(futex_ring_close(self, NULL));
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef futex_ring_methods[] = {
    {"arm", (PyCFunction)futex_ring_arm, METH_VARARGS,
     "arm(data, progress): LogWatcher.arm's watches; the fd turns readable once one is "
     "ready (at once when one became ready while arming)"},
    {"disarm", (PyCFunction)futex_ring_disarm, METH_VARARGS,
     "disarm(wait=False): cancel the wait and take this process's sleeper counts back "
     "(synchronous: wait is accepted for LogWatcher's signature)"},
    {"fileno", (PyCFunction)futex_ring_fileno, METH_NOARGS,
     "fileno() -> int: the io_uring fd, readable once the armed wait is woken"},
    {"clear", (PyCFunction)futex_ring_clear, METH_NOARGS,
     "clear() -> bool: consume the completions; True if the armed wait completed (it is "
     "disarmed then)"},
    {"close", (PyCFunction)futex_ring_close, METH_NOARGS,
     "close(): disarm, unmap and close the ring (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FutexRingType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.FutexRing",
    .tp_basicsize = sizeof(FutexRing),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "FutexRing(): an io_uring whose fd turns readable when an armed futex wait is "
              "woken (Linux 6.7+); OSError where io_uring or its futex wait is unavailable.",
    .tp_new = futex_ring_new,
    .tp_init = (initproc)futex_ring_init,
    .tp_dealloc = (destructor)futex_ring_dealloc,
    .tp_methods = futex_ring_methods,
};

static PyObject *sub_arm_watcher(SubscriptionCore *self, PyObject *arg)
{
    if (self->error != NULL)
        Py_RETURN_FALSE; /* the next poll raises it */
    if (PyObject_TypeCheck(arg, &FutexRingType)) {
        int armed = ring_arm((FutexRing *)arg, self);
        return armed < 0 ? NULL : PyBool_FromLong(armed);
    }
    if (!PyObject_TypeCheck(arg, &LogWatcherType)) {
        PyErr_SetString(PyExc_TypeError, "_arm_watcher takes a FutexRing or a LogWatcher");
        return NULL;
    }
    LogWatcher *watcher = (LogWatcher *)arg;
    if (!watcher->started || watcher->closing) {
        PyErr_SetString(PyExc_ValueError, "LogWatcher is closed");
        return NULL;
    }
    Watch watches[WATCH_MAX];
    int count = 0;
    /* the word first: an image change after this read ends the sleep */
    if (self->wake != NULL)
        watches[count++] = (Watch){.wake = self->wake, .threshold = LOAD_ACQUIRE(self->wake)};
    PyObject *images = self->images;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(images) && count < WATCH_MAX; i++) {
        ImageCore *image = (ImageCore *)PyTuple_GET_ITEM(images, i);
        if (image->closed || !image_owns_counter(image))
            continue; /* nothing more to read there */
        if (image_ready(image))
            Py_RETURN_FALSE;
        int64_t position = image_position(image);
        int index = (int)((position >> image->g.position_bits) % PARTITION_COUNT);
        watches[count++] = (Watch){
            .frame = (const int32_t *)(term_at(&image->g, index) +
                                       (position & (image->g.term_length - 1))),
            .wake = meta_i32(&image->g, META_DATA_WAKE),
            .waiters = meta_i32(&image->g, META_DATA_WAITERS)};
    }
    PyObject *held = PyTuple_Pack(2, images, self->wake_buffer ? self->wake_buffer : Py_None);
    if (held == NULL)
        return NULL;
    watcher_set(watcher, watches, count, held);
    Py_RETURN_TRUE;
}

static void watcher_stop(LogWatcher *self)
{
    if (!self->started)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->lock);
    self->closing = 1;
    watcher_disarm_locked(self, 0);
    pthread_mutex_unlock(&self->lock);
    pthread_join(self->thread, NULL);
    Py_END_ALLOW_THREADS
    self->started = 0;
    close(self->efd);
    self->efd = -1;
    pthread_mutex_destroy(&self->lock);
    pthread_cond_destroy(&self->changed);
    Py_CLEAR(self->held);
}

static PyObject *log_watcher_close(LogWatcher *self, PyObject *Py_UNUSED(ignored))
{
    watcher_stop(self);
    Py_RETURN_NONE;
}

static PyObject *log_watcher_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    LogWatcher *self = (LogWatcher *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->efd = -1;
    return (PyObject *)self;
}

static void log_watcher_dealloc(LogWatcher *self)
{
    watcher_stop(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef log_watcher_methods[] = {
    {"arm", (PyCFunction)log_watcher_arm, METH_VARARGS,
     "arm(data, progress): watch until a frame is committed at one of the data watches "
     "((log buffer, term length, position), ...) or a counter of the progress watches "
     "((log buffer, term length, counter buffer, offset, threshold), ...) reaches its "
     "threshold, then make fileno() readable once (at most 127 watches; ready ones are left "
     "out). Replaces the previous watches."},
    {"disarm", (PyCFunction)log_watcher_disarm, METH_VARARGS,
     "disarm(wait=False): stop watching; with wait=True, return only once the thread touches "
     "none of the logs (call it so before closing a watched log)"},
    {"fileno", (PyCFunction)log_watcher_fileno, METH_NOARGS,
     "fileno() -> int: the eventfd to poll for readability"},
    {"clear", (PyCFunction)log_watcher_clear, METH_NOARGS,
     "clear() -> bool: consume the eventfd's readiness; True if it was readable"},
    {"close", (PyCFunction)log_watcher_close, METH_NOARGS,
     "close(): stop and join the thread, close the eventfd (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LogWatcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "shmbus.shm._native.LogWatcher",
    .tp_basicsize = sizeof(LogWatcher),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LogWatcher(): a native thread that makes an eventfd readable when a publisher "
              "commits a frame where a network sender waits, or a subscriber reads up to a "
              "threshold (see _native.c).",
    .tp_new = log_watcher_new,
    .tp_init = (initproc)log_watcher_init,
    .tp_dealloc = (destructor)log_watcher_dealloc,
    .tp_methods = log_watcher_methods,
};

/* One sender the spin sends for by itself (see busy_poll): DATA committed at `position` goes
 * out as scan_datagrams and send_batch would send it, to every destination. */
typedef struct {
    int fd;
    LogGeometry g;
    int64_t position, limit;
    int mtu, max_datagrams;
    struct sockaddr_in *destinations;
    Py_ssize_t destination_count;
    int blocked; /* a committed frame the limit leaves no room for: left to the duty cycle */
} SpinSend;

static int spin_send_arg(PyObject *item, SpinSend *send)
{
    PyObject *log, *destinations;
    int term_length;
    long long position, limit;
    memset(send, 0, sizeof *send);
    if (!PyTuple_Check(item)) {
        PyErr_Format(PyExc_TypeError, "a send is a tuple (fd, log_buffer, term_length, "
                     "position, limit, mtu, max_datagrams, destinations), not %R", item);
        return -1;
    }
    if (!PyArg_ParseTuple(item, "iO!iLLiiO!", &send->fd, &AtomicBufferType, &log, &term_length,
                          &position, &limit, &send->mtu, &send->max_datagrams, &PyTuple_Type,
                          &destinations) ||
        geometry_from((AtomicBuffer *)log, term_length, 0, &send->g) < 0)
        return -1;
    if (position < 0 || position % FRAME_ALIGNMENT || send->mtu < HEADER_LENGTH ||
        send->max_datagrams < 1 || send->max_datagrams > 4096) {
        PyErr_Format(PyExc_ValueError, "send: position %lld (a multiple of 32 >= 0), "
                     "mtu %d (>= 32) or max_datagrams %d (1..4096) out of range", position,
                     send->mtu, send->max_datagrams);
        return -1;
    }
    send->position = position;
    send->limit = limit;
    send->destination_count = PyTuple_GET_SIZE(destinations);
    send->destinations = PyMem_Calloc(send->destination_count ? (size_t)send->destination_count
                                                              : 1, sizeof(struct sockaddr_in));
    if (send->destinations == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < send->destination_count; i++)
        if (sockaddr_arg(PyTuple_GET_ITEM(destinations, i), &send->destinations[i]) < 0)
            return -1;
    return 0;
}

/* Scans `send` from its position and sends what is committed to each destination (nothing
 * when no whole frame fits its limit); *error is set to the errno of a bad socket. No GIL. */
static Scan send_committed(const SpinSend *send, Span *spans, int *error)
{
    Scan scan = scan_spans(&send->g, send->position, send->limit, send->mtu,
                           send->max_datagrams, spans);
    for (Py_ssize_t d = 0; d < send->destination_count && scan.count; d++) {
        int done = send_spans(send->fd, send->g.terms, spans, scan.count,
                              &send->destinations[d]);
        if (done < 0)
            *error = -done;
    }
    return scan;
}

/* send_now(send) -> (position, datagrams, bytes, back_pressured, more): what busy_poll does
 * for a send (see there) once its frame is committed, at once and without waiting: the DATA
 * committed from its position goes out to each destination. OSError for a bad socket. */
static PyObject *native_send_now(PyObject *m, PyObject *arg)
{
    SpinSend send;
    PyObject *out = NULL;
    Span *spans = NULL;
    int error = 0;
    if (spin_send_arg(arg, &send) < 0)
        goto done;
    if ((spans = PyMem_Malloc((size_t)send.max_datagrams * sizeof *spans)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Scan scan = send_committed(&send, spans, &error);
    if (error) {
        errno = error;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    out = Py_BuildValue("(LiLOO)", (long long)scan.position, scan.count, (long long)scan.bytes,
                        scan.back_pressured ? Py_True : Py_False, scan.more ? Py_True : Py_False);
done:
    PyMem_Free(send.destinations);
    PyMem_Free(spans);
    return out;
}

/* busy_poll(fds, data_watches, progress_watches, until_ns, sends=()) -> (found, sent): a poll
 * loop's spin between duty cycles (the netbridge's busy window). Until CLOCK_MONOTONIC reaches
 * until_ns it polls fds without waiting, checks the watches (as LogWatcher.arm takes them) and
 * the senders in `sends`, and yields the CPU. Each of `sends` is (fd, log_buffer, term_length,
 * position, limit, mtu, max_datagrams, destinations): once a publisher commits at `position`,
 * the spin sends that sender's DATA itself (exactly scan_datagrams then send_batch to each
 * numeric IPv4 destination) and returns. found: the readable fds when one is, () when a watch
 * is ready, else None; sent: (index in sends, position after the scan, datagrams, bytes,
 * back_pressured, more) for the sender it sent for, or nothing. Each turn costs two syscalls,
 * not a Python duty cycle, so data is seen and sent within microseconds of its arrival while
 * other processes keep the CPU they need. */
static PyObject *native_busy_poll(PyObject *m, PyObject *args)
{
    PyObject *fd_tuple, *lists[2], *send_tuple = NULL, *out = NULL;
    long long until_ns;
    if (!PyArg_ParseTuple(args, "O!O!O!L|O!:busy_poll", &PyTuple_Type, &fd_tuple, &PyTuple_Type,
                          &lists[0], &PyTuple_Type, &lists[1], &until_ns, &PyTuple_Type,
                          &send_tuple))
        return NULL;
    Py_ssize_t nfds = PyTuple_GET_SIZE(fd_tuple);
    Py_ssize_t nsends = send_tuple == NULL ? 0 : PyTuple_GET_SIZE(send_tuple);
    struct pollfd *pfds = PyMem_Calloc(nfds ? (size_t)nfds : 1, sizeof *pfds);
    SpinSend *sends = PyMem_Calloc(nsends ? (size_t)nsends : 1, sizeof *sends);
    Span *spans = NULL;
    if (pfds == NULL || sends == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < nfds; i++) {
        long fd = PyLong_AsLong(PyTuple_GET_ITEM(fd_tuple, i));
        if (fd == -1 && PyErr_Occurred())
            goto done;
        pfds[i] = (struct pollfd){.fd = (int)fd, .events = POLLIN};
    }
    int max_datagrams = 1;
    for (Py_ssize_t i = 0; i < nsends; i++) {
        if (spin_send_arg(PyTuple_GET_ITEM(send_tuple, i), &sends[i]) < 0)
            goto done;
        if (sends[i].max_datagrams > max_datagrams)
            max_datagrams = sends[i].max_datagrams;
    }
    if ((spans = PyMem_Malloc((size_t)max_datagrams * sizeof *spans)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Watch watches[WATCH_MAX]; /* more are left out, as arm does: found at the deadline */
    int count = 0;
    for (int progress = 0; progress < 2; progress++)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lists[progress]) && count < WATCH_MAX; i++)
            if (watch_arg(PyTuple_GET_ITEM(lists[progress], i), progress, &watches[count++]) < 0)
                goto done;
    int readable = 0, ready = 0, error = 0;
    Py_ssize_t sent_index = -1;
    Scan scan = {0};
    Py_BEGIN_ALLOW_THREADS
    for (;;) {
        readable = poll(pfds, (nfds_t)nfds, 0);
        if (readable != 0)
            break;
        for (Py_ssize_t i = 0; i < nsends && sent_index < 0; i++) {
            SpinSend *send = &sends[i];
            int index = (int)((send->position >> send->g.position_bits) % PARTITION_COUNT);
            const int32_t *frame = (const int32_t *)(
                term_at(&send->g, index) + (send->position & (send->g.term_length - 1)));
            if (send->blocked || LOAD_ACQUIRE(frame) <= 0)
                continue;
            scan = send_committed(send, spans, &error);
            if (scan.count == 0)
                send->blocked = 1;
            else
                sent_index = i;
        }
        if (sent_index >= 0 || (ready = watch_ready(watches, count)))
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if ((long long)ts.tv_sec * 1000000000LL + ts.tv_nsec >= until_ns)
            break;
        sched_yield();
    }
    Py_END_ALLOW_THREADS
    if (readable < 0 || error) {
        errno = error ? error : errno;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    PyObject *found;
    if (readable == 0 && !ready)
        found = Py_NewRef(Py_None);
    else if ((found = PyTuple_New(readable)) != NULL) {
        for (Py_ssize_t i = 0, j = 0; i < nfds && j < readable; i++) {
            if (!pfds[i].revents)
                continue;
            PyObject *fd = PyLong_FromLong(pfds[i].fd);
            if (fd == NULL) {
                Py_CLEAR(found);
                break;
            }
            PyTuple_SET_ITEM(found, j++, fd);
        }
    }
    if (found == NULL)
        goto done;
    if (sent_index < 0)
        out = Py_BuildValue("(N())", found);
    else
        out = Py_BuildValue("(N(nLiLOO))", found, sent_index, (long long)scan.position,
                            scan.count, (long long)scan.bytes,
                            scan.back_pressured ? Py_True : Py_False,
                            scan.more ? Py_True : Py_False);
done:
    for (Py_ssize_t i = 0; sends != NULL && i < nsends; i++)
        PyMem_Free(sends[i].destinations);
    PyMem_Free(sends);
    PyMem_Free(spans);
    PyMem_Free(pfds);
    return out;
}

static PyMethodDef netbridge_batch_functions[] = {
    {"receive_batch", native_receive_batch, METH_VARARGS,
     "receive_batch(fd, slots, images) -> (received, in_order, rest): recvmmsg a batch, "
     "inserting in-order DATA natively (see _native.c)"},
    {"scan_datagrams", native_scan_datagrams, METH_VARARGS,
     "scan_datagrams(log_buffer, term_length, position, limit, mtu, max_datagrams) -> "
     "(position, spans, back_pressured, more): the sender's DATA datagrams as log spans"},
    {"send_batch", native_send_batch, METH_VARARGS,
     "send_batch(fd, buffer, spans, destination) -> int: sendmmsg spans of buffer"},
    {"send_now", native_send_now, METH_O,
     "send_now(send) -> (position, datagrams, bytes, back_pressured, more): busy_poll's send "
     "of what is committed, at once"},
    {"busy_poll", native_busy_poll, METH_VARARGS,
     "busy_poll(fds, data_watches, progress_watches, until_ns, sends=()) -> (found, sent): "
     "spin until an fd is readable, a watch is ready, a sender sent, or until_ns"},
    {NULL, NULL, 0, NULL},
};

/* ====================================================================================== */
/* module                                                                                  */
/* ====================================================================================== */

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shmbus.shm._native",
    .m_doc = "Native core of shmbus: atomics, term appender and term reader.",
    .m_size = -1,
    .m_methods = native_functions,
};

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&AtomicBufferType) < 0 || PyType_Ready(&PublicationCoreType) < 0 ||
        PyType_Ready(&HeaderType) < 0 || PyType_Ready(&ImageCoreType) < 0 ||
        PyType_Ready(&SubscriptionCoreType) < 0 || PyType_Ready(&MessageIteratorType) < 0 ||
        PyType_Ready(&HeartbeatType) < 0 || PyType_Ready(&AssemblerType) < 0 ||
        PyType_Ready(&GroupMemberCoreType) < 0 || PyType_Ready(&LogWatcherType) < 0 ||
        PyType_Ready(&FutexRingType) < 0)
        return NULL;
    release_str = PyUnicode_InternFromString("release");
    if (release_str == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "AtomicBuffer", (PyObject *)&AtomicBufferType) < 0 ||
        PyModule_AddObjectRef(m, "PublicationCore", (PyObject *)&PublicationCoreType) < 0 ||
        PyModule_AddObjectRef(m, "Header", (PyObject *)&HeaderType) < 0 ||
        PyModule_AddObjectRef(m, "ImageCore", (PyObject *)&ImageCoreType) < 0 ||
        PyModule_AddObjectRef(m, "SubscriptionCore", (PyObject *)&SubscriptionCoreType) < 0 ||
        PyModule_AddObjectRef(m, "Heartbeat", (PyObject *)&HeartbeatType) < 0 ||
        PyModule_AddObjectRef(m, "FragmentAssembler", (PyObject *)&AssemblerType) < 0 ||
        PyModule_AddObjectRef(m, "GroupMemberCore", (PyObject *)&GroupMemberCoreType) < 0 ||
        PyModule_AddObjectRef(m, "LogWatcher", (PyObject *)&LogWatcherType) < 0 ||
        PyModule_AddObjectRef(m, "FutexRing", (PyObject *)&FutexRingType) < 0 ||
        PyModule_AddFunctions(m, netbridge_wire_functions) < 0 ||
        PyModule_AddFunctions(m, netbridge_batch_functions) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
