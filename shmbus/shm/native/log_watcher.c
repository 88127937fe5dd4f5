/*
 * LogWatcher: a thread (no GIL) asleep on logs' wake words that makes an eventfd readable once
 * a frame is committed where a reader waits (data watches: logs' data words) or a subscriber
 * reads up to a threshold (progress watches: logs' progress words), so that an event loop can
 * block in poll() on its sockets and that eventfd. The netbridge arms one for its senders and
 * receivers (netbridge/bridge.py); an asyncio subscriber arms one where io_uring's futex wait
 * is missing (SubscriptionCore._arm_watcher, shmbus/streams/async_waits.py).
 *
 * arm/disarm/close run on the owner's thread with the GIL held; watcher_main is the watcher's
 * own thread and never takes the GIL. watch_arg and watch_ready are also netbridge._io's
 * (busy_poll checks the same watches), through the capsule.
 */
#include "types.h"

#include <sys/eventfd.h>

int watch_is_ready(const Watch *w)
{
    if (w->frame != NULL)
        return LOAD_ACQUIRE(w->frame) > 0;
    if (w->counter != NULL)
        return LOAD_ACQUIRE(w->counter) >= w->threshold;
    return LOAD_ACQUIRE(w->wake) != (int32_t)w->threshold;
}

int watch_ready(const Watch *watches, int count)
{
    for (int i = 0; i < count; i++)
        if (watch_is_ready(&watches[i]))
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
            words[i + 1] = watches[i].wake;
            if (watches[i].frame != NULL && watches[i].waiters != NULL) {  /* a data word */
                expected[i + 1] = arm_data_word(watches[i].wake, watches[i].waiters);
                continue;
            }
            if (watches[i].waiters != NULL)
                __atomic_fetch_add(watches[i].waiters, 1, __ATOMIC_SEQ_CST);
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
void watcher_set(LogWatcher *self, const Watch *watches, int count, PyObject *held)
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
int watch_arg(PyObject *item, int progress, Watch *w)
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
            if (!watch_is_ready(&watches[count]))
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

PyTypeObject LogWatcherType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.LogWatcher", LogWatcher, Py_TPFLAGS_DEFAULT,
                     "LogWatcher(): a native thread that makes an eventfd readable when a "
                     "publisher commits a frame where a network sender waits, or a subscriber "
                     "reads up to a threshold (see shmbus/shm/native/log_watcher.c)."),
    NATIVE_TYPE_LIFECYCLE(log_watcher_new, log_watcher_init, log_watcher_dealloc),
    .tp_methods = log_watcher_methods,
};
