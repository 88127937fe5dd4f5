/*
 * The term appender (term_appender.h): reserving space in the active term, writing frames and
 * padding, rotating the log, raising the publication limit from the counted positions, and
 * claiming, committing and aborting single frames.
 *
 * Runs in client processes, on whichever thread offers (publication.c calls it with the GIL
 * held). Writes frames other processes read concurrently (see the memory ordering in
 * shmbus_native.h), and words the driver's unblocker may take (see below).
 */
#include "term_appender.h"

/* Copies n bytes out of a list of pieces, advancing the cursor (*pi, *po). */
static void gather_copy(uint8_t *dst, const Piece *pieces, Py_ssize_t *pi, Py_ssize_t *po,
                        Py_ssize_t n)
{
    while (n > 0) {
        Py_ssize_t avail = pieces[*pi].len - *po;
        if (avail == 0) { (*pi)++; *po = 0; continue; }
        Py_ssize_t take = avail < n ? avail : n;
        memcpy(dst, pieces[*pi].ptr + *po, (size_t)take);
        dst += take; *po += take; n -= take;
    }
}

/*
 * A writer only descheduled past publication_unblock_timeout is not dead, yet the driver's
 * unblocker (shmbus/driver/log_unblocker.py) pads over its reservation as if it were. So the
 * two words the unblocker takes are never written with a plain store:
 *
 * - the header's first 8 bytes (negative length, version, flags, type) go in with one
 *   compare-and-set from zero: it fails when the unblocker padded the zero gap this frame was
 *   to go in (it takes every 32-byte slot of the gap), and nothing of the frame is written;
 * - the commit is a compare-and-set of the length from negative to positive: it fails when
 *   the unblocker took the frame to pad it.
 *
 * Either way the writer learns its message is not in the log: an offer returns ADMIN_ACTION
 * (publish tries again: a new reservation, the message appended once), a claim fails, a
 * commit raises ValueError. The type goes in with the length, so the unblocker's PAD type,
 * written after it took the frame, is never overwritten by the writer's.
 */
#define PADDED_OVER (-1)        /* the header's compare-and-set failed: nothing written */
#define TAKEN_OVER (-2)         /* the commit's compare-and-set failed: the frame is padding */

static inline int write_header(TermAppender *a, uint8_t *frame, int32_t frame_length,
                               uint8_t flags, uint16_t type, int32_t term_offset,
                               int32_t term_id, int64_t reserved_value)
{
    /* The negative length goes in first, so a writer that dies here leaves a frame the reader
     * stops at and the driver can later recognise as blocked. */
    uint8_t first[8];
    int32_t negative = -frame_length;
    memcpy(first, &negative, 4);
    first[VERSION_OFFSET] = 0;
    first[FLAGS_OFFSET] = flags;
    memcpy(first + TYPE_OFFSET, &type, 2);
    int64_t expected = 0, desired;
    memcpy(&desired, first, 8);
    if (!CAS((int64_t *)frame, &expected, desired))
        return PADDED_OVER;
    wr_i32(frame + TERM_OFFSET_OFFSET, term_offset);
    wr_i32(frame + SESSION_ID_OFFSET, a->session_id);
    wr_i32(frame + STREAM_ID_OFFSET, a->stream_id);
    wr_i32(frame + TERM_ID_OFFSET, term_id);
    wr_i64(frame + RESERVED_VALUE_OFFSET, reserved_value);
    return 0;
}

/* Publishes a frame whose header holds -frame_length; TAKEN_OVER if the unblocker took it. */
static inline int commit_frame(uint8_t *frame, int32_t frame_length)
{
    int32_t expected = -frame_length;
    return CAS((int32_t *)frame, &expected, frame_length) ? 0 : TAKEN_OVER;
}

/* Pads term[offset, offset + length) of this writer's reservation. A failure needs nothing
 * more: the unblocker padded (or is padding) that space itself. */
static inline void write_padding(TermAppender *a, uint8_t *term, int32_t offset,
                                 int32_t length, int32_t term_id)
{
    if (write_header(a, term + offset, length, UNFRAGMENTED, HDR_TYPE_PAD, offset, term_id,
                     0) == 0)
        commit_frame(term + offset, length);
}

/* Space a message of `length` bytes takes in the term, all fragments included. */
static inline int32_t required_length(const TermAppender *a, Py_ssize_t length)
{
    if (length <= a->max_payload)
        return (int32_t)ALIGN(length + HEADER_LENGTH, FRAME_ALIGNMENT);
    Py_ssize_t full = length / a->max_payload;
    Py_ssize_t rest = length % a->max_payload;
    Py_ssize_t required = full * ALIGN(a->max_payload + HEADER_LENGTH, FRAME_ALIGNMENT);
    if (rest > 0)
        required += ALIGN(rest + HEADER_LENGTH, FRAME_ALIGNMENT);
    return (int32_t)required;
}

/*
 * Writes one message (maybe fragmented) at term[*offset]; the space is already reserved.
 * Returns 0 with *offset past the message, or PADDED_OVER / TAKEN_OVER (see write_header) with
 * *offset where this writer's space stops being padding: its frames from there on were never
 * written (see pad_rest).
 */
static int write_message(TermAppender *a, uint8_t *term, int32_t *offset, int32_t term_id,
                         const Piece *pieces, Py_ssize_t length, int64_t reserved_value)
{
    Py_ssize_t pi = 0, po = 0;
    Py_ssize_t remaining = length;
    uint8_t flags = length <= a->max_payload ? UNFRAGMENTED : BEGIN_FLAG;
    do {
        Py_ssize_t chunk = remaining < a->max_payload ? remaining : a->max_payload;
        int32_t frame_length = (int32_t)chunk + HEADER_LENGTH;
        if (remaining == chunk)
            flags |= END_FLAG;
        uint8_t *frame = term + *offset;
        if (write_header(a, frame, frame_length, flags, HDR_TYPE_DATA, *offset, term_id,
                         reserved_value) < 0)
            return PADDED_OVER;
        gather_copy(frame + HEADER_LENGTH, pieces, &pi, &po, chunk);
        *offset += (int32_t)ALIGN(frame_length, FRAME_ALIGNMENT);
        if (commit_frame(frame, frame_length) < 0)
            return TAKEN_OVER;
        remaining -= chunk;
        flags = 0;
    } while (remaining > 0);
    return 0;
}

/* After a TAKEN_OVER at `from`: the unblocker padded that one frame, and the rest of this
 * writer's reservation, up to `end`, is still zero; pad it now rather than leave readers at
 * it for another unblock timeout. (After PADDED_OVER the unblocker's padding covers it.) */
static void pad_rest(TermAppender *a, uint8_t *term, int status, int32_t from,
                     int32_t end, int32_t term_id)
{
    if (status == TAKEN_OVER && from < end)
        write_padding(a, term, from, end - from, term_id);
}

/* Moves the log to the next term (Aeron's rotateLog); safe for concurrent callers. */
static void rotate_log(const LogGeometry *g, int32_t term_count, int32_t term_id)
{
    int32_t next_term_id = (int32_t)((uint32_t)term_id + 1u);
    int32_t next_term_count = term_count + 1;
    int next_index = next_term_count % PARTITION_COUNT;
    int32_t expected_term_id = (int32_t)((uint32_t)next_term_id - PARTITION_COUNT);
    int64_t new_raw_tail = pack_tail(next_term_id, 0);
    int64_t *tail = tail_ptr(g, next_index);
    for (;;) {
        int64_t raw = LOAD_ACQUIRE(tail);
        if (term_id_of(raw) != expected_term_id)
            break;
        if (CAS(tail, &raw, new_raw_tail))
            break;
    }
    int32_t expected_count = term_count;
    CAS(active_term_count_ptr(g), &expected_count, next_term_count);
}

static int64_t back_pressure_status(TermAppender *a, int64_t position, int32_t length)
{
    if (position + length >= a->max_possible_position)
        return MAX_POSITION_EXCEEDED;
    if (LOAD_ACQUIRE((int32_t *)(a->g.meta + META_IS_CONNECTED)) == 1)
        return BACK_PRESSURED;
    return NOT_CONNECTED;
}

/* A writer that reached its limit raises it from the counted positions, if they allow, and
 * while the limit counter is its own: a process stopped past its liveness may find it freed
 * (its registration id cleared) and given to someone else. */
static inline int64_t current_limit(TermAppender *a, int64_t position, int64_t limit)
{
    if (position < limit || a->values == NULL ||
        LOAD_ACQUIRE(a->limit + 1) != a->limit_registration)
        return limit;
    fc_raise(&a->g, a->values, a->values_len, a->limit, position);
    return LOAD_ACQUIRE(a->limit);
}

static inline void wake_readers(TermAppender *a)
{
    wake_data_once(meta_i32(&a->g, META_DATA_WAKE), meta_i32(&a->g, META_DATA_WAITERS),
                   &a->woke);
}

/* The state a writer sees before appending; see reserve(). */
typedef struct {
    int32_t term_count;
    int32_t term_id;
    int64_t term_offset;      /* may exceed the term length for concurrent writers */
    int64_t position;
    int64_t limit;
} AppendState;

/* Reads the current tail. Returns 0, or ADMIN_ACTION while a rotation is half done. */
static int64_t read_state(TermAppender *a, AppendState *s)
{
    s->limit = LOAD_ACQUIRE(a->limit);
    if (a->exclusive) {
        s->term_count = a->x_term_count;
        s->term_id = a->x_term_id;
        s->term_offset = a->x_term_offset;
        s->position = a->x_term_begin_position + a->x_term_offset;
        return 0;
    }
    s->term_count = LOAD_ACQUIRE(active_term_count_ptr(&a->g));
    int64_t raw = LOAD_ACQUIRE(tail_ptr(&a->g, s->term_count % PARTITION_COUNT));
    s->term_id = term_id_of(raw);
    s->term_offset = term_offset_of(raw);
    if (term_count_between(s->term_id, a->g.initial_term_id) != s->term_count)
        return ADMIN_ACTION;
    int64_t offset = s->term_offset < a->g.term_length ? s->term_offset : a->g.term_length;
    s->position = term_begin_position(&a->g, s->term_id) + offset;
    return 0;
}

/*
 * Reserves `length` bytes in the active term. On success returns 0 and sets *term_id and
 * *offset; the caller writes frames there. When the reservation does not fit in the term, the
 * rest of the term is padded, the log rotated, and ADMIN_ACTION (or MAX_POSITION_EXCEEDED) is
 * returned; *fit_end receives how far the reservation is usable (for batches).
 */
static int64_t reserve(TermAppender *a, const AppendState *s, int32_t length,
                       int32_t *term_id, int32_t *offset)
{
    const LogGeometry *g = &a->g;
    int index = s->term_count % PARTITION_COUNT;
    uint8_t *term = term_at(g, index);
    int64_t start;
    if (a->exclusive) {
        *term_id = s->term_id;
        start = s->term_offset;
        if (start + length <= g->term_length) {
            a->x_term_offset = (int32_t)(start + length);
            STORE_RELEASE(tail_ptr(g, index), pack_tail(*term_id, a->x_term_offset));
            *offset = (int32_t)start;
            return 0;
        }
    } else {
        int64_t raw = FETCH_ADD(tail_ptr(g, index), (int64_t)length);
        *term_id = term_id_of(raw);
        start = term_offset_of(raw);
        if (start + length <= g->term_length) {
            *offset = (int32_t)start;
            return 0;
        }
    }
    /* end of term: whoever's reservation covers the end pads it */
    if (start < g->term_length)
        write_padding(a, term, (int32_t)start, (int32_t)(g->term_length - start), *term_id);
    int64_t term_end_position = term_begin_position(g, *term_id) + g->term_length;
    if (term_end_position >= a->max_possible_position)
        return MAX_POSITION_EXCEEDED;
    if (a->exclusive) {
        STORE_RELEASE(tail_ptr(g, index), pack_tail(*term_id, g->term_length));
        rotate_log(g, s->term_count, *term_id);
        a->x_term_count = s->term_count + 1;
        a->x_term_id = (int32_t)((uint32_t)*term_id + 1u);
        a->x_term_offset = 0;
        a->x_term_begin_position = term_end_position;
    } else {
        rotate_log(g, s->term_count, *term_id);
    }
    return ADMIN_ACTION;
}

/* Reads the state and reserves `required` bytes for one message below the limit: 0 with the
 * state in *s and the reservation's term id and offset, or a status (< 0) of reserve or of the
 * back pressure. */
static int64_t reserve_message(TermAppender *a, int32_t required, AppendState *s,
                               int32_t *term_id, int32_t *offset)
{
    int64_t status = read_state(a, s);
    if (status < 0)
        return status;
    s->limit = current_limit(a, s->position, s->limit);
    if (s->position >= s->limit)
        return back_pressure_status(a, s->position, required);
    return reserve(a, s, required, term_id, offset);
}

int64_t appender_append(TermAppender *a, const Piece *pieces, Py_ssize_t length,
                        int64_t reserved_value)
{
    AppendState s;
    int32_t required = required_length(a, length);
    int32_t term_id, offset;
    int64_t status = reserve_message(a, required, &s, &term_id, &offset);
    if (status < 0)
        return status;
    uint8_t *term = term_at(&a->g, s.term_count % PARTITION_COUNT);
    int32_t at = offset;
    status = write_message(a, term, &at, term_id, pieces, length, reserved_value);
    if (status < 0) {
        /* descheduled past the unblock timeout: the driver padded this message over */
        pad_rest(a, term, (int)status, at, offset + required, term_id);
        wake_readers(a);
        return ADMIN_ACTION;
    }
    wake_readers(a);
    return term_begin_position(&a->g, term_id) + offset + required;
}

int64_t appender_append_batch(TermAppender *a, Py_ssize_t count, piece_getter get, void *ctx)
{
    AppendState s;
    int64_t status = read_state(a, &s);
    if (status < 0)
        return status;
    s.limit = current_limit(a, s.position, s.limit);
    if (s.position >= s.limit) {
        Piece first;
        if (get(ctx, 0, &first) < 0) return INT64_MIN;
        return back_pressure_status(a, s.position, required_length(a, first.len));
    }
    /* admit messages while the batch starts below the limit and fits in the term */
    int64_t room = a->g.term_length - s.term_offset;
    int64_t total = 0;
    Py_ssize_t admitted = 0;
    for (; admitted < count; admitted++) {
        Piece p;
        if (get(ctx, admitted, &p) < 0) return INT64_MIN;
        int32_t required = required_length(a, p.len);
        if (admitted > 0 && (total + required > room || s.position + total >= s.limit))
            break;
        total += required;
    }
    int32_t term_id, offset;
    status = reserve(a, &s, (int32_t)total, &term_id, &offset);
    uint8_t *term = term_at(&a->g, s.term_count % PARTITION_COUNT);
    if (status == 0) {
        int32_t end = offset + (int32_t)total;
        for (Py_ssize_t i = 0; i < admitted; i++) {
            Piece p;
            get(ctx, i, &p);
            int rc = write_message(a, term, &offset, term_id, &p, p.len, 0);
            if (rc < 0) {
                /* descheduled past the unblock timeout: the driver padded the batch over from
                 * message i on; those before it are in the log */
                pad_rest(a, term, rc, offset, end, term_id);
                admitted = i;
                break;
            }
        }
        wake_readers(a);
        return admitted > 0 ? admitted : ADMIN_ACTION;
    }
    return status;
}

int64_t appender_claim(TermAppender *a, int32_t length, int64_t reserved_value,
                       Py_ssize_t *frame_offset)
{
    AppendState s;
    int32_t frame_length = length + HEADER_LENGTH;
    int32_t required = (int32_t)ALIGN(frame_length, FRAME_ALIGNMENT);
    int32_t term_id, offset;
    int64_t status = reserve_message(a, required, &s, &term_id, &offset);
    if (status < 0)
        return status;
    int index = s.term_count % PARTITION_COUNT;
    if (write_header(a, term_at(&a->g, index) + offset, frame_length, UNFRAGMENTED,
                     HDR_TYPE_DATA, offset, term_id, reserved_value) < 0)
        /* descheduled past the unblock timeout: the driver padded the reservation over */
        return ADMIN_ACTION;
    *frame_offset = (Py_ssize_t)index * a->g.term_length + offset;
    return term_begin_position(&a->g, term_id) + offset + required;
}

int appender_commit(TermAppender *a, uint8_t *frame, int32_t length)
{
    if (commit_frame(frame, -length) < 0)
        return TAKEN_OVER;
    wake_readers(a);
    return 0;
}

void appender_abort(TermAppender *a, uint8_t *frame, int32_t length)
{
    if (length == INT32_MIN)  /* the unblocker is padding it: the same outcome */
        return;
    /* The unblocker, if it takes the frame meanwhile, writes PAD too: the same outcome. */
    uint16_t pad = HDR_TYPE_PAD;
    memcpy(frame + TYPE_OFFSET, &pad, 2);
    commit_frame(frame, -length);
    wake_readers(a);
}

int64_t appender_position(TermAppender *a)
{
    AppendState s;
    if (read_state(a, &s) < 0) {
        /* mid-rotation: the previous term is complete */
        int32_t count = LOAD_ACQUIRE(active_term_count_ptr(&a->g));
        return (int64_t)count << a->g.position_bits;
    }
    return s.position;
}

int appender_has_room(TermAppender *a)
{
    AppendState s;
    return read_state(a, &s) < 0 || current_limit(a, s.position, s.limit) > s.position;
}

void appender_init(TermAppender *a, const LogGeometry *g, int64_t *limit, const uint8_t *values,
                   Py_ssize_t values_len, int32_t mtu, int32_t session_id, int32_t stream_id,
                   int exclusive)
{
    int32_t term_length = g->term_length;
    a->g = *g;
    a->woke = -1;
    a->limit = limit;
    a->limit_registration = values != NULL ? LOAD_ACQUIRE(limit + 1) : 0;
    a->values = values;
    a->values_len = values_len;
    a->session_id = session_id;
    a->stream_id = stream_id;
    a->mtu = mtu;
    a->max_payload = mtu - HEADER_LENGTH;
    int32_t max_message = term_length / 8;
    a->max_message = max_message < (16 << 20) ? max_message : (16 << 20);
    a->max_possible_position = (int64_t)term_length << 31;
    a->exclusive = exclusive;
    a->x_term_count = a->x_term_id = a->x_term_offset = 0;
    a->x_term_begin_position = 0;
    if (exclusive) {
        int32_t count = LOAD_ACQUIRE(active_term_count_ptr(&a->g));
        int64_t raw = LOAD_ACQUIRE(tail_ptr(&a->g, count % PARTITION_COUNT));
        int64_t offset = term_offset_of(raw);
        a->x_term_count = count;
        a->x_term_id = term_id_of(raw);
        a->x_term_offset = (int32_t)(offset < term_length ? offset : term_length);
        a->x_term_begin_position = term_begin_position(&a->g, a->x_term_id);
    }
}
