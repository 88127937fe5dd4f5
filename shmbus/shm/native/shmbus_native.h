/*
 * The log buffer layout and the atomics, as static inline code: included by every source of
 * both extensions, shmbus.shm._native (shmbus/shm/native/) and netbridge._io
 * (netbridge/native/), in every process. Nothing here holds state or touches a Python object.
 *
 * Log buffer layout (shmbus/shm/log_buffer.py names the same offsets in Python; _native.LAYOUT
 * exports these, and tests/shmbus/shm/test_log_buffer.py compares the two):
 *   term 0 | term 1 | term 2 | metadata (4096 bytes)
 *   (docs/protocol.md, Log buffer layout and Log buffer metadata)
 * Frame header (little-endian, the wire DATA header of Aeron; docs/protocol.md, Frame header):
 *   0 frame_length i32 | 4 version u8 | 5 flags u8 | 6 type u16 | 8 term_offset i32 |
 *   12 session_id i32 | 16 stream_id i32 | 20 term_id i32 | 24 reserved_value i64
 *
 * Memory ordering: a frame is published by a release store of its positive length; readers load
 * the length with acquire and never look past a length <= 0. Concurrent appenders reserve space
 * with fetch-add on the active term's tail counter and rotate terms with compare-and-set
 * (docs/protocol.md, Appending, fragments and padding).
 */
#ifndef SHMBUS_NATIVE_H
#define SHMBUS_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- atomics (gcc/clang builtins; x86-64 and aarch64) ------------------------------------ */

#define LOAD_ACQUIRE(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_RELEASE(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define FETCH_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_SEQ_CST)
#define CAS(p, expected_ptr, desired) \
    __atomic_compare_exchange_n((p), (expected_ptr), (desired), 0, __ATOMIC_SEQ_CST, \
                                __ATOMIC_SEQ_CST)

/* ---- layout constants ---------------------------------------------------------------------- */

#define HEADER_LENGTH 32
#define FRAME_ALIGNMENT 32
#define PARTITION_COUNT 3
#define LOG_META_DATA_LENGTH 4096

#define FRAME_LENGTH_OFFSET 0
#define VERSION_OFFSET 4
#define FLAGS_OFFSET 5
#define TYPE_OFFSET 6
#define TERM_OFFSET_OFFSET 8
#define SESSION_ID_OFFSET 12
#define STREAM_ID_OFFSET 16
#define TERM_ID_OFFSET 20
#define RESERVED_VALUE_OFFSET 24

#define HDR_TYPE_PAD 0
#define HDR_TYPE_DATA 1
#define BEGIN_FLAG 0x80
#define END_FLAG 0x40
/* a whole message whose payload is a reference to a shared-memory block (large messages,
 * shmbus/shm/block_ring.py): the reader resolves it through Image._large_payload */
#define LARGE_FLAG 0x01
#define UNFRAGMENTED 0xC0
/* the flags of a reference frame: the large flag means a reference on a whole-message frame
 * only; on a fragment it is ignored, as other unknown flags are (every reader agrees: poll,
 * take, take_view, group members) */
#define IS_REFERENCE(flags) \
    (((flags) & (UNFRAGMENTED | LARGE_FLAG)) == (UNFRAGMENTED | LARGE_FLAG))

/* metadata offsets, relative to the start of the metadata section */
#define META_TAIL_COUNTERS 0
#define META_ACTIVE_TERM_COUNT 24
#define META_END_OF_STREAM_POSITION 128
#define META_IS_CONNECTED 136
#define META_INITIAL_TERM_ID 264    /* i32, written once when the log is created */
/* flow control and wake-ups (see shmbus/shm/log_buffer.py for the diagram) */
#define META_FC_LOCK 512            /* i64: pid of the process cleaning and raising pub-lmt */
#define META_FC_CLEAN_POSITION 520  /* i64: the log is zero from here on (behind consumers) */
#define META_READERS_RAISE 536      /* i32: pub-lmt's counter id + 1 when readers raise the limit
                                     * (its writer does not: an Aeron client's), else 0 */
#define META_DATA_WAKE 576          /* i32 futex word: bumped by writers when readers sleep */
#define META_DATA_WAITERS 580       /* i32: readers asleep on META_DATA_WAKE */
#define META_PROGRESS_WAKE 640      /* i32 futex word: bumped by readers when writers sleep */
#define META_PROGRESS_WAITERS 644   /* i32: writers asleep on META_PROGRESS_WAKE */
#define META_FC_VERSION 704         /* i32 seqlock over the counted set: odd while written */
#define META_FC_COUNT 708           /* i32: counters in the set (0: nobody counts) */
#define META_FC_WINDOW 712          /* i32: pub-lmt = slowest counted position + window */
#define META_FC_CLEAN_LAG 716       /* i32: bytes kept uncleaned behind the slowest (retransmits) */
#define META_FC_COUNTER_IDS 1024    /* i32[FC_MAX_COUNTED]: the counted position counters */
#define FC_MAX_COUNTED 768
#define COUNTER_LENGTH 128

/* publication result codes, Aeron's values */
#define NOT_CONNECTED (-1)
#define BACK_PRESSURED (-2)
#define ADMIN_ACTION (-3)
#define CLOSED (-4)
#define MAX_POSITION_EXCEEDED (-5)

/* controlled poll actions, Aeron's order */
#define ACTION_ABORT 1
#define ACTION_BREAK 2
#define ACTION_COMMIT 3
#define ACTION_CONTINUE 4

#define ALIGN(v, a) (((v) + ((a) - 1)) & ~((a) - 1))

static inline int32_t rd_i32(const uint8_t *p) { int32_t v; memcpy(&v, p, 4); return v; }
static inline int64_t monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* How long a waiter's spin (Context.wait_spin) looks without a system call before it starts
 * yielding the CPU between looks (wakeups.c, spin_for_images). */
#define BUSY_LOOK_NS 2000

#if defined(__x86_64__) || defined(__i386__)
#define CPU_RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CPU_RELAX() __asm__ __volatile__("yield")
#else
#define CPU_RELAX() ((void)0)
#endif

static inline int64_t rd_i64(const uint8_t *p) { int64_t v; memcpy(&v, p, 8); return v; }
static inline void wr_i32(uint8_t *p, int32_t v) { memcpy(p, &v, 4); }
static inline void wr_i64(uint8_t *p, int64_t v) { memcpy(p, &v, 8); }
static inline uint16_t rd_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static inline int32_t term_id_of(int64_t raw_tail) { return (int32_t)(raw_tail >> 32); }
static inline int64_t term_offset_of(int64_t raw_tail) { return raw_tail & 0xFFFFFFFFLL; }
static inline int64_t pack_tail(int32_t term_id, int32_t offset)
{
    return (int64_t)(((uint64_t)(uint32_t)term_id << 32) | (uint32_t)offset);
}

/* term count between two term ids, correct across the int32 wrap */
static inline int64_t term_count_between(int32_t term_id, int32_t initial_term_id)
{
    return (int64_t)(int32_t)((uint32_t)term_id - (uint32_t)initial_term_id);
}

/* ---- log geometry: where a log's terms, tails and metadata are ------------------------- */

typedef struct {
    uint8_t *terms;           /* start of term 0 */
    uint8_t *meta;            /* start of the metadata section */
    int32_t term_length;
    int position_bits;        /* log2(term_length) */
    int32_t initial_term_id;
} LogGeometry;

static inline uint8_t *term_at(const LogGeometry *g, int index)
{
    return g->terms + (Py_ssize_t)index * g->term_length;
}

static inline int64_t *tail_ptr(const LogGeometry *g, int index)
{
    return (int64_t *)(g->meta + META_TAIL_COUNTERS + 8 * index);
}

static inline int32_t *active_term_count_ptr(const LogGeometry *g)
{
    return (int32_t *)(g->meta + META_ACTIVE_TERM_COUNT);
}

static inline int64_t term_begin_position(const LogGeometry *g, int32_t term_id)
{
    return term_count_between(term_id, g->initial_term_id) << g->position_bits;
}

static inline int32_t *meta_i32(const LogGeometry *g, int offset)
{
    return (int32_t *)(g->meta + offset);
}

static inline int64_t *meta_i64(const LogGeometry *g, int offset)
{
    return (int64_t *)(g->meta + offset);
}

/* ---- wake-ups: futex words in shared memory, signalled only when someone sleeps ---------- */

/*
 * A sleeper increments the waiters count, reads the word, re-checks its condition and only
 * then sleeps on the word's value; a signaller makes its change visible, then (after a full
 * fence) reads the waiters count and, if anyone sleeps, bumps the word and wakes them. Either
 * the signaller sees the sleeper or the sleeper sees the change: no lost wake-up, and no
 * syscall on the signalling side while nobody sleeps.
 */
static inline void wake_word(int32_t *word, int32_t *waiters)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiters, __ATOMIC_RELAXED) > 0) {
        __atomic_fetch_add(word, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/*
 * A reader's arm before it sleeps on a log's data word: it counts itself among the waiters,
 * then bumps the word and returns the new value, which it sleeps on. The bump is what lets a
 * publication wake its readers once per sleep (wake_data_once) rather than once per message:
 * a sleeper woken but not yet running stays counted, and without the bump a writer could not
 * tell it from a new one.
 */
static inline int32_t arm_data_word(int32_t *word, int32_t *waiters)
{
    __atomic_fetch_add(waiters, 1, __ATOMIC_SEQ_CST);
    return __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
}

/*
 * wake_word for a writer that remembers, in *woke (-1: never), the value it last bumped the
 * data word to. While the word still holds that value, nobody has armed since that wake-up (a
 * sleeper arms with a bump, arm_data_word), so every sleeper counted was woken already and the
 * system call is skipped: a reader that takes a while to be scheduled costs its writer one
 * wake-up, not one per message meanwhile. Otherwise as wake_word: either the writer sees the
 * sleeper's bump or the sleeper, after it, sees the frame.
 */
static inline void wake_data_once(int32_t *word, int32_t *waiters, int64_t *woke)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(waiters, __ATOMIC_SEQ_CST) > 0 &&
        (int64_t)__atomic_load_n(word, __ATOMIC_SEQ_CST) != *woke) {
        *woke = __atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST);
        syscall(SYS_futex, word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

#endif /* SHMBUS_NATIVE_H */
