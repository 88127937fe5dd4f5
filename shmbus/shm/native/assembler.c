/*
 * FragmentAssembler: reassembly of fragmented messages, per session, in front of a fragment
 * handler (shmbus/streams/fragment_assembler.py).
 *
 * Runs in client processes, called by the image readers on the thread that polls, with the GIL
 * held.
 */
#include "types.h"

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *delegate;
    PyObject *builders;       /* dict: session id -> bytearray of the message so far */
} Assembler;

/* The flags and session id of a Header (or of any object with those attributes). */
static int header_fields(PyObject *header, int *flags, int32_t *session_id)
{
    if (PyObject_TypeCheck(header, &HeaderType)) {
        *flags = ((Header *)header)->bytes[FLAGS_OFFSET];
        *session_id = rd_i32(((Header *)header)->bytes + SESSION_ID_OFFSET);
        return 0;
    }
    PyObject *f = PyObject_GetAttrString(header, "flags");
    PyObject *s = f ? PyObject_GetAttrString(header, "session_id") : NULL;
    long fv = f ? PyLong_AsLong(f) : -1, sv = s ? PyLong_AsLong(s) : -1;
    Py_XDECREF(f);
    Py_XDECREF(s);
    if (PyErr_Occurred())
        return -1;
    *flags = (int)fv;
    *session_id = (int32_t)sv;
    return 0;
}

static int append_buffer(PyObject *bytearray, PyObject *buffer)
{
    Py_buffer view;
    if (PyObject_GetBuffer(buffer, &view, PyBUF_SIMPLE) < 0)
        return -1;
    Py_ssize_t old = PyByteArray_GET_SIZE(bytearray);
    int rc = PyByteArray_Resize(bytearray, old + view.len);
    if (rc == 0)
        memcpy(PyByteArray_AS_STRING(bytearray) + old, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return rc;
}

static PyObject *assembler_vectorcall(PyObject *callable, PyObject *const *args, size_t nargsf,
                                      PyObject *kwnames)
{
    Assembler *self = (Assembler *)callable;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "a fragment handler takes (buffer, header)");
        return NULL;
    }
    int flags;
    int32_t session_id;
    if (header_fields(args[1], &flags, &session_id) < 0)
        return NULL;
    flags &= UNFRAGMENTED;
    if (flags == UNFRAGMENTED)
        return PyObject_Vectorcall(self->delegate, args, 2, NULL);
    PyObject *key = PyLong_FromLong(session_id);
    if (key == NULL)
        return NULL;
    PyObject *result = NULL;
    if (flags & BEGIN_FLAG) {
        PyObject *builder = PyByteArray_FromStringAndSize(NULL, 0);
        if (builder != NULL && append_buffer(builder, args[0]) == 0 &&
            PyDict_SetItem(self->builders, key, builder) == 0)
            result = Py_NewRef(Py_None);
        Py_XDECREF(builder);
        Py_DECREF(key);
        return result;
    }
    PyObject *builder = PyDict_GetItemWithError(self->builders, key);  /* borrowed */
    if (builder == NULL) {
        Py_DECREF(key);
        if (PyErr_Occurred())
            return NULL;
        Py_RETURN_NONE;  /* joined in the middle of a message: dropped */
    }
    Py_INCREF(builder);
    if (append_buffer(builder, args[0]) < 0)
        goto done;
    if (!(flags & END_FLAG)) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if (PyDict_DelItem(self->builders, key) < 0)
        goto done;
    PyObject *view = PyMemoryView_FromObject(builder);
    if (view == NULL)
        goto done;
    PyObject *call_args[2] = {view, args[1]};
    result = PyObject_Vectorcall(self->delegate, call_args, 2, NULL);
    Py_DECREF(view);
done:
    Py_DECREF(builder);
    Py_DECREF(key);
    return result;
}

static int assembler_init(Assembler *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"delegate", NULL};
    PyObject *delegate;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &delegate))
        return -1;
    if (!PyCallable_Check(delegate)) {
        PyErr_SetString(PyExc_TypeError, "the delegate must be callable (buffer, header)");
        return -1;
    }
    Py_XSETREF(self->delegate, Py_NewRef(delegate));
    Py_XSETREF(self->builders, PyDict_New());
    if (self->builders == NULL)
        return -1;
    self->vectorcall = assembler_vectorcall;
    return 0;
}

static PyObject *assembler_free_session(Assembler *self, PyObject *session_id)
{
    if (self->builders != NULL && PyDict_Contains(self->builders, session_id) == 1 &&
        PyDict_DelItem(self->builders, session_id) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int assembler_traverse(Assembler *self, visitproc visit, void *arg)
{
    Py_VISIT(self->delegate);
    Py_VISIT(self->builders);
    return 0;
}

static int assembler_clear(Assembler *self)
{
    Py_CLEAR(self->delegate);
    Py_CLEAR(self->builders);
    return 0;
}

NATIVE_GC_DEALLOC(assembler_dealloc, Assembler, assembler_clear)

static PyMemberDef assembler_members[] = {
    {"delegate", T_OBJECT, offsetof(Assembler, delegate), READONLY,
     "the handler that gets whole messages"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef assembler_methods[] = {
    {"free_session", (PyCFunction)assembler_free_session, METH_O,
     "free_session(session_id): forget a partial message of a session that went away"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject AssemblerType = {
    NATIVE_TYPE_HEAD("shmbus.FragmentAssembler", Assembler,
                     Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
                     "FragmentAssembler(delegate): a fragment handler that calls delegate(buffer, "
                     "header) once per whole message.\n\nUnfragmented messages pass straight "
                     "through (zero copy). Fragments are copied into a per-session buffer until "
                     "the E flag arrives; the delegate then gets a memoryview of the whole "
                     "message and the header of the last fragment. A fragment without a begun "
                     "message (joined mid-message) is dropped."),
    NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, assembler_init, assembler_dealloc),
    .tp_traverse = (traverseproc)assembler_traverse,
    .tp_clear = (inquiry)assembler_clear,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Assembler, vectorcall),
    .tp_members = assembler_members,
    .tp_methods = assembler_methods,
};
