/*
 * UDP in batches, straight between sockets and logs: receive_batch (one recvmmsg; DATA that
 * continues an image exactly at its high-water mark, inside its window, is validated and
 * inserted here; the first datagram of an image that does not, and every one of that image
 * after it, is handed back for the Python receiver (control frames, loss, new sessions), so its
 * sans-IO rules see each image's datagrams in the order they came; a datagram that names no one
 * image: every one after it) and send_batch/send_spans (sendmmsg of scan_datagrams' spans to one
 * destination, runs of equal length as one UDP_SEGMENT send). IPv4 only, as the netbridge's
 * transport is.
 *
 * Runs in the netbridge process, on its duty-cycle thread (netbridge/datagram_io.py) with the
 * GIL held; send_spans also without it (busy_poll's spin, send_now).
 */
#include "io.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#define BATCH_MAX 64
#define BATCH_SLOT 65536
/* UDP generic segmentation (Linux 4.18), declared here since libc headers may predate it */
#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#define GSO_SEGMENTS_MAX 64   /* UDP_MAX_SEGMENTS of the oldest kernels that have it */
#define SEND_SPANS_MAX 1024   /* datagrams per sendmmsg at most */
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

/* A numeric IPv4 (host, port) as a socket address; -1 with ValueError otherwise. */
int sockaddr_arg(PyObject *destination, struct sockaddr_in *a)
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

/* receive_batch(fd, slots, images, sealer=None) -> (received, in_order, rest, dropped)
 *
 * With a Sealer (an authenticated channel's socket), each datagram is opened first: one that
 * does not open is dropped, counted by the Sealer, and listed in `dropped` as (kind, source)
 * (None when none was); the rest go on as their plaintext.
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
    PyObject *image_args, *sealer_obj = Py_None;
    Sealer *sealer;
    if (!PyArg_ParseTuple(args, "iw*O!|O", &fd, &slots, &PyTuple_Type, &image_args,
                          &sealer_obj))
        return NULL;
    if (sealer_arg(sealer_obj, &sealer) < 0) {
        PyBuffer_Release(&slots);
        return NULL;
    }
    PyObject *result = NULL, *in_order = NULL, *rest = NULL, *dropped = NULL;
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
        uint8_t *d = iov[i].iov_base;
        int64_t size = msgs[i].msg_len;
        if (sealer != NULL) {
            int opened = sealer_open(sealer, d, size);
            if (opened != SEAL_OPENED) {
                PyObject *source = source_tuple(&sources[i]);
                PyObject *entry = source == NULL ? NULL : Py_BuildValue("(iN)", opened, source);
                if (entry == NULL || (dropped == NULL && (dropped = PyList_New(0)) == NULL) ||
                    PyList_Append(dropped, entry) < 0) {
                    Py_XDECREF(entry);
                    goto done;
                }
                Py_DECREF(entry);
                continue;
            }
            d += SEAL_HEADER;
            size -= SEAL_OVERHEAD;
        }
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
            "(nLN)", (Py_ssize_t)(d - (uint8_t *)slots.buf), (long long)size, source);
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
    result = Py_BuildValue("(iOOO)", received, in_order, rest, dropped ? dropped : Py_None);
done:
    Py_XDECREF(in_order);
    Py_XDECREF(rest);
    Py_XDECREF(dropped);
    PyMem_Free(images);
    PyBuffer_Release(&slots);
    return result;
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
int send_spans(int fd, uint8_t *data, const Span *spans, Py_ssize_t count,
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

int send_sealed(int fd, uint8_t *data, const Span *spans, Py_ssize_t count,
                const struct sockaddr_in *to, Sealer *sealer, Span *sealed)
{
    if (sealer == NULL)
        return send_spans(fd, data, spans, count, to);
    uint8_t *scratch = seal_spans(sealer, data, spans, count, sealed);
    if (scratch == NULL)
        return -ENOMEM;
    return send_spans(fd, scratch, sealed, count, to);
}

/* send_batch(fd, buffer, spans, destination, sealer=None) -> datagrams sent
 *
 * With a Sealer, each datagram goes out sealed (see send_sealed).
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
    PyObject *obj, *destination, *sealer_obj = Py_None;
    Py_buffer packed;
    Sealer *sealer;
    if (!PyArg_ParseTuple(args, "iO!y*O|O", &fd, &AtomicBufferType, &obj, &packed, &destination,
                          &sealer_obj))
        return NULL;
    AtomicBuffer *ab = (AtomicBuffer *)obj;
    struct sockaddr_in to;
    Py_ssize_t count = packed.len / (Py_ssize_t)sizeof(Span);
    Span *spans = NULL;
    int sent = 0;
    if (sockaddr_arg(destination, &to) < 0 || shmbus->ab_check(ab, 0, 0, 1) < 0 ||
        sealer_arg(sealer_obj, &sealer) < 0)
        goto fail;
    if (packed.len % (Py_ssize_t)sizeof(Span)) {
        PyErr_Format(PyExc_ValueError, "spans of %zd bytes are not (offset, length) pairs",
                     packed.len);
        goto fail;
    }
    spans = PyMem_Malloc((size_t)(count ? count : 1) * 2 * sizeof(Span));
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
    sent = send_sealed(fd, ab->data, spans, count, &to, sealer, spans + count);
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

PyMethodDef udp_batch_functions[] = {
    {"receive_batch", native_receive_batch, METH_VARARGS,
     "receive_batch(fd, slots, images, sealer=None) -> (received, in_order, rest, dropped): "
     "recvmmsg a batch, opening sealed datagrams, "
     "inserting in-order DATA natively (see udp_batches.c)"},
    {"send_batch", native_send_batch, METH_VARARGS,
     "send_batch(fd, buffer, spans, destination, sealer=None) -> int: sendmmsg spans of "
     "buffer, sealed with a sealer"},
    {NULL, NULL, 0, NULL},
};
