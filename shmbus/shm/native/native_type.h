/*
 * What every native type object of both extensions (shmbus.shm._native and netbridge._io)
 * spells the same way: its head of static fields, the slots that make and unmake an instance,
 * and the deallocation of a garbage-collected one. A type object names its other slots
 * (methods, getset, ...) itself.
 */
#ifndef SHMBUS_NATIVE_TYPE_H
#define SHMBUS_NATIVE_TYPE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/*
 * The first fields of a static PyTypeObject: no metatype or size yet (PyType_Ready fills
 * them), then the dotted name Python shows, the instance struct, the flags and the docstring.
 *
 *     PyTypeObject FooType = {
 *         NATIVE_TYPE_HEAD("shmbus.shm._native.Foo", Foo, Py_TPFLAGS_DEFAULT,
 *                          "Foo(x): what a Foo is."),
 *         NATIVE_TYPE_LIFECYCLE(PyType_GenericNew, foo_init, foo_dealloc),
 *         .tp_methods = foo_methods,
 *         ...
 *     };
 */
#define NATIVE_TYPE_HEAD(dotted_name, instance, flags, doc) \
    PyVarObject_HEAD_INIT(NULL, 0) \
    .tp_name = (dotted_name), \
    .tp_basicsize = sizeof(instance), \
    .tp_flags = (flags), \
    .tp_doc = (doc)

/*
 * The slots that make and unmake an instance: tp_new (PyType_GenericNew, or the type's own
 * that sets what must not start as zero), tp_init and tp_dealloc.
 */
#define NATIVE_TYPE_LIFECYCLE(new, init, dealloc) \
    .tp_new = (new), \
    .tp_init = (initproc)(init), \
    .tp_dealloc = (destructor)(dealloc)

/*
 * Defines `static void name(instance *self)`, the tp_dealloc of a type with Py_TPFLAGS_HAVE_GC
 * whose tp_clear (`clear`) drops every reference the instance holds: stop tracking, clear,
 * free. A subtype that adds no references inherits it.
 */
#define NATIVE_GC_DEALLOC(name, instance, clear) \
    static void name(instance *self) \
    { \
        PyObject_GC_UnTrack(self); \
        clear(self); \
        Py_TYPE(self)->tp_free((PyObject *)self); \
    }

#endif /* SHMBUS_NATIVE_TYPE_H */
