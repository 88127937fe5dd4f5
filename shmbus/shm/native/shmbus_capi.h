/*
 * What netbridge._io takes from shmbus.shm._native: the AtomicBuffer object's layout, the
 * LogWatcher's watches (busy_poll checks the same watches without its thread) and a table of
 * function and type pointers that _native exports as the capsule "shmbus.shm._native._C_API"
 * (as numpy's C API and datetime's CAPI are shared between extensions). Two extensions have
 * two copies of every static function; the capsule makes sure there is one AtomicBuffer type,
 * so that `O!` argument checks in _io accept the buffers _native makes.
 */
#ifndef SHMBUS_CAPI_H
#define SHMBUS_CAPI_H

#include "shmbus_native.h"

#define SHMBUS_CAPI_NAME "shmbus.shm._native._C_API"
/* Bumped whenever ShmbusCAPI, AtomicBuffer or Watch change: _io refuses another version. */
#define SHMBUS_CAPI_VERSION 1

typedef struct {
    PyObject_HEAD
    Py_buffer view;
    uint8_t *data;
    Py_ssize_t capacity;
    int has_view;
} AtomicBuffer;

#define WATCH_MAX 127

/* One of three kinds: a data watch (frame set), a progress watch (counter set) or a word watch
 * (neither: ready once `wake` differs from `threshold`; its ringer always wakes, so no waiters
 * count). */
typedef struct {
    const int32_t *frame;   /* data watch: the frame length where the reader waits, or NULL */
    const int64_t *counter; /* progress watch: a subscriber position counter */
    int64_t threshold;      /* progress: ready once the counter reaches it; word: the value seen */
    int32_t *wake;          /* the log's META_DATA_WAKE (data) or META_PROGRESS_WAKE, or the word */
    int32_t *waiters;       /* the matching waiters count (NULL for a word watch) */
} Watch;

typedef struct {
    int version;
    PyTypeObject *atomic_buffer_type;
    /* 0 if [offset, offset + length) is inside the buffer and aligned, else -1 with IndexError
     * or ValueError set */
    int (*ab_check)(AtomicBuffer *buffer, Py_ssize_t offset, Py_ssize_t length,
                    Py_ssize_t align);
    /* the geometry of a log of this term length in the buffer, or -1 with ValueError set */
    int (*geometry_from)(AtomicBuffer *log, int32_t term_length, int32_t initial_term_id,
                         LogGeometry *g);
    /* one watch as LogWatcher.arm takes it (progress: a counter watch), or -1 with an error */
    int (*watch_arg)(PyObject *item, int progress, Watch *w);
    /* 1 if any of the watches is ready */
    int (*watch_ready)(const Watch *watches, int count);
} ShmbusCAPI;

#endif /* SHMBUS_CAPI_H */
