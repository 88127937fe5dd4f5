/*
 * The netbridge's busy window between duty cycles (netbridge/bridge.py): busy_poll spins,
 * without the GIL, over its sockets, the LogWatcher's watches and its senders, and sends a
 * sender's newly committed DATA itself (as scan_datagrams then send_batch would); send_now is
 * that send at once.
 *
 * Runs in the netbridge process, on its duty-cycle thread; arguments are read with the GIL,
 * the spin runs without it.
 */
#include "io.h"

#include <poll.h>
#include <sched.h>

/* One sender the spin sends for by itself (see busy_poll): DATA committed at `position` goes
 * out as scan_datagrams and send_batch would send it, to every destination. */
typedef struct {
    int fd;
    LogGeometry g;
    int64_t position, limit;
    int mtu, max_datagrams;
    struct sockaddr_in *destinations;
    Py_ssize_t destination_count;
    Sealer *sealer; /* an authenticated channel's, or NULL */
    int blocked; /* a committed frame the limit leaves no room for: left to the duty cycle */
} SpinSend;

static int spin_send_arg(PyObject *item, SpinSend *send)
{
    PyObject *log, *destinations, *sealer = Py_None;
    int term_length;
    long long position, limit;
    memset(send, 0, sizeof *send);
    if (!PyTuple_Check(item)) {
        PyErr_Format(PyExc_TypeError, "a send is a tuple (fd, log_buffer, term_length, "
                     "position, limit, mtu, max_datagrams, destinations[, sealer]), not %R", item);
        return -1;
    }
    if (!PyArg_ParseTuple(item, "iO!iLLiiO!|O", &send->fd, &AtomicBufferType, &log,
                          &term_length, &position, &limit, &send->mtu, &send->max_datagrams,
                          &PyTuple_Type, &destinations, &sealer) ||
        sealer_arg(sealer, &send->sealer) < 0 ||
        shmbus->geometry_from((AtomicBuffer *)log, term_length, 0, &send->g) < 0)
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
 * when no whole frame fits its limit), sealed once for all of them on an authenticated
 * channel; *error is set to the errno of a bad socket (ENOMEM: sealing failed). `spans` holds
 * twice max_datagrams. No GIL. */
static Scan send_committed(SpinSend *send, Span *spans, int *error)
{
    Scan scan = scan_spans(&send->g, send->position, send->limit, send->mtu,
                           send->max_datagrams, spans);
    uint8_t *data = send->g.terms;
    const Span *out = spans;
    if (send->sealer != NULL && scan.count) {
        Span *sealed = spans + send->max_datagrams;
        if ((data = seal_spans(send->sealer, data, spans, scan.count, sealed)) == NULL) {
            *error = ENOMEM;
            return scan;
        }
        out = sealed;
    }
    for (Py_ssize_t d = 0; d < send->destination_count && scan.count; d++) {
        int done = send_spans(send->fd, data, out, scan.count, &send->destinations[d]);
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
    if ((spans = PyMem_Malloc((size_t)send.max_datagrams * 2 * sizeof *spans)) == NULL) {
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
 * position, limit, mtu, max_datagrams, destinations[, sealer]): once a publisher commits at `position`,
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
    if ((spans = PyMem_Malloc((size_t)max_datagrams * 2 * sizeof *spans)) == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Watch watches[WATCH_MAX]; /* more are left out, as arm does: found at the deadline */
    int count = 0;
    for (int progress = 0; progress < 2; progress++)
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(lists[progress]) && count < WATCH_MAX; i++)
            if (shmbus->watch_arg(PyTuple_GET_ITEM(lists[progress], i), progress, &watches[count++]) < 0)
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
        if (sent_index >= 0 || (ready = shmbus->watch_ready(watches, count)))
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

PyMethodDef busy_poll_functions[] = {
    {"send_now", native_send_now, METH_O,
     "send_now(send) -> (position, datagrams, bytes, back_pressured, more): busy_poll's send "
     "of what is committed, at once"},
    {"busy_poll", native_busy_poll, METH_VARARGS,
     "busy_poll(fds, data_watches, progress_watches, until_ns, sends=()) -> (found, sent): "
     "spin until an fd is readable, a watch is ready, a sender sent, or until_ns"},
    {NULL, NULL, 0, NULL},
};
