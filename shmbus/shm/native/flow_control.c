/*
 * IPC flow control: pub-lmt follows the slowest counted position, raised by the publisher
 * (docs/protocol.md, IPC flow control).
 *
 * fc_raise: the term appender (term_appender.c), in a client process on the thread that offers
 * (GIL held), when an offer reaches its limit. fc_raise_for_writer: an image (image.c), on the
 * thread that reads, as it stores its position on a log whose writer does not raise. flow_control_set and flow_control_advance: the
 * driver (shmbus/driver/ipc_flow_control.py, its conductor thread, GIL held).
 */
#include "types.h"

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
    /* the clean position never moves back: a reader counted behind it (a joiner whose start
     * was cleaned as it joined) reads zeros, and the driver must see that its start is gone
     * (shmbus/driver/log_history.py) */
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
int fc_raise(const LogGeometry *g, const uint8_t *values, Py_ssize_t values_len, int64_t *limit,
             int64_t producer)
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

/*
 * An Aeron client's publication only reads pub-lmt: Aeron's driver raises it on its duty
 * cycle. shmbus's driver does too (shmbus/driver/aeron_client_streams.py), and marks the log
 * (META_READERS_RAISE: the limit's counter id + 1), so that its shmbus readers raise the limit
 * as they store their positions: the writer is then not held to the driver's cycle.
 */
void fc_raise_for_writer(const LogGeometry *g, const uint8_t *values, Py_ssize_t values_len)
{
    int32_t id = LOAD_ACQUIRE(meta_i32(g, META_READERS_RAISE)) - 1;
    if (id < 0 || (Py_ssize_t)(id + 1) * COUNTER_LENGTH > values_len)
        return;
    fc_raise(g, values, values_len, (int64_t *)(values + (Py_ssize_t)id * COUNTER_LENGTH),
             log_producer_position(g));
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

PyMethodDef flow_control_functions[] = {
    {"flow_control_set", native_flow_control_set, METH_VARARGS,
     "flow_control_set(log_buffer, term_length, counter_ids): the positions that count"},
    {"flow_control_advance", native_flow_control_advance, METH_VARARGS,
     "flow_control_advance(log_buffer, term_length, limit_buffer, limit_offset, slowest, "
     "mode) -> bool: clean behind slowest; mode 0 raises pub-lmt, 1 pulls it back, 2 leaves it"},
    {NULL, NULL, 0, NULL},
};
