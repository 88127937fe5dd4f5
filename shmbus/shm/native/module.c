/*
 * shmbus.shm._native: the only code that touches memory another process writes concurrently.
 * This file registers what the other sources define:
 *
 *   atomic_buffer.c   AtomicBuffer, acquire_fence()
 *   publication.c     PublicationCore, over the term appender (term_appender.c)
 *   image.c           ImageCore (the term reader) and Header
 *   subscription.c    SubscriptionCore (polling over a subscription's images), MessageIterator
 *   assembler.c       FragmentAssembler
 *   group_member.c    GroupMemberCore: competing consumers of a subscription group
 *   heartbeat.c       Heartbeat, epoch_ms()
 *   wakeups.c         signal_word, wait_word, wait_for_data, wake_log_readers/writers
 *   flow_control.c    flow_control_set, flow_control_advance (and the publisher's raise)
 *   log_watcher.c     LogWatcher: a thread that turns log wake-ups into an eventfd
 *   futex_ring.c      FutexRing: the same with io_uring's futex wait, no thread
 *
 * plus LAYOUT (the log layout constants of shmbus_native.h, which tests compare with
 * shmbus/shm/log_buffer.py) and _C_API, the capsule netbridge._io imports (shmbus_capi.h).
 * Imported by every process (client, driver, netbridge) with the GIL held.
 */
#include "types.h"

static const ShmbusCAPI capi = {
    .version = SHMBUS_CAPI_VERSION,
    .atomic_buffer_type = &AtomicBufferType,
    .ab_check = ab_check,
    .geometry_from = geometry_from,
    .watch_arg = watch_arg,
    .watch_ready = watch_ready,
};

/* The layout constants Python names too, under log_buffer.py's names. */
static const struct {
    const char *name;
    long value;
} layout[] = {
    {"PARTITION_COUNT", PARTITION_COUNT},
    {"LOG_META_DATA_LENGTH", LOG_META_DATA_LENGTH},
    {"HEADER_LENGTH", HEADER_LENGTH},
    {"FRAME_ALIGNMENT", FRAME_ALIGNMENT},
    {"TAIL_COUNTERS_OFFSET", META_TAIL_COUNTERS},
    {"ACTIVE_TERM_COUNT_OFFSET", META_ACTIVE_TERM_COUNT},
    {"END_OF_STREAM_POSITION_OFFSET", META_END_OF_STREAM_POSITION},
    {"IS_CONNECTED_OFFSET", META_IS_CONNECTED},
    {"INITIAL_TERM_ID_OFFSET", META_INITIAL_TERM_ID},
    {"FC_LOCK_OFFSET", META_FC_LOCK},
    {"FC_CLEAN_POSITION_OFFSET", META_FC_CLEAN_POSITION},
    {"READERS_RAISE_OFFSET", META_READERS_RAISE},
    {"DATA_WAKE_OFFSET", META_DATA_WAKE},
    {"DATA_WAITERS_OFFSET", META_DATA_WAITERS},
    {"PROGRESS_WAKE_OFFSET", META_PROGRESS_WAKE},
    {"PROGRESS_WAITERS_OFFSET", META_PROGRESS_WAITERS},
    {"FC_VERSION_OFFSET", META_FC_VERSION},
    {"FC_COUNT_OFFSET", META_FC_COUNT},
    {"FC_WINDOW_OFFSET", META_FC_WINDOW},
    {"FC_CLEAN_LAG_OFFSET", META_FC_CLEAN_LAG},
    {"FC_COUNTER_IDS_OFFSET", META_FC_COUNTER_IDS},
    {"FC_MAX_COUNTED", FC_MAX_COUNTED},
    {"HDR_TYPE_PAD", HDR_TYPE_PAD},
    {"HDR_TYPE_DATA", HDR_TYPE_DATA},
    {"BEGIN_FLAG", BEGIN_FLAG},
    {"END_FLAG", END_FLAG},
    {"UNFRAGMENTED", UNFRAGMENTED},
};

static PyObject *layout_dict(void)
{
    PyObject *dict = PyDict_New();
    for (size_t i = 0; dict != NULL && i < sizeof layout / sizeof layout[0]; i++) {
        PyObject *value = PyLong_FromLong(layout[i].value);
        if (value == NULL || PyDict_SetItemString(dict, layout[i].name, value) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(value);
    }
    return dict;
}

static struct PyModuleDef native_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "shmbus.shm._native",
    .m_doc = "Native core of shmbus: atomics, term appender, term reader and wake-ups.",
    .m_size = -1,
};

static int add_type(PyObject *m, const char *name, PyTypeObject *type)
{
    return PyType_Ready(type) < 0 ? -1 : PyModule_AddObjectRef(m, name, (PyObject *)type);
}

/* Adds `value` (a new reference, or NULL with an exception) as m.name. */
static int add_new(PyObject *m, const char *name, PyObject *value)
{
    int r = value == NULL ? -1 : PyModule_AddObjectRef(m, name, value);
    Py_XDECREF(value);
    return r;
}

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&HeaderType) < 0 || PyType_Ready(&MessageIteratorType) < 0 ||
        image_module_init() < 0)
        return NULL;
    PyObject *m = PyModule_Create(&native_module);
    if (m == NULL)
        return NULL;
    if (add_type(m, "AtomicBuffer", &AtomicBufferType) < 0 ||
        add_type(m, "PublicationCore", &PublicationCoreType) < 0 ||
        PyModule_AddObjectRef(m, "Header", (PyObject *)&HeaderType) < 0 ||
        add_type(m, "ImageCore", &ImageCoreType) < 0 ||
        add_type(m, "SubscriptionCore", &SubscriptionCoreType) < 0 ||
        add_type(m, "Heartbeat", &HeartbeatType) < 0 ||
        add_type(m, "FragmentAssembler", &AssemblerType) < 0 ||
        add_type(m, "GroupMemberCore", &GroupMemberCoreType) < 0 ||
        add_type(m, "LogWatcher", &LogWatcherType) < 0 ||
        add_type(m, "FutexRing", &FutexRingType) < 0 ||
        PyModule_AddFunctions(m, atomic_buffer_functions) < 0 ||
        PyModule_AddFunctions(m, heartbeat_functions) < 0 ||
        PyModule_AddFunctions(m, wakeup_functions) < 0 ||
        PyModule_AddFunctions(m, flow_control_functions) < 0 ||
        PyModule_AddFunctions(m, call_functions) < 0 ||
        add_new(m, "LAYOUT", layout_dict()) < 0 ||
        add_new(m, "_C_API", PyCapsule_New((void *)&capi, SHMBUS_CAPI_NAME, NULL)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
