/*
 * The term appender: appends messages to a publication's log as frames (fragmented past the
 * max payload), claims and commits single frames, pads the end of a term, rotates the log and
 * raises the publication limit (docs/protocol.md). Plain C over the mapped log and counter
 * memory, no Python objects: publication.c is its Python type (PublicationCore), which keeps
 * closing, detaching and the calls up into Python.
 *
 * A concurrent appender (one log shared by threads and processes) reserves space with fetch-add
 * on the active term's tail; an exclusive one (a single writer) keeps its own view of the tail
 * and stores it. A writer the driver's unblocker padded over learns it (see term_appender.c).
 */
#ifndef SHMBUS_TERM_APPENDER_H
#define SHMBUS_TERM_APPENDER_H

#include "types.h"

/* One part of a message: an offer gathers up to 16. */
typedef struct {
    const uint8_t *ptr;
    Py_ssize_t len;
} Piece;

/* The i-th message of a batch (appender_append_batch): 0, or -1 with an error set by it. */
typedef int (*piece_getter)(void *ctx, Py_ssize_t i, Piece *out);

typedef struct {
    LogGeometry g;
    int64_t *limit;
    int64_t limit_registration; /* the limit counter's registration id while it is ours */
    const uint8_t *values;    /* counter values, to raise the limit from counted positions */
    Py_ssize_t values_len;
    int32_t session_id;
    int32_t stream_id;
    int32_t mtu;
    int32_t max_payload;
    int32_t max_message;
    int64_t max_possible_position;
    int exclusive;
    /* exclusive publications only: the single writer's own view of the tail */
    int32_t x_term_offset;
    int32_t x_term_id;
    int32_t x_term_count;
    int64_t x_term_begin_position;
    int64_t woke;             /* the data word's value after this writer's last wake-up, -1:
                               * none on this log (see wake_data_once) */
} TermAppender;

/* Sets the appender up over the log `g` (its mtu already checked): `limit` is the pub-lmt
 * position, `values` the counter values it may raise the limit from (NULL: never; else the
 * limit is a counter: value, registration id, ...). An exclusive appender takes the log's tail
 * as it is. */
INTERNAL void appender_init(TermAppender *a, const LogGeometry *g, int64_t *limit,
                            const uint8_t *values, Py_ssize_t values_len, int32_t mtu,
                            int32_t session_id, int32_t stream_id, int exclusive);

/* Appends one message (at most max_message bytes) made of the pieces. Returns the new
 * position, or NOT_CONNECTED, BACK_PRESSURED, ADMIN_ACTION or MAX_POSITION_EXCEEDED. */
INTERNAL int64_t appender_append(TermAppender *a, const Piece *pieces, Py_ssize_t length,
                                 int64_t reserved_value);

/* Appends messages [0, count) from `get` with a single reservation, as many as fit in the term
 * and start below the limit. Returns how many (>= 1), a negative code when none was, or
 * INT64_MIN when `get` failed. */
INTERNAL int64_t appender_append_batch(TermAppender *a, Py_ssize_t count, piece_getter get,
                                       void *ctx);

/* Claims one frame for a payload of `length` bytes (at most max_payload), its header written
 * with its length negative until appender_commit or appender_abort. Returns the position after
 * it and sets *frame_offset (into the log's terms), or returns a negative code. */
INTERNAL int64_t appender_claim(TermAppender *a, int32_t length, int64_t reserved_value,
                                Py_ssize_t *frame_offset);

/* Publishes the claimed frame whose length word held `length` (negative) and wakes the readers:
 * 0, or < 0 when the unblocker took the frame to pad it (nothing published, no wake-up). */
INTERNAL int appender_commit(TermAppender *a, uint8_t *frame, int32_t length);

/* Turns the claimed frame whose length word held `length` into padding and wakes the readers;
 * nothing when the unblocker is padding it (`length` INT32_MIN). */
INTERNAL void appender_abort(TermAppender *a, uint8_t *frame, int32_t length);

/* The position the next message would be appended at (mid-rotation: the end of the term). */
INTERNAL int64_t appender_position(TermAppender *a);

/* 1 when the limit (raised if it may be) is above the position now, or a rotation is half
 * done: an offer may go on. A writer waiting for room looks at this. */
INTERNAL int appender_has_room(TermAppender *a);

#endif /* SHMBUS_TERM_APPENDER_H */
