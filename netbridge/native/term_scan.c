/*
 * The netbridge sender's reading of a publication log: scan_frames, the committed whole frames
 * that make one datagram; term_scan (one datagram's worth from a term offset, for the Python
 * sender) and scan_datagrams/scan_spans (the sender's DATA loop: datagrams from its position up
 * to its limit, as spans of the log that send_batch sends).
 * (What a datagram may hold: docs/protocol.md, Frames on the wire)
 *
 * Runs in the netbridge process, on its duty-cycle thread: term_scan and scan_datagrams with
 * the GIL held; scan_spans also without it (busy_poll's spin, send_now).
 */
#include "io.h"

/* Committed whole frames of `term` from term_offset on (see term_scan below): sets *available
 * to the bytes of them to send and *padding to the bytes skipped after them. Its rules are not
 * the image readers' (next_frame in shmbus/shm/native/image.c): it cuts a datagram, so it stops
 * before a frame that would not fit and after a PAD (sent as its header); a length that would
 * step past the term stops it without an error, as it also runs without the GIL (busy_poll);
 * and it checks no term id, since flow control counts the sender's position, so no writer
 * laps the sender. */
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
        int64_t aligned = ALIGN((int64_t)frame_length, FRAME_ALIGNMENT);
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
    if (shmbus->ab_check(ab, term_start, term_length, 8) < 0)
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

/* The loop of scan_datagrams over a log whose geometry `g` is checked, into `out` (room for
 * max_datagrams spans). Touches no Python object: runs without the GIL. */
Scan scan_spans(const LogGeometry *g, int64_t position, int64_t limit, int mtu, int max_datagrams,
                Span *out)
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
    if (shmbus->geometry_from((AtomicBuffer *)obj, term_length, 0, &g) < 0)
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

PyMethodDef term_scan_functions[] = {
    {"term_scan", native_term_scan, METH_VARARGS,
     "term_scan(buffer, term_start, term_length, term_offset, max_length, stop) -> (length, "
     "padding): committed whole frames to send from term_offset (see term_scan.c)"},
    {"scan_datagrams", native_scan_datagrams, METH_VARARGS,
     "scan_datagrams(log_buffer, term_length, position, limit, mtu, max_datagrams) -> "
     "(position, spans, back_pressured, more): the sender's DATA datagrams as log spans"},
    {NULL, NULL, 0, NULL},
};
