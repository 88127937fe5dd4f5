/*
 * Heartbeat: a native thread that keeps a client alive without the GIL, storing the epoch time
 * in its heartbeat counter (shmbus/client/conductor_proxy.py); and epoch_ms(), the clock it
 * uses, which the driver reads liveness with.
 *
 * The client and the driver create it and call epoch_ms with the GIL held; the thread itself
 * never takes the GIL.
 */
#include "types.h"

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

PyTypeObject HeartbeatType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.Heartbeat", Heartbeat, Py_TPFLAGS_DEFAULT,
                     "Heartbeat(buffer, offset, interval): a thread (no GIL) that stores the "
                     "epoch time in ms at buffer[offset] every interval seconds until stop()."),
    NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, heartbeat_init, heartbeat_dealloc),
    .tp_methods = heartbeat_methods,
    .tp_getset = heartbeat_getset,
};

static PyObject *native_epoch_ms(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(epoch_ms());
}

PyMethodDef heartbeat_functions[] = {
    {"epoch_ms", native_epoch_ms, METH_NOARGS, "epoch_ms() -> int: the clock heartbeats use"},
    {NULL, NULL, 0, NULL},
};
