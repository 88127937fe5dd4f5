/*
 * What the sources of shmbus.shm._native share with each other (never with netbridge._io: that
 * goes through shmbus_capi.h): the Python types, the structs more than one source reads, and
 * the functions one source calls in another. Everything else in a source is static.
 */
#ifndef SHMBUS_TYPES_H
#define SHMBUS_TYPES_H

#include "shmbus_capi.h"
#include "native_type.h"

#include <pthread.h>
#include <structmember.h>

/* Shared between the sources of this extension only: not exported from the .so. */
#define INTERNAL __attribute__((visibility("hidden")))

INTERNAL extern PyTypeObject AtomicBufferType;    /* atomic_buffer.c */
INTERNAL extern PyTypeObject PublicationCoreType; /* publication.c */
INTERNAL extern PyTypeObject HeaderType;          /* image.c */
INTERNAL extern PyTypeObject ImageCoreType;       /* image.c */
INTERNAL extern PyTypeObject SubscriptionCoreType; /* subscription.c */
INTERNAL extern PyTypeObject MessageIteratorType; /* subscription.c */
INTERNAL extern PyTypeObject AssemblerType;       /* assembler.c */
INTERNAL extern PyTypeObject HeartbeatType;       /* heartbeat.c */
INTERNAL extern PyTypeObject GroupMemberCoreType; /* group_member.c */
INTERNAL extern PyTypeObject LogWatcherType;      /* log_watcher.c */
INTERNAL extern PyTypeObject FutexRingType;       /* futex_ring.c */

/* The module-level functions of each source, added to the module by module.c. */
INTERNAL extern PyMethodDef atomic_buffer_functions[];
INTERNAL extern PyMethodDef wakeup_functions[];
INTERNAL extern PyMethodDef flow_control_functions[];
INTERNAL extern PyMethodDef heartbeat_functions[];
INTERNAL extern PyMethodDef call_functions[];

/* ---- atomic_buffer.c ------------------------------------------------------------------- */

INTERNAL int ab_check(AtomicBuffer *self, Py_ssize_t offset, Py_ssize_t length,
                      Py_ssize_t align);
INTERNAL int64_t *position_ptr(PyObject *buffer, Py_ssize_t offset);
INTERNAL int geometry_from(AtomicBuffer *log, int32_t term_length, int32_t initial_term_id,
                           LogGeometry *g);

/* ---- wakeups.c ------------------------------------------------------------------------- */

/* futex_waitv(2) (Linux 5.16), declared here since libc headers may predate it */
struct wait_entry {
    uint64_t val;
    uint64_t uaddr;
    uint32_t flags;
    uint32_t reserved;
};
#define WAIT_ENTRY_U32 0x02

INTERNAL void wait_words(int32_t **words, const int32_t *expected, int count,
                         int64_t timeout_ns);
INTERNAL int64_t timeout_to_ns(double timeout_s);
INTERNAL int word_at(PyObject *buffer, Py_ssize_t offset, int32_t **word);
INTERNAL int wait_images(PyObject *images, int32_t *wake, int32_t wake_expected,
                         int64_t timeout_ns, int64_t spin_ns);
typedef struct SubscriptionCore SubscriptionCore;
INTERNAL int wait_images_watching(PyObject *images, int32_t *wake, int32_t wake_expected,
                                  SubscriptionCore *watching, int64_t timeout_ns,
                                  int64_t spin_ns);

/* ---- flow_control.c -------------------------------------------------------------------- */

INTERNAL int fc_raise(const LogGeometry *g, const uint8_t *values, Py_ssize_t values_len,
                      int64_t *limit, int64_t producer);
INTERNAL void fc_raise_for_writer(const LogGeometry *g, const uint8_t *values,
                                  Py_ssize_t values_len);

/* ---- publication.c ------------------------------------------------------------------------ */
INTERNAL int64_t offer_headed(PyObject *publication, const uint8_t *head,
                              Py_ssize_t head_length, PyObject *body);
/* ---- group_member.c ----------------------------------------------------------------------- */
INTERNAL int group_next_message(PyObject *member, const uint8_t **payload, int32_t *length,
                                int64_t *next, int *handed_on, PyObject **assembled);
INTERNAL void group_message_done(PyObject *member, int64_t next);
/* ---- image.c ------------------------------------------------------------------------------ */

typedef struct {
    PyObject_HEAD
    uint8_t bytes[HEADER_LENGTH];
    int position_bits;
    int32_t initial_term_id;
} Header;

typedef struct {
    PyObject_HEAD
    PyObject *log_buffer;
    PyObject *position_buffer;
    LogGeometry g;
    int64_t *position;        /* the subscriber position: written only by this reader */
    /* An owned image's position is a driver counter lent to it (see image_owns_counter):
     * ids points at the counter's registration id (reference id two words on), NULL for an
     * image whose position is its own memory (a group's, a test's). */
    const int64_t *ids;
    int64_t registration_id, reference_id;
    int64_t local;            /* owned: the position this process has read up to */
    int64_t stored;           /* owned: the position this image last stored in the counter
                               * (behind local while messages taken one by one are not yet
                               * published, see consume) */
    int32_t partial;          /* bytes of a fragmented message's leading fragments that
                               * image_take (or, for whole_messages, image_ready) found
                               * before the rest was committed */
    int64_t partial_at;       /* whole_messages: the position `partial` was measured at */
    int whole_messages;       /* a group's image: ready only for a whole message (its members
                               * claim nothing less), see image_ready */
    int reclaimed;            /* owned: the driver took the counter back; never store again */
    Header *header;           /* reused while nobody else holds it */
    int closed;               /* once set, the log may be unmapped: never touch it again */
    int sleeping;             /* threads of this process asleep in wait_for_data */
} ImageCore;

/*
 * Whether the image still holds its position counter. The driver frees a subscriber's counter
 * when it drops the reader (its client timed out: a process stopped past its liveness, or the
 * image was removed) and hands the id to another reader a reuse timeout later, while this
 * process may still hold the image. Its registration and reference ids then change (free()
 * clears them) or its value is not what this image stored; from then on the image reads and
 * stores nothing: the bytes under it are no longer held for it, and the counter is not its own.
 */
static inline int image_owns_counter(ImageCore *self)
{
    if (self->ids == NULL)
        return 1;
    /* the log bytes read before this call are ordered before the ids read here: ids still
     * ours afterwards mean the driver had not dropped the reader, so no writer could have
     * reused those bytes while they were read */
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (!self->reclaimed && (LOAD_ACQUIRE(self->ids) != self->registration_id ||
                             LOAD_ACQUIRE(self->ids + 2) != self->reference_id ||
                             LOAD_ACQUIRE(self->position) != self->stored))
        self->reclaimed = 1;
    return !self->reclaimed;
}

/* The position a poll starts from: the counter's (or an owned image's own). */
static inline int64_t image_position(ImageCore *self)
{
    return self->ids == NULL ? LOAD_ACQUIRE(self->position) : self->local;
}

/* A reader of fragments (image_poll, image_controlled_poll): how many it delivered to the
 * handler, or -1 with an exception. */
typedef long (*image_reader)(ImageCore *, PyObject *, long);

INTERNAL long image_poll(ImageCore *self, PyObject *handler, long limit);
INTERNAL long image_controlled_poll(ImageCore *self, PyObject *handler, long limit);
INTERNAL PyObject *image_take(ImageCore *self);
INTERNAL Py_ssize_t message_extent(ImageCore *self, const uint8_t *term, int32_t offset,
                                   int64_t position, int32_t *end);
INTERNAL PyObject *gather_fragments(const uint8_t *term, int32_t offset, int32_t end,
                                    Py_ssize_t total);
INTERNAL void flush_position(ImageCore *self);
INTERNAL int image_ready(ImageCore *self);
INTERNAL int frame_ok(ImageCore *self, const uint8_t *frame, int32_t offset, int32_t length,
                      int64_t position);
INTERNAL extern PyObject *large_gone;
INTERNAL PyObject *large_bytes(ImageCore *self, const uint8_t *frame, int32_t length);
INTERNAL PyObject *deliver(ImageCore *self, PyObject *handler, uint8_t *frame,
                           int32_t length);
INTERNAL int image_module_init(void);

/* ---- subscription.c ------------------------------------------------------------------------ */

/*
 * The images tuple is replaced whole (by the client conductor, under its lock) and read here as
 * a snapshot, so a poll never sees a half-made change. `wake` is a word in the client's own
 * memory that the conductor bumps whenever the images change or the client fails: a waiting
 * subscriber sleeps on it beside its images' data words. `error`, once set, is raised by every
 * later poll: the client is gone (driver timeout, client timeout).
 *
 * The lease is the client's heartbeat counter: while its registration id is the client's, the
 * driver has not timed the client out. A process stopped past its liveness learns it at its
 * next poll, or at the end of the poll it was stopped in, before the conductor thread does:
 * every poll checks the lease before reading and after, and calls on_lease_lost (which fails
 * the client and raises ClientTimeoutError) once it is gone.
 */
struct SubscriptionCore {
    PyObject_HEAD
    PyObject *images;         /* tuple of ImageCore */
    PyObject *wake_buffer;    /* AtomicBuffer holding the wake word, or NULL */
    int32_t *wake;
    PyObject *error;          /* exception instance raised by polls, or NULL */
    Py_ssize_t round_robin;
    PyObject *lease_buffer;   /* AtomicBuffer holding the lease counter, or NULL */
    const int64_t *lease;     /* the heartbeat counter's registration id */
    int64_t lease_owner;      /* the client id it must hold */
    PyObject *on_lease_lost;  /* callable, or NULL */
    char closed;              /* `_closed`: set by Subscription.close */
    int64_t wait_spin_ns;     /* `_wait_spin_ns`: how long a wait looks before it sleeps */
    /* `_watch_word`: a word whose change from watch_value also ends wait() and await_reply
     * (a requester's: its publication's is-connected word); watch_view keeps its mapping */
    PyObject *watch_view;
    Py_buffer watch_buffer;
    int32_t *watch_word;
    int32_t watch_value;
};

/* The next whole message from the images; NULL with no exception when there is none. */
INTERNAL PyObject *sub_take(SubscriptionCore *self);
/* ---- log_watcher.c ------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    int efd;
    int started, closing, armed, busy;
    uint64_t generation;
    int32_t control; /* futex word: bumped to cut the thread's wait short */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int count;
    Watch watches[WATCH_MAX];
    PyObject *held; /* the log buffers of `watches` */
} LogWatcher;

INTERNAL int watch_is_ready(const Watch *w);
INTERNAL int watch_ready(const Watch *watches, int count);
INTERNAL int watch_arg(PyObject *item, int progress, Watch *w);
INTERNAL void watcher_set(LogWatcher *self, const Watch *watches, int count, PyObject *held);

/* ---- futex_ring.c ---------------------------------------------------------------------------- */

typedef struct FutexRing FutexRing;

INTERNAL int ring_arm(FutexRing *self, SubscriptionCore *sub);

#endif /* SHMBUS_TYPES_H */
