/*
 * FutexRing: a futex wait an event loop can watch.
 *
 * An io_uring holding one futex_waitv request (Linux 6.7+): its fd turns readable as soon as
 * one of the words it waits on is woken, so an event loop (asyncio's add_reader, the
 * netbridge's poll) wakes straight from the writer's FUTEX_WAKE, with no thread between them. The
 * LogWatcher thread does the same where io_uring is missing or refused (older kernels, container
 * seccomp profiles), one thread hop later. Arming follows the blocking wait's protocol: count this process as a sleeper on
 * each image (image->sleeping too, so a closed image takes its count back), read the words,
 * look for data, then submit; disarm cancels a wait still pending and takes the counts back.
 *
 * Used by asyncio subscribers (shmbus/streams/async_waits.py, SubscriptionCore._arm_watcher) and the
 * netbridge's poll loop, on the thread that holds the GIL; the kernel does the waiting.
 */
#include "types.h"

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

struct FutexRing {
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
};

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
 * is now, to the words of the next wait (`n` of them so far). A log's data word (`data`) is
 * armed with a bump (arm_data_word), as every reader sleeping on it does. */
static void ring_count(FutexRing *self, int32_t *wake, int32_t *waiters, ImageCore *image,
                       int data, int *n)
{
    int32_t value;
    if (data) {
        value = arm_data_word(wake, waiters);
    } else {
        __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
        value = LOAD_ACQUIRE(wake);
    }
    if (image != NULL)
        image->sleeping++;
    self->counted[self->count].waiters = waiters;
    self->counted[self->count].image = image;
    self->count++;
    self->waitv[(*n)++] = (struct wait_entry){.val = (uint32_t)value,
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
int ring_arm(FutexRing *self, SubscriptionCore *sub)
{
    if (self->fd < 0) {
        PyErr_SetString(PyExc_ValueError, "FutexRing is closed");
        return -1;
    }
    ring_disarm(self);
    if (sub->watch_word != NULL && LOAD_ACQUIRE(sub->watch_word) != sub->watch_value)
        return 0;  /* moved already: the caller looks */
    int n = 0, ready = 0;
    if (sub->wake != NULL) /* the subscription's own word: rung, always woken, never counted */
        self->waitv[n++] = (struct wait_entry){.val = (uint32_t)LOAD_ACQUIRE(sub->wake),
                                               .uaddr = (uintptr_t)sub->wake,
                                               .flags = WAIT_ENTRY_U32};
    if (sub->watch_word != NULL) { /* a requester's is-connected word: rung, always woken */
        self->waitv[n++] = (struct wait_entry){.val = (uint32_t)sub->watch_value,
                                               .uaddr = (uintptr_t)sub->watch_word,
                                               .flags = WAIT_ENTRY_U32};
    }
    PyObject *images = sub->images;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(images) && self->count < WATCH_MAX &&
                           n < WATCH_MAX + 1; i++) {
        ImageCore *image = (ImageCore *)PyTuple_GET_ITEM(images, i);
        if (image->closed || !image_owns_counter(image))
            continue; /* nothing more to read there */
        ring_count(self, meta_i32(&image->g, META_DATA_WAKE),
                   meta_i32(&image->g, META_DATA_WAITERS), image, 1, &n);
    }
    for (int i = 0; i < self->count && !ready; i++)
        ready = image_ready(self->counted[i].image);
    if (ready || n == 0) {
        ring_release(self);
        return 0;
    }
    self->held = PyTuple_Pack(3, images, sub->wake_buffer ? sub->wake_buffer : Py_None,
                              sub->watch_view ? sub->watch_view : Py_None);
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
            if (!watch_is_ready(&watches[count]))
                count++; /* ready already: its owner has work, or waits on something else */
        }
    }
    if (count == 0)
        Py_RETURN_NONE;
    for (int i = 0; i < count; i++)
        ring_count(self, watches[i].wake, watches[i].waiters, NULL, watches[i].frame != NULL,
                   &n);
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

PyTypeObject FutexRingType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.FutexRing", FutexRing, Py_TPFLAGS_DEFAULT,
                     "FutexRing(): an io_uring whose fd turns readable when an armed futex wait "
                     "is woken (Linux 6.7+); OSError where io_uring or its futex wait is "
                     "unavailable."),
    NATIVE_TYPE_LIFECYCLE(futex_ring_new, futex_ring_init, futex_ring_dealloc),
    .tp_methods = futex_ring_methods,
};
