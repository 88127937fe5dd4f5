/*
 * AtomicBuffer: bounds-checked plain, acquire/release and atomic access over any writable
 * buffer (Agrona's AtomicBuffer): a bad offset raises IndexError, never crashes. Also the two
 * checks every other source makes on one: position_ptr (an aligned int64 in it) and
 * geometry_from (a log of a given term length in it), and the acquire_fence() function.
 *
 * Every process (client, driver, netbridge) calls these from Python with the GIL held; the
 * checks are called by the other sources, and by netbridge._io through the capsule.
 */
#include "types.h"

static int atomic_buffer_init(AtomicBuffer *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"buffer", NULL};
    PyObject *obj;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &obj))
        return -1;
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
    if (PyObject_GetBuffer(obj, &self->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    self->has_view = 1;
    self->data = (uint8_t *)self->view.buf;
    self->capacity = self->view.len;
    return 0;
}

static void atomic_buffer_dealloc(AtomicBuffer *self)
{
    if (self->has_view)
        PyBuffer_Release(&self->view);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

int ab_check(AtomicBuffer *self, Py_ssize_t offset, Py_ssize_t length, Py_ssize_t align)
{
    if (!self->has_view) {
        PyErr_SetString(PyExc_ValueError, "AtomicBuffer is closed");
        return -1;
    }
    if (offset < 0 || length < 0 || offset > self->capacity - length) {
        PyErr_Format(PyExc_IndexError,
                     "offset %zd length %zd is outside the buffer of capacity %zd", offset, length,
                     self->capacity);
        return -1;
    }
    if (align > 1 && (((uintptr_t)(self->data + offset)) % (uintptr_t)align) != 0) {
        PyErr_Format(PyExc_ValueError, "offset %zd is not %zd-byte aligned for an atomic access",
                     offset, align);
        return -1;
    }
    return 0;
}

#define AB_OFFSET_ARG(name)                                   \
    Py_ssize_t name;                                          \
    if (!PyArg_ParseTuple(args, "n", &name)) return NULL;

static PyObject *ab_get_int32(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 4, 1)) return NULL;
    return PyLong_FromLong(rd_i32(self->data + off));
}

static PyObject *ab_get_int64(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 8, 1)) return NULL;
    return PyLong_FromLongLong(rd_i64(self->data + off));
}

static PyObject *ab_get_int32_acquire(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 4, 4)) return NULL;
    return PyLong_FromLong(LOAD_ACQUIRE((int32_t *)(self->data + off)));
}

static PyObject *ab_get_int64_acquire(AtomicBuffer *self, PyObject *args)
{
    AB_OFFSET_ARG(off);
    if (ab_check(self, off, 8, 8)) return NULL;
    return PyLong_FromLongLong(LOAD_ACQUIRE((int64_t *)(self->data + off)));
}

static PyObject *ab_put_int32(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int v;
    if (!PyArg_ParseTuple(args, "ni", &off, &v)) return NULL;
    if (ab_check(self, off, 4, 1)) return NULL;
    wr_i32(self->data + off, v);
    Py_RETURN_NONE;
}

static PyObject *ab_put_int64(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long v;
    if (!PyArg_ParseTuple(args, "nL", &off, &v)) return NULL;
    if (ab_check(self, off, 8, 1)) return NULL;
    wr_i64(self->data + off, v);
    Py_RETURN_NONE;
}

static PyObject *ab_put_int32_release(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int v;
    if (!PyArg_ParseTuple(args, "ni", &off, &v)) return NULL;
    if (ab_check(self, off, 4, 4)) return NULL;
    STORE_RELEASE((int32_t *)(self->data + off), (int32_t)v);
    Py_RETURN_NONE;
}

static PyObject *ab_put_int64_release(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long v;
    if (!PyArg_ParseTuple(args, "nL", &off, &v)) return NULL;
    if (ab_check(self, off, 8, 8)) return NULL;
    STORE_RELEASE((int64_t *)(self->data + off), (int64_t)v);
    Py_RETURN_NONE;
}

static PyObject *ab_get_and_add_int32(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int v;
    if (!PyArg_ParseTuple(args, "ni", &off, &v)) return NULL;
    if (ab_check(self, off, 4, 4)) return NULL;
    return PyLong_FromLong(FETCH_ADD((int32_t *)(self->data + off), (int32_t)v));
}

static PyObject *ab_get_and_add_int64(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long v;
    if (!PyArg_ParseTuple(args, "nL", &off, &v)) return NULL;
    if (ab_check(self, off, 8, 8)) return NULL;
    return PyLong_FromLongLong(FETCH_ADD((int64_t *)(self->data + off), (int64_t)v));
}

static PyObject *ab_compare_and_set_int32(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; int expected, desired;
    if (!PyArg_ParseTuple(args, "nii", &off, &expected, &desired)) return NULL;
    if (ab_check(self, off, 4, 4)) return NULL;
    int32_t e = (int32_t)expected;
    return PyBool_FromLong(CAS((int32_t *)(self->data + off), &e, (int32_t)desired));
}

static PyObject *ab_compare_and_set_int64(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; long long expected, desired;
    if (!PyArg_ParseTuple(args, "nLL", &off, &expected, &desired)) return NULL;
    if (ab_check(self, off, 8, 8)) return NULL;
    int64_t e = (int64_t)expected;
    return PyBool_FromLong(CAS((int64_t *)(self->data + off), &e, (int64_t)desired));
}

static PyObject *ab_get_bytes(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off, len;
    if (!PyArg_ParseTuple(args, "nn", &off, &len)) return NULL;
    if (ab_check(self, off, len, 1)) return NULL;
    return PyBytes_FromStringAndSize((const char *)self->data + off, len);
}

static PyObject *ab_put_bytes(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off; Py_buffer src;
    if (!PyArg_ParseTuple(args, "ny*", &off, &src)) return NULL;
    if (ab_check(self, off, src.len, 1)) { PyBuffer_Release(&src); return NULL; }
    memcpy(self->data + off, src.buf, (size_t)src.len);
    PyBuffer_Release(&src);
    Py_RETURN_NONE;
}

static PyObject *ab_set_memory(AtomicBuffer *self, PyObject *args)
{
    Py_ssize_t off, len; int value;
    if (!PyArg_ParseTuple(args, "nni", &off, &len, &value)) return NULL;
    if (ab_check(self, off, len, 1)) return NULL;
    memset(self->data + off, value, (size_t)len);
    Py_RETURN_NONE;
}

static PyObject *ab_release(AtomicBuffer *self, PyObject *Py_UNUSED(ignored))
{
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
        self->data = NULL;
        self->capacity = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *ab_get_capacity(AtomicBuffer *self, void *closure)
{
    return PyLong_FromSsize_t(self->capacity);
}

/* A METH_VARARGS method of AtomicBuffer: `name` in Python, ab_<name> in C. */
#define AB_METHOD(name, doc) {#name, (PyCFunction)ab_##name, METH_VARARGS, doc}

static PyMethodDef atomic_buffer_methods[] = {
    AB_METHOD(get_int32, "get_int32(offset) -> int: plain load"),
    AB_METHOD(get_int64, "get_int64(offset) -> int: plain load"),
    AB_METHOD(get_int32_acquire,
              "get_int32_acquire(offset) -> int: load with acquire ordering (offset 4-aligned)"),
    AB_METHOD(get_int64_acquire,
              "get_int64_acquire(offset) -> int: load with acquire ordering (offset 8-aligned)"),
    AB_METHOD(put_int32, "put_int32(offset, value): plain store"),
    AB_METHOD(put_int64, "put_int64(offset, value): plain store"),
    AB_METHOD(put_int32_release, "put_int32_release(offset, value): store with release ordering"),
    AB_METHOD(put_int64_release, "put_int64_release(offset, value): store with release ordering"),
    AB_METHOD(get_and_add_int32, "get_and_add_int32(offset, delta) -> previous value (atomic)"),
    AB_METHOD(get_and_add_int64, "get_and_add_int64(offset, delta) -> previous value (atomic)"),
    AB_METHOD(compare_and_set_int32,
              "compare_and_set_int32(offset, expected, desired) -> bool (atomic)"),
    AB_METHOD(compare_and_set_int64,
              "compare_and_set_int64(offset, expected, desired) -> bool (atomic)"),
    AB_METHOD(get_bytes, "get_bytes(offset, length) -> bytes"),
    AB_METHOD(put_bytes, "put_bytes(offset, data)"),
    AB_METHOD(set_memory, "set_memory(offset, length, value): fill with a byte value"),
    {"release", (PyCFunction)ab_release, METH_NOARGS,
     "release(): drop the underlying buffer; later accesses raise ValueError"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef atomic_buffer_getset[] = {
    {"capacity", (getter)ab_get_capacity, NULL, "length of the buffer in bytes", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject AtomicBufferType = {
    NATIVE_TYPE_HEAD("shmbus.shm._native.AtomicBuffer", AtomicBuffer, Py_TPFLAGS_DEFAULT,
                     "AtomicBuffer(buffer): bounds-checked atomic access over a writable buffer."),
    NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, atomic_buffer_init, atomic_buffer_dealloc),
    .tp_methods = atomic_buffer_methods,
    .tp_getset = atomic_buffer_getset,
};

/* Resolve (AtomicBuffer, offset) to an aligned int64 pointer, keeping a reference. */
int64_t *position_ptr(PyObject *buffer, Py_ssize_t offset)
{
    if (!PyObject_TypeCheck(buffer, &AtomicBufferType)) {
        PyErr_SetString(PyExc_TypeError, "a position must live in an AtomicBuffer");
        return NULL;
    }
    if (ab_check((AtomicBuffer *)buffer, offset, 8, 8)) return NULL;
    return (int64_t *)(((AtomicBuffer *)buffer)->data + offset);
}

/* The geometry of a log of `term_length` (a power of two >= 64 KiB) filling `log`'s first
 * 3 terms + metadata; -1 with ValueError or IndexError otherwise. */
int geometry_from(AtomicBuffer *log, int32_t term_length, int32_t initial_term_id,
                  LogGeometry *g)
{
    if (term_length < 65536 || (term_length & (term_length - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "term length %d is not a power of two >= 65536",
                     term_length);
        return -1;
    }
    if (ab_check(log, 0, (Py_ssize_t)term_length * PARTITION_COUNT + LOG_META_DATA_LENGTH, 8))
        return -1;
    g->terms = log->data;
    g->meta = log->data + (Py_ssize_t)term_length * PARTITION_COUNT;
    g->term_length = term_length;
    g->position_bits = __builtin_ctz((unsigned)term_length);
    g->initial_term_id = initial_term_id;
    return 0;
}

static PyObject *native_acquire_fence(PyObject *m, PyObject *Py_UNUSED(ignored))
{
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    Py_RETURN_NONE;
}

PyMethodDef atomic_buffer_functions[] = {
    {"acquire_fence", native_acquire_fence, METH_NOARGS,
     "acquire_fence(): loads before it are not reordered with loads and stores after it"},
    {NULL, NULL, 0, NULL},
};
