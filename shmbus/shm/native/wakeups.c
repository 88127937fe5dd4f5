/*
 * Sleeping on futex words in shared memory, and waking the sleepers (the protocol is described
 * at wake_word in shmbus_native.h; docs/protocol.md, Wake-ups): wait_words, the one place a
 * thread sleeps on words; wait_images, a subscriber's sleep until one of its images has a frame; and the module
 * functions signal_word/wait_word (the driver's and clients' doorbells, shmbus/shm/doorbell.py),
 * wait_for_data, wake_log_readers/wake_log_writers (the driver's group reassignments and the
 * netbridge, for logs written or read without a PublicationCore or ImageCore), and
 * wake_sleepers (the driver, after it cleared a log's is-connected word: requesters sleep on
 * it, see wait_images_watching).
 *
 * Called from Python with the GIL held, in the client, the driver and the netbridge; every
 * sleep releases the GIL. wait_words is also called by the LogWatcher thread (no GIL).
 */
#include "types.h"

#include <sched.h>

#ifndef SYS_futex_waitv
#define SYS_futex_waitv 449
#endif

/* Sleeps on up to `count` words until one changes from its expected value or `timeout_ns`
 * passes (< 0: forever). The GIL must be released by the caller. */
void wait_words(int32_t **words, const int32_t *expected, int count, int64_t timeout_ns)
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

int64_t timeout_to_ns(double timeout_s)
{
    if (timeout_s < 0) return -1;
    if (timeout_s > 1e9) return -1;
    return (int64_t)(timeout_s * 1e9);
}

int word_at(PyObject *buffer, Py_ssize_t offset, int32_t **word)
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

static void wake_all(int32_t *word)
{
    syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* The word of a (buffer, offset) argument tuple, or NULL with an exception set. */
static int32_t *word_arg(PyObject *args)
{
    PyObject *buffer;
    Py_ssize_t offset;
    int32_t *word;
    if (!PyArg_ParseTuple(args, "On", &buffer, &offset) || word_at(buffer, offset, &word) < 0)
        return NULL;
    return word;
}

/* signal_word(buffer, offset): bump the word and wake everyone asleep on it (always a
 * syscall: for rare events such as commands to the driver and broadcasts to clients). */
static PyObject *native_signal_word(PyObject *m, PyObject *args)
{
    int32_t *word = word_arg(args);
    if (word == NULL)
        return NULL;
    __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
    wake_all(word);
    Py_RETURN_NONE;
}

/* wake_sleepers(buffer, offset): wake everyone asleep on the word, without changing it (a word
 * whose value is a state, such as a log's is-connected flag, that its writer just changed). */
static PyObject *native_wake_sleepers(PyObject *m, PyObject *args)
{
    int32_t *word = word_arg(args);
    if (word == NULL)
        return NULL;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    wake_all(word);
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

/* Whether the watched word of `sub` (NULL: none) no longer holds its value. Read with the GIL
 * held, from the subscription each time: _watch_word(None) drops it before its mapping goes. */
static int watched_moved(SubscriptionCore *sub)
{
    return sub != NULL && sub->watch_word != NULL &&
           LOAD_ACQUIRE(sub->watch_word) != sub->watch_value;
}

/* 1 when one of `images` has a frame at its position or closed. */
static int any_image_ready(PyObject *images)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(images); i++) {
        PyObject *item = PyTuple_GET_ITEM(images, i);
        if (PyObject_TypeCheck(item, &ImageCoreType) &&
            (((ImageCore *)item)->closed || image_ready((ImageCore *)item)))
            return 1;
    }
    return 0;
}

/* One look of spin_for_images: what it returns (2, 0 or 1, in that order of precedence), or -1
 * when nothing is there yet. */
static inline int look_once(PyObject *images, int32_t *wake, int32_t wake_expected,
                            SubscriptionCore *watching)
{
    if (watched_moved(watching))
        return 2;
    if (wake != NULL && LOAD_ACQUIRE(wake) != wake_expected)
        return 0;
    if (any_image_ready(images))
        return 1;
    return -1;
}

/* A waiter's look before it sleeps, as Aeron's back-off idle strategy spins, yields and then
 * parks: for up to spin_ns it looks for a frame on the images, for its first BUSY_LOOK_NS
 * without a system call (a writer in full flow has its next frame out within that: a reader
 * that drains faster than its writer writes would otherwise pay a sched_yield per message),
 * then yielding the CPU and the GIL between looks (with the GIL held while it looks: the
 * conductor may close an image). A stream that keeps coming never puts its reader to sleep,
 * so its writer pays no wake-up. 1 when an image has a frame or closed; 0 after spin_ns, or at
 * once when the wake word moved (the images changed: the caller looks at the new ones); 2 when
 * the watched word of `watching` moved. */
static int spin_for_images(PyObject *images, int32_t *wake, int32_t wake_expected,
                           SubscriptionCore *watching, int64_t spin_ns)
{
    int64_t now = monotonic_ns();
    int64_t until = now + spin_ns;
    int64_t busy_until = now + (spin_ns < BUSY_LOOK_NS ? spin_ns : BUSY_LOOK_NS);
    for (unsigned turn = 1;; turn++) {
        int seen = look_once(images, wake, wake_expected, watching);
        if (seen >= 0)
            return seen;
        CPU_RELAX();
        if (!(turn & 15) && monotonic_ns() >= busy_until)
            break;
    }
    while (monotonic_ns() < until) {
        Py_BEGIN_ALLOW_THREADS
        sched_yield();
        Py_END_ALLOW_THREADS
        int seen = look_once(images, wake, wake_expected, watching);
        if (seen >= 0)
            return seen;
    }
    return 0;
}

/* Sleeps until one of `images` (a tuple of ImageCore; the first 127 count) has a frame at its
 * position, *wake (when not NULL) differs from wake_expected, or timeout_ns passes (< 0:
 * forever). Returns 1 when an image has a frame (or was closed) after the sleep, 0 when none
 * has, -1 with TypeError for an item that is not an image. Writers signal only while someone
 * sleeps (see wake_word). The caller holds the GIL; it is released while asleep. */
int wait_images(PyObject *images, int32_t *wake, int32_t wake_expected, int64_t timeout_ns,
                int64_t spin_ns)
{
    return wait_images_watching(images, wake, wake_expected, NULL, timeout_ns, spin_ns);
}

/* wait_images, also ended when the watched word of `watching` (SubscriptionCore.watch_word,
 * when set) no longer holds its value: 2 then (at once if it differs already). The word's
 * ringer always wakes, so no waiters count: a requester sleeps on its publication's
 * is-connected word, which the driver clears and wakes when the last responder leaves. */
int wait_images_watching(PyObject *images, int32_t *wake, int32_t wake_expected,
                         SubscriptionCore *watching, int64_t timeout_ns, int64_t spin_ns)
{
    if (watched_moved(watching))
        return 2;
    if (timeout_ns >= 0 && timeout_ns < spin_ns)
        spin_ns = timeout_ns;
    if (spin_ns > 0) {
        int spun = spin_for_images(images, wake, wake_expected, watching, spin_ns);
        if (spun)
            return spun;
        if (timeout_ns > 0)
            timeout_ns -= spin_ns;  /* the spin took its part of the timeout */
    }
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
        words[count] = meta_i32(&image->g, META_DATA_WAKE);
        expected[count] = arm_data_word(words[count], meta_i32(&image->g, META_DATA_WAITERS));
        image->sleeping++;
        sleeping[slept++] = image;
        count++;
    }
    for (int i = 0; i < slept && !ready; i++)
        ready = image_ready(sleeping[i]);
    if (ready == 0 && watching != NULL && watching->watch_word != NULL && count < 128) {
        words[count] = watching->watch_word;
        expected[count++] = watching->watch_value;
        if (watched_moved(watching))
            ready = 2;
    }
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
    if (ready == 0 && watched_moved(watching))
        ready = 2;
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
    int ready = wait_images(images, word, value, timeout_to_ns(timeout), 0);
    return ready < 0 ? NULL : PyBool_FromLong(ready);
}

/* Wakes the sleepers on one of a log's wake-up words (wake_word): `word` and `waiters` are
 * metadata offsets. `caller` names the module function in the TypeError for a non-buffer. */
static PyObject *wake_log(PyObject *arg, const char *caller, int word, int waiters)
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
    uint8_t *meta = log->data + log->capacity - LOG_META_DATA_LENGTH;
    wake_word((int32_t *)(meta + word), (int32_t *)(meta + waiters));
    Py_RETURN_NONE;
}

/* wake_log_readers(log_buffer): wake readers asleep on a log whose frames were written by
 * other means than PublicationCore (the netbridge's insert_frames). */
static PyObject *native_wake_log_readers(PyObject *m, PyObject *arg)
{
    return wake_log(arg, "wake_log_readers", META_DATA_WAKE, META_DATA_WAITERS);
}

/* wake_log_writers(log_buffer): wake publishers asleep on a log whose limit a position other
 * than a subscriber's holds back (the netbridge sender's, after it moved). */
static PyObject *native_wake_log_writers(PyObject *m, PyObject *arg)
{
    return wake_log(arg, "wake_log_writers", META_PROGRESS_WAKE, META_PROGRESS_WAITERS);
}

PyMethodDef wakeup_functions[] = {
    {"signal_word", native_signal_word, METH_VARARGS,
     "signal_word(buffer, offset): bump a wake-up word and wake its sleepers"},
    {"wake_sleepers", native_wake_sleepers, METH_VARARGS,
     "wake_sleepers(buffer, offset): wake a word's sleepers without changing it"},
    {"wait_word", native_wait_word, METH_VARARGS,
     "wait_word(buffer, offset, expected, timeout_s): sleep while the word holds expected"},
    {"wait_for_data", native_wait_for_data, METH_VARARGS,
     "wait_for_data(images, timeout_s, wake=None) -> bool: sleep until an image has a frame"},
    {"wake_log_readers", native_wake_log_readers, METH_O,
     "wake_log_readers(log_buffer): wake readers asleep on the log (after insert_frames)"},
    {"wake_log_writers", native_wake_log_writers, METH_O,
     "wake_log_writers(log_buffer): wake publishers asleep on the log (after the sender "
     "position moved)"},
    {NULL, NULL, 0, NULL},
};
