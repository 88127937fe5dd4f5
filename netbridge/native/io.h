/*
 * What the sources of netbridge._io share: the log layout and atomics (shmbus_native.h), the
 * types and functions of shmbus.shm._native reached through its capsule (shmbus_capi.h), and
 * the functions one source here calls in another.
 */
#ifndef NETBRIDGE_IO_H
#define NETBRIDGE_IO_H

#include "shmbus_capi.h"
#include "native_type.h"

#include <netinet/in.h>

#define INTERNAL __attribute__((visibility("hidden")))

/* _native's table, set once by PyInit__io before anything here runs. */
INTERNAL extern const ShmbusCAPI *shmbus;
#define AtomicBufferType (*shmbus->atomic_buffer_type)

/* The module-level functions of each source, added to the module by module.c. */
INTERNAL extern PyMethodDef term_scan_functions[];
INTERNAL extern PyMethodDef term_rebuild_functions[];
INTERNAL extern PyMethodDef udp_batch_functions[];
INTERNAL extern PyMethodDef busy_poll_functions[];

/* ---- term_scan.c ---------------------------------------------------------------------------- */

/* One datagram of a scan: where it is in the log buffer and how long. */
typedef struct {
    int64_t offset;
    int64_t length;
} Span;

/* What one DATA scan found (see scan_datagrams). */
typedef struct {
    int64_t position; /* where the next scan starts */
    int64_t bytes;    /* the datagrams' total length */
    int count, back_pressured, more;
} Scan;

INTERNAL Scan scan_spans(const LogGeometry *g, int64_t position, int64_t limit, int mtu,
                         int max_datagrams, Span *out);

/* ---- term_rebuild.c ---------------------------------------------------------------------- */

/* One image receive_batch may insert into (see in_order_image_arg). */
typedef struct {
    AtomicBuffer *log;
    uint8_t *meta;
    int32_t session_id, stream_id, initial_term_id;
    int64_t term_length;
    int position_bits;
    int64_t position; /* the image's high-water mark: the next in-order datagram starts here */
    int64_t limit;    /* data may not end past this (the image's window) */
    int64_t datagrams, bytes;
    int last;     /* the batch slot of its latest datagram, -1 while none */
    int diverted; /* one of its datagrams went to Python: so do the rest of the batch's */
} InOrderImage;

INTERNAL int in_order_image_arg(PyObject *item, InOrderImage *image);
INTERNAL InOrderImage *insert_in_order(InOrderImage *images, Py_ssize_t count,
                                       const uint8_t *d, int64_t size);

/* ---- udp_batches.c --------------------------------------------------------------------------- */

#define UDP_PAYLOAD_MAX 65507

INTERNAL int sockaddr_arg(PyObject *destination, struct sockaddr_in *a);
INTERNAL int send_spans(int fd, uint8_t *data, const Span *spans, Py_ssize_t count,
                        const struct sockaddr_in *to);
typedef struct Sealer Sealer;
/* send_spans, each datagram sealed first when `sealer` is not NULL (into the Sealer's scratch,
 * `sealed` count spans long for the sealed spans); -ENOMEM when sealing failed. No GIL. */
INTERNAL int send_sealed(int fd, uint8_t *data, const Span *spans, Py_ssize_t count,
                         const struct sockaddr_in *to, Sealer *sealer, Span *sealed);

/* ---- sealing.c ------------------------------------------------------------------------------ */

#define HDR_TYPE_SEALED 0x5EA1 /* outside Aeron's frame types */
#define SEAL_HEADER 44
#define SEAL_OVERHEAD (SEAL_HEADER + 16)
/* sealer_open's results: opened, or the kind of drop */
#define SEAL_OPENED 0
#define SEAL_PLAINTEXT 1
#define SEAL_UNKNOWN_KEY 2
#define SEAL_BAD_TAG 3
#define SEAL_REPLAYED 4

INTERNAL extern PyTypeObject SealerType;

INTERNAL int sealer_arg(PyObject *obj, Sealer **out);
/* Seals `length` bytes of `in` into `out` (length + SEAL_OVERHEAD bytes); returns the sealed
 * length, or -1 (no sealing key, too long, libcrypto failed). No GIL needed. */
INTERNAL int64_t sealer_seal(Sealer *s, const uint8_t *in, int64_t length, uint8_t *out);
/* Seals each span of `data` into the Sealer's scratch buffer, which it returns, with `out`
 * the sealed spans in it; NULL when memory or libcrypto failed. No GIL needed. */
INTERNAL uint8_t *seal_spans(Sealer *s, const uint8_t *data, const Span *spans, Py_ssize_t count,
                             Span *out);
/* Opens the sealed datagram `d` in place (the plaintext at d + SEAL_HEADER, size -
 * SEAL_OVERHEAD bytes long); returns SEAL_OPENED or the kind of drop, counted. */
INTERNAL int sealer_open(Sealer *s, uint8_t *d, int64_t size);

#endif /* NETBRIDGE_IO_H */
