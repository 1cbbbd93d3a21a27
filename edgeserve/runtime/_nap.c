/* The event loop's wait for the executor thread's next batch, compiled (runtime/executor.py).
 *
 * Why: under load the loop steps aside as the executor thread's batch is due to end, so that the
 * thread decides and starts the next one without waiting for the GIL. A lock the loop blocks on
 * must be released by the executor thread between its two batches, and that release wakes a
 * sleeping thread: a futex wake, ~5 us in a tight loop and ~10 us under load on a VM, every one
 * of them idle time of the backend (measured at 10x: 0.4 % of the wall time). Here the loop naps
 * instead, in steps of its own timer with the GIL released, and looks at a counter that the
 * executor thread bumps with a plain store: the wake-up is the loop's own, off the executor's way.
 *
 * nap(counter, seen, until, step) -> bool
 *   counter: a writable buffer whose first 8 bytes are an aligned native int64 (an array('q')).
 *   seen: its value when the caller decided to wait.
 *   until: time.monotonic() at which to give up; step: seconds of one nap (timer slack 1 us).
 *   True once the counter differs from `seen`, False at `until`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <time.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

static double monotonic_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts); /* the clock of Python's time.monotonic() on Linux */
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static PyObject *nap(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "nap(counter, seen, until, step)");
        return NULL;
    }
    long long seen = PyLong_AsLongLong(args[1]);
    double until = PyFloat_AsDouble(args[2]);
    double step = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) < 0) return NULL;
    if (view.len < 8 || ((uintptr_t)view.buf & 7) != 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "counter: an aligned buffer of at least 8 bytes");
        return NULL;
    }
    const int64_t *word = (const int64_t *)view.buf;
    int changed = 0;
    Py_BEGIN_ALLOW_THREADS
#ifdef __linux__
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
    for (;;) {
        if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != (int64_t)seen) {
            changed = 1;
            break;
        }
        double left = until - monotonic_s();
        if (!(left > 0.0)) break;
        double d = left < step ? left : step;
        struct timespec ts;
        ts.tv_sec = (time_t)d;
        ts.tv_nsec = (long)((d - (double)ts.tv_sec) * 1e9);
        nanosleep(&ts, NULL);
    }
#ifdef __linux__
    if (slack > 0) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
#endif
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return PyBool_FromLong(changed);
}

static PyMethodDef methods[] = {
    {"nap", (PyCFunction)(void (*)(void))nap, METH_FASTCALL,
     "nap(counter, seen, until, step) -> bool: nap until counter[0] != seen or until passes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_nap", NULL, -1, methods};

PyMODINIT_FUNC PyInit__nap(void) { return PyModule_Create(&module); }
