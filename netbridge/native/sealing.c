/*
 * Sealed datagrams: the AEAD of authenticated channels (docs/protocol.md, Sealed datagrams).
 *
 * A Sealer belongs to one socket of the netbridge. It seals what the socket sends and opens
 * what it receives, with AES-256-GCM from OpenSSL's libcrypto (AES-NI and carry-less multiply
 * where the CPU has them: on this project's x86-64 machines it costs about half of OpenSSL's
 * ChaCha20-Poly1305 per datagram, whose set-up per message dominates at datagram sizes).
 * A sealed datagram is an envelope around a whole plaintext datagram (little-endian):
 *
 *    0  frame length (i32: the whole datagram)   4  version (u8, 1)   5  flags (u8, 0)
 *    6  type (u16, HDR_TYPE_SEALED)              8  key id (u32)
 *   12  session (16 bytes, random per Sealer)   28  counter (u64, from 1, one per datagram)
 *   36  timestamp (i64, the sender's CLOCK_REALTIME in ns)
 *   44  ciphertext (as long as the plaintext)   then the tag (16 bytes)
 *
 * The 44 header bytes are the associated data. The cipher key is HMAC-SHA256(secret,
 * "shmbus-seal-v1" || session), so each Sealer (each netbridge start, each socket) has a key of
 * its own, and the nonce (the counter, zero-padded to 12 bytes) never repeats under a key:
 * a retransmit is sealed again with the next counter.
 *
 * Opening drops, and counts by kind: a datagram that is not sealed (plaintext), one whose key id
 * the keyring does not give this channel (unknown key), one whose tag does not verify or whose
 * envelope is malformed (bad tag), and one already seen, older than the replay window of its
 * sender's session, or stamped further from this host's clock than the allowed skew, or, for
 * a session not seen before, stamped before this Sealer was made (replayed).
 *
 * Runs in the netbridge process, on its duty-cycle thread: the Python methods with the GIL,
 * sealer_seal and seal_spans also without it (busy_poll's spin), never concurrently.
 */
#include "io.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <structmember.h>
#include <sys/random.h>
#include <time.h>

#define SEAL_VERSION 1
#define TAG_LENGTH 16
#define SECRET_LENGTH 32
#define SESSION_LENGTH 16
#define KEYS_MAX 16
#define PEERS_MAX 256
#define WINDOW_BITS 1024
#define WINDOW_WORDS (WINDOW_BITS / 64)
#define DERIVE_LABEL "shmbus-seal-v1"

typedef struct {
    uint32_t id;
    int seals;
    uint8_t secret[SECRET_LENGTH];
} SealKey;

/* A sender this socket has opened datagrams of: its key and session, and which of its
 * counters were seen (a WINDOW_BITS window ending at `top`). */
typedef struct {
    EVP_CIPHER_CTX *ctx; /* NULL: a free slot */
    uint32_t key_id;
    uint8_t session[SESSION_LENGTH];
    uint64_t top;
    uint64_t seen[WINDOW_WORDS];
    uint64_t used; /* the Sealer's tick when last opened: the least recent goes first */
} Peer;

struct Sealer {
    PyObject_HEAD
    SealKey keys[KEYS_MAX];
    int key_count;
    int sealing; /* index of the key that seals, -1 while none */
    uint8_t session[SESSION_LENGTH];
    EVP_CIPHER_CTX *seal_ctx;
    uint64_t counter;
    int64_t created_ns, max_skew_ns;
    Peer peers[PEERS_MAX];
    uint64_t tick;
    uint8_t *scratch; /* seal_spans' output, grown as needed */
    size_t scratch_size;
    unsigned long long sealed, opened, bad_tag, unknown_key, replayed, plaintext;
    unsigned long long key_sets; /* keys taken: 1 when made, +1 per set_keys */
};

static int64_t realtime_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A cipher context keyed for `secret` and `session`; NULL when libcrypto fails. */
static EVP_CIPHER_CTX *session_ctx(const uint8_t *secret, const uint8_t *session, int encrypt)
{
    uint8_t message[sizeof DERIVE_LABEL - 1 + SESSION_LENGTH], key[32];
    unsigned int key_length = 0;
    memcpy(message, DERIVE_LABEL, sizeof DERIVE_LABEL - 1);
    memcpy(message + sizeof DERIVE_LABEL - 1, session, SESSION_LENGTH);
    if (HMAC(EVP_sha256(), secret, SECRET_LENGTH, message, sizeof message, key, &key_length)
        == NULL || key_length != sizeof key)
        return NULL;
    EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
    int ok = ctx != NULL &&
             (encrypt ? EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL)
                      : EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, key, NULL));
    memset(key, 0, sizeof key);
    if (!ok) {
        EVP_CIPHER_CTX_free(ctx);
        return NULL;
    }
    return ctx;
}

static void nonce_of(uint64_t counter, uint8_t nonce[12])
{
    memset(nonce, 0, 12);
    memcpy(nonce, &counter, 8);
}

int64_t sealer_seal(Sealer *s, const uint8_t *in, int64_t length, uint8_t *out)
{
    if (s->seal_ctx == NULL || length < 0 || length > UDP_PAYLOAD_MAX - SEAL_OVERHEAD)
        return -1;
    uint64_t counter = ++s->counter;
    int64_t total = length + SEAL_OVERHEAD;
    wr_i32(out, (int32_t)total);
    out[4] = SEAL_VERSION;
    out[5] = 0;
    uint16_t type = HDR_TYPE_SEALED;
    memcpy(out + 6, &type, 2);
    memcpy(out + 8, &s->keys[s->sealing].id, 4);
    memcpy(out + 12, s->session, SESSION_LENGTH);
    memcpy(out + 28, &counter, 8);
    wr_i64(out + 36, realtime_ns());
    uint8_t nonce[12];
    nonce_of(counter, nonce);
    int n = 0, m = 0;
    if (!EVP_EncryptInit_ex(s->seal_ctx, NULL, NULL, NULL, nonce) ||
        !EVP_EncryptUpdate(s->seal_ctx, NULL, &n, out, SEAL_HEADER) ||
        !EVP_EncryptUpdate(s->seal_ctx, out + SEAL_HEADER, &n, in, (int)length) ||
        !EVP_EncryptFinal_ex(s->seal_ctx, out + SEAL_HEADER + n, &m) ||
        !EVP_CIPHER_CTX_ctrl(s->seal_ctx, EVP_CTRL_AEAD_GET_TAG, TAG_LENGTH,
                             out + SEAL_HEADER + length))
        return -1;
    s->sealed++;
    return total;
}

uint8_t *seal_spans(Sealer *s, const uint8_t *data, const Span *spans, Py_ssize_t count,
                    Span *out)
{
    size_t need = 0;
    for (Py_ssize_t i = 0; i < count; i++)
        need += (size_t)spans[i].length + SEAL_OVERHEAD;
    if (need > s->scratch_size) {
        uint8_t *grown = realloc(s->scratch, need);
        if (grown == NULL)
            return NULL;
        s->scratch = grown;
        s->scratch_size = need;
    }
    int64_t at = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t sealed = sealer_seal(s, data + spans[i].offset, spans[i].length, s->scratch + at);
        if (sealed < 0)
            return NULL;
        out[i].offset = at;
        out[i].length = sealed;
        at += sealed;
    }
    return s->scratch;
}

/* -1 when `counter` of `peer` was seen or is older than its window, else 0. */
static int window_check(const Peer *peer, uint64_t counter)
{
    if (counter > peer->top)
        return 0;
    if (peer->top - counter >= WINDOW_BITS)
        return -1;
    uint64_t bit = counter % WINDOW_BITS;
    return (peer->seen[bit / 64] >> (bit % 64)) & 1 ? -1 : 0;
}

static void window_mark(Peer *peer, uint64_t counter)
{
    if (counter > peer->top) {
        uint64_t ahead = counter - peer->top;
        if (ahead >= WINDOW_BITS) {
            memset(peer->seen, 0, sizeof peer->seen);
        } else {
            for (uint64_t c = peer->top + 1; c <= counter; c++) {
                uint64_t bit = c % WINDOW_BITS;
                peer->seen[bit / 64] &= ~(1ULL << (bit % 64));
            }
        }
        peer->top = counter;
    }
    uint64_t bit = counter % WINDOW_BITS;
    peer->seen[bit / 64] |= 1ULL << (bit % 64);
}

static const SealKey *key_by_id(const Sealer *s, uint32_t id)
{
    for (int i = 0; i < s->key_count; i++)
        if (s->keys[i].id == id)
            return &s->keys[i];
    return NULL;
}

static Peer *find_peer(Sealer *s, uint32_t key_id, const uint8_t *session)
{
    for (int i = 0; i < PEERS_MAX; i++) {
        Peer *p = &s->peers[i];
        if (p->ctx != NULL && p->key_id == key_id &&
            memcmp(p->session, session, SESSION_LENGTH) == 0)
            return p;
    }
    return NULL;
}

static void free_peer(Peer *p)
{
    EVP_CIPHER_CTX_free(p->ctx);
    memset(p, 0, sizeof *p);
}

/* A slot for a new peer: a free one, else the least recently used (its session forgotten). */
static Peer *peer_slot(Sealer *s)
{
    Peer *oldest = &s->peers[0];
    for (int i = 0; i < PEERS_MAX; i++) {
        if (s->peers[i].ctx == NULL)
            return &s->peers[i];
        if (s->peers[i].used < oldest->used)
            oldest = &s->peers[i];
    }
    free_peer(oldest);
    return oldest;
}

static int decrypt(EVP_CIPHER_CTX *ctx, uint8_t *d, int64_t size, uint64_t counter)
{
    uint8_t nonce[12];
    nonce_of(counter, nonce);
    int64_t length = size - SEAL_OVERHEAD;
    int n = 0, m = 0;
    return EVP_DecryptInit_ex(ctx, NULL, NULL, NULL, nonce) &&
           EVP_DecryptUpdate(ctx, NULL, &n, d, SEAL_HEADER) &&
           EVP_DecryptUpdate(ctx, d + SEAL_HEADER, &n, d + SEAL_HEADER, (int)length) &&
           EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_AEAD_SET_TAG, TAG_LENGTH,
                               d + SEAL_HEADER + length) &&
           EVP_DecryptFinal_ex(ctx, d + SEAL_HEADER + n, &m) > 0;
}

int sealer_open(Sealer *s, uint8_t *d, int64_t size)
{
    int result = SEAL_BAD_TAG;
    if (size < 8 || rd_u16(d + TYPE_OFFSET) != HDR_TYPE_SEALED) {
        result = SEAL_PLAINTEXT;
        goto drop;
    }
    if (size < SEAL_OVERHEAD || d[4] != SEAL_VERSION || rd_i32(d) != size)
        goto drop;
    uint32_t key_id;
    uint64_t counter;
    memcpy(&key_id, d + 8, 4);
    memcpy(&counter, d + 28, 8);
    const uint8_t *session = d + 12;
    int64_t stamp = rd_i64(d + 36), now = realtime_ns();
    const SealKey *key = key_by_id(s, key_id);
    if (key == NULL) {
        result = SEAL_UNKNOWN_KEY;
        goto drop;
    }
    result = SEAL_REPLAYED;
    if (stamp < now - s->max_skew_ns || stamp > now + s->max_skew_ns)
        goto drop;
    Peer *peer = find_peer(s, key_id, session);
    if (peer != NULL) {
        if (window_check(peer, counter) < 0)
            goto drop;
        result = SEAL_BAD_TAG;
        if (!decrypt(peer->ctx, d, size, counter))
            goto drop;
    } else {
        if (stamp < s->created_ns) /* sealed before this socket could have heard it */
            goto drop;
        result = SEAL_BAD_TAG;
        EVP_CIPHER_CTX *ctx = session_ctx(key->secret, session, 0);
        if (ctx == NULL || !decrypt(ctx, d, size, counter)) {
            EVP_CIPHER_CTX_free(ctx);
            goto drop;
        }
        peer = peer_slot(s);
        peer->ctx = ctx;
        peer->key_id = key_id;
        memcpy(peer->session, session, SESSION_LENGTH);
        peer->top = counter;
    }
    window_mark(peer, counter);
    peer->used = ++s->tick;
    s->opened++;
    return SEAL_OPENED;
drop:
    switch (result) {
    case SEAL_PLAINTEXT: s->plaintext++; break;
    case SEAL_UNKNOWN_KEY: s->unknown_key++; break;
    case SEAL_REPLAYED: s->replayed++; break;
    default: s->bad_tag++; break;
    }
    return result;
}

/* ---- the Python type ------------------------------------------------------------------------ */

/* Replaces the keys with `keys`, a sequence of (key id, 32-byte secret, seals); the last that
 * seals becomes the sealing key. Peers of keys no longer given are forgotten. */
static int set_keys(Sealer *s, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "keys must be a sequence of (id, secret, seals)");
    if (seq == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    SealKey parsed[KEYS_MAX];
    int sealing = -1;
    if (count < 1 || count > KEYS_MAX) {
        PyErr_Format(PyExc_ValueError, "a channel takes 1 to %d keys, not %zd", KEYS_MAX, count);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        unsigned long key_id;
        Py_buffer secret;
        int seals;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "ky*p", &key_id, &secret,
                              &seals))
            goto fail;
        int bad = secret.len != SECRET_LENGTH || key_id == 0 || key_id > 0xFFFFFFFFUL;
        if (!bad)
            memcpy(parsed[i].secret, secret.buf, SECRET_LENGTH);
        PyBuffer_Release(&secret);
        if (bad) {
            PyErr_Format(PyExc_ValueError, "key %lu: an id of 1 to 2**32-1 and a secret of "
                         "%d bytes", key_id, SECRET_LENGTH);
            goto fail;
        }
        parsed[i].id = (uint32_t)key_id;
        parsed[i].seals = seals;
        if (seals)
            sealing = (int)i;
    }
    Py_DECREF(seq);
    EVP_CIPHER_CTX *seal_ctx = NULL;
    if (sealing >= 0 &&
        (seal_ctx = session_ctx(parsed[sealing].secret, s->session, 1)) == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "libcrypto could not key AES-256-GCM");
        memset(parsed, 0, sizeof parsed);
        return -1;
    }
    EVP_CIPHER_CTX_free(s->seal_ctx);
    s->seal_ctx = seal_ctx;
    memset(s->keys, 0, sizeof s->keys);
    memcpy(s->keys, parsed, sizeof(SealKey) * (size_t)count);
    memset(parsed, 0, sizeof parsed);
    s->key_count = (int)count;
    s->sealing = sealing;
    for (int i = 0; i < PEERS_MAX; i++)
        if (s->peers[i].ctx != NULL && key_by_id(s, s->peers[i].key_id) == NULL)
            free_peer(&s->peers[i]);
    s->key_sets++;
    return 0;
fail:
    memset(parsed, 0, sizeof parsed);
    Py_DECREF(seq);
    return -1;
}

static int Sealer_init(Sealer *s, PyObject *args, PyObject *kwargs)
{
    static char *names[] = {"keys", "max_skew_ns", NULL};
    PyObject *keys;
    long long max_skew_ns = 30000000000LL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|L", names, &keys, &max_skew_ns))
        return -1;
    if (s->created_ns) {
        PyErr_SetString(PyExc_TypeError, "a Sealer is made once");
        return -1;
    }
    if (max_skew_ns <= 0) {
        PyErr_SetString(PyExc_ValueError, "max_skew_ns must be positive");
        return -1;
    }
    if (getrandom(s->session, SESSION_LENGTH, 0) != SESSION_LENGTH) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    s->max_skew_ns = max_skew_ns;
    if (set_keys(s, keys) < 0)
        return -1;
    s->created_ns = realtime_ns();
    return 0;
}

static void Sealer_dealloc(Sealer *s)
{
    EVP_CIPHER_CTX_free(s->seal_ctx);
    for (int i = 0; i < PEERS_MAX; i++)
        if (s->peers[i].ctx != NULL)
            EVP_CIPHER_CTX_free(s->peers[i].ctx);
    free(s->scratch);
    memset(s->keys, 0, sizeof s->keys);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

static PyObject *Sealer_set_keys(Sealer *s, PyObject *keys)
{
    if (set_keys(s, keys) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Sealer_seal(Sealer *s, PyObject *arg)
{
    Py_buffer in;
    if (PyObject_GetBuffer(arg, &in, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    if (s->seal_ctx == NULL || in.len > UDP_PAYLOAD_MAX - SEAL_OVERHEAD) {
        PyErr_Format(PyExc_ValueError, "cannot seal %zd bytes (at most %d, with a key that "
                     "seals)", in.len, UDP_PAYLOAD_MAX - SEAL_OVERHEAD);
        goto done;
    }
    if ((out = PyBytes_FromStringAndSize(NULL, in.len + SEAL_OVERHEAD)) == NULL)
        goto done;
    if (sealer_seal(s, in.buf, in.len, (uint8_t *)PyBytes_AS_STRING(out)) < 0) {
        Py_CLEAR(out);
        PyErr_SetString(PyExc_RuntimeError, "libcrypto could not seal a datagram");
    }
done:
    PyBuffer_Release(&in);
    return out;
}

static PyObject *Sealer_open(Sealer *s, PyObject *arg)
{
    Py_buffer in;
    if (PyObject_GetBuffer(arg, &in, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *copy = PyBytes_FromStringAndSize(in.buf, in.len);
    PyBuffer_Release(&in);
    if (copy == NULL)
        return NULL;
    uint8_t *d = (uint8_t *)PyBytes_AS_STRING(copy);
    int result = sealer_open(s, d, PyBytes_GET_SIZE(copy));
    PyObject *out = result == SEAL_OPENED
        ? Py_BuildValue("(iy#)", result, d + SEAL_HEADER,
                        (Py_ssize_t)(PyBytes_GET_SIZE(copy) - SEAL_OVERHEAD))
        : Py_BuildValue("(iO)", result, Py_None);
    Py_DECREF(copy);
    return out;
}

static PyObject *Sealer_get_session(Sealer *s, void *closure)
{
    return PyBytes_FromStringAndSize((const char *)s->session, SESSION_LENGTH);
}

static PyMethodDef sealer_methods[] = {
    {"set_keys", (PyCFunction)Sealer_set_keys, METH_O,
     "set_keys(keys): replace the keys ((id, secret, seals), ...); the last that seals seals"},
    {"seal", (PyCFunction)Sealer_seal, METH_O, "seal(datagram) -> bytes: the sealed datagram"},
    {"open", (PyCFunction)Sealer_open, METH_O,
     "open(datagram) -> (result, plaintext or None): result 0 opened, else the drop kind "
     "(1 plaintext, 2 unknown key, 3 bad tag, 4 replayed), counted"},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef sealer_members[] = {
    {"sealed", T_ULONGLONG, offsetof(Sealer, sealed), READONLY, "datagrams sealed"},
    {"opened", T_ULONGLONG, offsetof(Sealer, opened), READONLY, "datagrams opened"},
    {"bad_tag", T_ULONGLONG, offsetof(Sealer, bad_tag), READONLY,
     "dropped: the tag did not verify, or the envelope was malformed"},
    {"unknown_key", T_ULONGLONG, offsetof(Sealer, unknown_key), READONLY,
     "dropped: sealed with a key id this channel does not have"},
    {"replayed", T_ULONGLONG, offsetof(Sealer, replayed), READONLY,
     "dropped: seen already, too old for the replay window, or stamped out of the skew"},
    {"plaintext", T_ULONGLONG, offsetof(Sealer, plaintext), READONLY,
     "dropped: not sealed"},
    {"key_sets", T_ULONGLONG, offsetof(Sealer, key_sets), READONLY,
     "how many times keys were taken: 1 when made, and 1 more for each set_keys"},
    {NULL, 0, 0, 0, NULL},
};

static PyGetSetDef sealer_getset[] = {
    {"session", (getter)Sealer_get_session, NULL, "this Sealer's random session id", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject SealerType = {
    NATIVE_TYPE_HEAD("netbridge._io.Sealer", Sealer, Py_TPFLAGS_DEFAULT,
                     "Sealer(keys, max_skew_ns=30e9): seals and opens one socket's datagrams "
                     "(AES-256-GCM; see netbridge/native/sealing.c)"),
    NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, Sealer_init, Sealer_dealloc),
    .tp_methods = sealer_methods,
    .tp_members = sealer_members,
    .tp_getset = sealer_getset,
};

/* A Sealer or None argument as a pointer (NULL for None); -1 with TypeError otherwise. */
int sealer_arg(PyObject *obj, Sealer **out)
{
    if (obj == Py_None) {
        *out = NULL;
        return 0;
    }
    if (!PyObject_TypeCheck(obj, &SealerType)) {
        PyErr_Format(PyExc_TypeError, "a sealer is a netbridge._io.Sealer or None, not %R", obj);
        return -1;
    }
    *out = (Sealer *)obj;
    return 0;
}
