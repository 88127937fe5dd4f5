/*
 * The netbridge receiver's writing of an image log (Aeron's TermRebuilder): validate_frames
 * checks every frame header of a DATA/PAD datagram against its place in the term,
 * insert_frames copies validated frames in, the first frame's length last with a release store,
 * and insert_in_order does both for receive_batch when a datagram continues an image exactly
 * (the condition netbridge/placement.py calls in_order; tests/netbridge/test_placement.py
 * checks the two agree; frames: docs/protocol.md, Frames on the wire).
 *
 * Frames are read as shmbus_native.h lays them out; everything is bounds-checked against the
 * buffers given: bad arguments raise IndexError/ValueError and a bad datagram is an error code,
 * never a read or write outside a buffer.
 *
 * Runs in the netbridge process, on its duty-cycle thread, with the GIL held.
 */
#include "io.h"

#define WIRE_INVALID (-1)

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
        int64_t aligned = ALIGN((int64_t)frame_length, FRAME_ALIGNMENT);
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
    if (shmbus->ab_check(ab, at, end - start, 4) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const uint8_t *src = (const uint8_t *)view.buf + start;
    memcpy(ab->data + at + 4, src + 4, (size_t)(end - start - 4));
    STORE_RELEASE((int32_t *)(ab->data + at), rd_i32(src));
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(end - start);
}

/* One of receive_batch's images: (log buffer, session id, stream id, term length, initial term
 * id, position, limit). */
int in_order_image_arg(PyObject *item, InOrderImage *image)
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
    if (shmbus->geometry_from((AtomicBuffer *)log, term_length, 0, &g) < 0)
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
InOrderImage *insert_in_order(InOrderImage *images, Py_ssize_t count, const uint8_t *d,
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

PyMethodDef term_rebuild_functions[] = {
    {"validate_datagram", native_validate_datagram, METH_VARARGS,
     "validate_datagram(datagram, term_offset, session_id, stream_id, term_id, term_length, "
     "below) -> (end, span, skip) or -1 if any frame header is invalid (see term_rebuild.c)"},
    {"insert_frames", native_insert_frames, METH_VARARGS,
     "insert_frames(buffer, at, datagram, start, end) -> int: copy datagram[start:end] to "
     "buffer[at:], the first frame's length last with a release store"},
    {NULL, NULL, 0, NULL},
};
