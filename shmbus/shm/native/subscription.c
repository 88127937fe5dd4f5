/*
 * SubscriptionCore: polling, taking and waiting over a subscription's images (round-robin,
 * with the client's lease checked around every poll), MessageIterator (Subscription.messages())
 * and _arm_watcher, the arming of an asyncio subscriber's FutexRing or LogWatcher.
 *
 * Runs in client processes, on the thread that polls, with the GIL held; sleeps release it.
 * The struct and its rules are in types.h (futex_ring.c arms on it too).
 */
#include "types.h"

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

/* Reads; with a timeout (seconds, < 0: forever), sleeps until something arrives (or the
 * images change) and reads again, until it got a fragment or the timeout passed. */
static long sub_read_waiting(SubscriptionCore *self, image_reader read, PyObject *handler,
                             long limit, double timeout)
{
    double deadline = timeout > 0 ? monotonic_s() + timeout : 0;
    for (;;) {
        int32_t seen = self->wake != NULL ? LOAD_ACQUIRE(self->wake) : 0;
        long got = sub_read(self, read, handler, limit);
        if (got != 0 || timeout == 0 || limit == 0 || self->closed)
            return got;
        double remaining = timeout < 0 ? -1 : deadline - monotonic_s();
        if (timeout > 0 && remaining <= 0)
            return 0;
        PyObject *images = Py_NewRef(self->images);
        int ready = wait_images(images, self->wake, seen,
                                timeout < 0 ? -1 : timeout_to_ns(remaining),
                                self->wait_spin_ns);
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
    PyObject *handler = NULL, *limit_obj = NULL, *timeout_obj = NULL;
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
    double timeout = 0;  /* not given: no wait; None: forever (-1) */
    if (timeout_obj != NULL && timeout_arg(timeout_obj, -1, &timeout) < 0)
        return NULL;
    long got = sub_read_waiting(self, read, handler, limit, timeout);
    return got < 0 ? NULL : PyLong_FromLong(got);
usage:
    PyErr_Format(PyExc_TypeError, "%s(handler, fragment_limit=10, timeout=0)", name);
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
            ready = wait_images_watching(images, self->wake, seen, self,
                                         timeout < 0 ? -1 : timeout_to_ns(remaining),
                                         self->wait_spin_ns);
        Py_DECREF(images);
        if (ready < 0)
            return NULL;
        if (ready == 2)  /* the watched word moved: the caller looks why */
            Py_RETURN_FALSE;
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
PyObject *sub_take(SubscriptionCore *self)
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

static PyObject *messages_next(MessageIterator *self)
{
    SubscriptionCore *sub = self->subscription;
    double deadline = -1;  /* read from the clock only once there is nothing to take */
    while (!self->ended) {
        int32_t seen = sub->wake != NULL ? LOAD_ACQUIRE(sub->wake) : 0;
        PyObject *message = sub_take(sub);
        if (message != NULL || PyErr_Occurred())
            return message;
        if (deadline < 0)
            deadline = self->timeout > 0 ? monotonic_s() + self->timeout : 0;
        double remaining = self->timeout > 0 ? deadline - monotonic_s() : 1.0;
        double slice = remaining < 1.0 ? remaining : 1.0;  /* 1 s: to look at signals */
        self->ended = sub->closed || self->timeout == 0 || slice <= 0;
        if (self->ended)
            return NULL;
        PyObject *images = Py_NewRef(sub->images);
        int ready = wait_images(images, sub->wake, seen, timeout_to_ns(slice),
                                sub->wait_spin_ns);
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

PyTypeObject MessageIteratorType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.MessageIterator", MessageIterator, Py_TPFLAGS_DEFAULT,
                     "Whole messages of a subscription as bytes: see Subscription.messages."),
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
    Py_VISIT(self->watch_view);
    return 0;
}

static void sub_drop_watch(SubscriptionCore *self)
{
    if (self->watch_view != NULL) {
        self->watch_word = NULL;
        PyBuffer_Release(&self->watch_buffer);
        Py_CLEAR(self->watch_view);
    }
}

/* _watch_word(view, offset, value) or _watch_word(None): wait() and await_reply also end once
 * the int32 at `offset` of `view` (a buffer whose export keeps its memory mapped) no longer
 * holds `value`; its writer must wake its sleepers (wake_sleepers). None drops it: do so
 * before the memory goes. */
static PyObject *sub_watch_word(SubscriptionCore *self, PyObject *args)
{
    PyObject *view;
    Py_ssize_t offset = 0;
    int value = 0;
    if (!PyArg_ParseTuple(args, "O|ni", &view, &offset, &value))
        return NULL;
    sub_drop_watch(self);
    if (view == Py_None)
        Py_RETURN_NONE;
    Py_buffer buffer;
    if (PyObject_GetBuffer(view, &buffer, PyBUF_SIMPLE) < 0)
        return NULL;
    if (offset < 0 || offset % 4 != 0 || offset + 4 > buffer.len ||
        ((uintptr_t)buffer.buf + (uintptr_t)offset) % 4 != 0) {
        PyBuffer_Release(&buffer);
        PyErr_Format(PyExc_ValueError, "a watched word is an aligned int32 inside the buffer: "
                     "offset %zd does not fit its %zd bytes", offset, buffer.len);
        return NULL;
    }
    self->watch_buffer = buffer;
    self->watch_view = Py_NewRef(view);
    self->watch_value = (int32_t)value;
    self->watch_word = (int32_t *)((uint8_t *)buffer.buf + offset);
    Py_RETURN_NONE;
}

static int sub_clear(SubscriptionCore *self)
{
    sub_drop_watch(self);
    Py_CLEAR(self->images);
    Py_CLEAR(self->wake_buffer);
    Py_CLEAR(self->error);
    Py_CLEAR(self->lease_buffer);
    Py_CLEAR(self->on_lease_lost);
    self->wake = NULL;
    self->lease = NULL;
    return 0;
}

NATIVE_GC_DEALLOC(sub_dealloc, SubscriptionCore, sub_clear)

static PyMemberDef sub_members[] = {
    {"_closed", T_BOOL, offsetof(SubscriptionCore, closed), 0,
     "True once Subscription.close ran (set by it)"},
    {"_wait_spin_ns", T_LONGLONG, offsetof(SubscriptionCore, wait_spin_ns), 0,
     "ns a waiting poll, wait() or messages() looks for a frame, yielding, before it sleeps "
     "(set by the client from Context.wait_spin; 0: sleep at once)"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef sub_getset[] = {
    {"images", (getter)sub_get_images, (setter)sub_set_images,
     "the current images, a tuple (a snapshot: it is replaced, never changed)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

/* _arm_watcher(watcher) -> bool: asyncio's wait for this subscription (shmbus/streams/async_waits.py):
 * arms a FutexRing or a LogWatcher on the wake word and the images' data words; False when
 * there is something to read already (or an error to raise). */
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
    if (self->watch_word != NULL) {
        if (LOAD_ACQUIRE(self->watch_word) != self->watch_value)
            Py_RETURN_FALSE;
        watches[count++] = (Watch){.wake = self->watch_word, .threshold = self->watch_value};
    }
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
    PyObject *held = PyTuple_Pack(3, images, self->wake_buffer ? self->wake_buffer : Py_None,
                                  self->watch_view ? self->watch_view : Py_None);
    if (held == NULL)
        return NULL;
    watcher_set(watcher, watches, count, held);
    Py_RETURN_TRUE;
}

static PyMethodDef sub_methods[] = {
    {"poll", (PyCFunction)(void (*)(void))sub_poll, METH_FASTCALL | METH_KEYWORDS,
     "poll(handler, fragment_limit=10, timeout=0) -> int\n\nCall handler(buffer, header) "
     "for up to fragment_limit fragments over the images, round-robin from one further along "
     "each call. With a timeout (seconds; None: forever), sleep until a fragment arrives, "
     "woken by the writer, at most that long; 0 never sleeps. Returns the number of fragments (0 when the timeout passed). "
     "Raises the client's error once it is gone (DriverTimeoutError, ClientTimeoutError)."},
    {"controlled_poll", (PyCFunction)(void (*)(void))sub_controlled_poll,
     METH_FASTCALL | METH_KEYWORDS,
     "controlled_poll(handler, fragment_limit=10, timeout=0) -> int\n\nLike poll, the "
     "handler returning an Action."},
    {"wait", (PyCFunction)(void (*)(void))sub_wait, METH_FASTCALL,
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
    {"_watch_word", (PyCFunction)sub_watch_word, METH_VARARGS, NULL},
    {"_arm_watcher", (PyCFunction)sub_arm_watcher, METH_O,
     "_arm_watcher(watcher) -> bool\n\nArm a FutexRing or LogWatcher to make its fd readable "
     "once an image has a fragment to read, or the images change, or the client fails. False "
     "(nothing armed) when a poll would find something now."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SubscriptionCoreType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.SubscriptionCore", SubscriptionCore,
                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
                     "The image set, polls and waits behind Subscription."),
    .tp_members = sub_members,
    NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, sub_init, sub_dealloc),
    .tp_traverse = (traverseproc)sub_traverse,
    .tp_clear = (inquiry)sub_clear,
    .tp_methods = sub_methods,
    .tp_getset = sub_getset,
};
