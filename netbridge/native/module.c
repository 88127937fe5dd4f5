/*
 * netbridge._io: the native code only the netbridge runs, its loops over logs and sockets.
 * This file registers what the other sources define:
 *
 *   term_scan.c      term_scan, scan_datagrams: the sender's reading of a publication log
 *   term_rebuild.c   validate_datagram, insert_frames: the receiver's writing of an image log
 *   udp_batches.c    receive_batch, send_batch: recvmmsg/sendmmsg between sockets and logs
 *   busy_poll.c      busy_poll, send_now: the spin between duty cycles
 *   sealing.c        Sealer: the AEAD of authenticated channels
 *
 * It shares the log layout and atomics of shmbus.shm._native as header code (shmbus_native.h)
 * and reaches _native's AtomicBuffer type, its checks and the LogWatcher's watches through the
 * capsule shmbus.shm._native._C_API (shmbus_capi.h), imported here. Imported by the netbridge
 * process (netbridge/sender.py, receiver.py, datagram_io.py, bridge.py) with the GIL held.
 */
#include "io.h"

const ShmbusCAPI *shmbus;

static struct PyModuleDef io_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "netbridge._io",
    .m_doc = "Native loops of the netbridge: term scans and rebuilds, UDP batches, busy poll.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__io(void)
{
    shmbus = PyCapsule_Import(SHMBUS_CAPI_NAME, 0);
    if (shmbus == NULL)
        return NULL;
    if (shmbus->version != SHMBUS_CAPI_VERSION) {
        PyErr_Format(PyExc_ImportError, "netbridge._io was built for the C API version %d of "
                     "shmbus.shm._native, which has version %d: rebuild both", SHMBUS_CAPI_VERSION,
                     shmbus->version);
        return NULL;
    }
    if (PyType_Ready(&SealerType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&io_module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Sealer", (PyObject *)&SealerType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (PyModule_AddFunctions(m, term_scan_functions) < 0 ||
        PyModule_AddFunctions(m, term_rebuild_functions) < 0 ||
        PyModule_AddFunctions(m, udp_batch_functions) < 0 ||
        PyModule_AddFunctions(m, busy_poll_functions) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
