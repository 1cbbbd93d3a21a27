/* A block of a flooding client's frames refused in one pass, compiled (net/frame_shape.py).
 *
 * Why: at 10x capacity the event loop reads ~100k frames a second and refuses nearly all of them.
 * numpy checks a block of them against the connection's FrameShapes and builds their answers in
 * ~1.4 us of the loop's time per frame (timed at 10x: ~0.13 of a core, a quarter of the loop's),
 * most of it numpy's per-call cost on small arrays, all of it holding the GIL that the executor
 * thread needs between two batches. This does the same check and builds the same answers in a few
 * nanoseconds per frame, the GIL released.
 *
 * refuse(block, length, shapes) -> (count, answers)
 *   block: a C-contiguous buffer of whole frames of `length` bytes each (header included).
 *   shapes: a tuple of (mask, want, id_at, id_size, sign_at, before, after), one per FrameShape:
 *     mask and want are `length` bytes; a frame has the shape when (frame & mask) == want byte for
 *     byte and, if sign_at >= 0, frame[sign_at] < 0x80. Its answer is before + the id's
 *     encoding (id_size bytes from id_at) + after.
 *   count: how many leading frames have one of the shapes (the first in the tuple's order that
 *     matches); answers: theirs, in the frames' order.
 * The same frames, answered the same way, as FrameShapes.match and the numpy path
 * (tests/net/test_frame_shape.py compares them on random and mutated frames).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_SHAPES 16

typedef struct {
    const unsigned char *mask, *want, *before, *after;
    Py_ssize_t id_at, id_size, sign_at, before_size, after_size;
} Shape;

static int same(const unsigned char *frame, const Shape *shape, Py_ssize_t length) {
    Py_ssize_t i = 0;
    for (; i + 8 <= length; i += 8) {
        uint64_t f, m, w;
        memcpy(&f, frame + i, 8);
        memcpy(&m, shape->mask + i, 8);
        memcpy(&w, shape->want + i, 8);
        if ((f & m) != w) return 0;
    }
    for (; i < length; i++) {
        if ((frame[i] & shape->mask[i]) != shape->want[i]) return 0;
    }
    return shape->sign_at < 0 || frame[shape->sign_at] < 0x80;
}

static int read_bytes(PyObject *obj, Py_ssize_t expected, const unsigned char **out, Py_ssize_t *size) {
    if (!PyBytes_Check(obj)) {
        PyErr_SetString(PyExc_TypeError, "refuse: a shape's mask, want, before and after are bytes");
        return -1;
    }
    *out = (const unsigned char *)PyBytes_AS_STRING(obj);
    *size = PyBytes_GET_SIZE(obj);
    if (expected >= 0 && *size != expected) {
        PyErr_SetString(PyExc_ValueError, "refuse: a shape's mask and want are one frame long");
        return -1;
    }
    return 0;
}

static int read_shape(PyObject *item, Py_ssize_t length, Shape *shape) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 7) {
        PyErr_SetString(PyExc_TypeError, "refuse: a shape is (mask, want, id_at, id_size, sign_at, before, after)");
        return -1;
    }
    Py_ssize_t ignored;
    if (read_bytes(PyTuple_GET_ITEM(item, 0), length, &shape->mask, &ignored) < 0) return -1;
    if (read_bytes(PyTuple_GET_ITEM(item, 1), length, &shape->want, &ignored) < 0) return -1;
    shape->id_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 2));
    shape->id_size = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 3));
    shape->sign_at = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 4));
    if (PyErr_Occurred()) return -1;
    if (read_bytes(PyTuple_GET_ITEM(item, 5), -1, &shape->before, &shape->before_size) < 0) return -1;
    if (read_bytes(PyTuple_GET_ITEM(item, 6), -1, &shape->after, &shape->after_size) < 0) return -1;
    if (shape->id_at < 0 || shape->id_size < 1 || shape->id_at + shape->id_size > length ||
        shape->sign_at < -1 || shape->sign_at >= length) {
        PyErr_SetString(PyExc_ValueError, "refuse: a shape's id or sign byte lies outside the frame");
        return -1;
    }
    return 0;
}

static PyObject *refuse(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "refuse(block, length, shapes) takes 3 arguments");
        return NULL;
    }
    Py_ssize_t length = PyLong_AsSsize_t(args[1]);
    if (length == -1 && PyErr_Occurred()) return NULL;
    if (length < 1) {
        PyErr_SetString(PyExc_ValueError, "refuse: length must be at least 1");
        return NULL;
    }
    PyObject *items = args[2];
    if (!PyTuple_Check(items) || PyTuple_GET_SIZE(items) > MAX_SHAPES) {
        PyErr_SetString(PyExc_TypeError, "refuse: shapes is a tuple of at most 16 shapes");
        return NULL;
    }
    Shape shapes[MAX_SHAPES];
    Py_ssize_t count_shapes = PyTuple_GET_SIZE(items), widest = 0;
    for (Py_ssize_t s = 0; s < count_shapes; s++) {
        if (read_shape(PyTuple_GET_ITEM(items, s), length, &shapes[s]) < 0) return NULL;
        Py_ssize_t size = shapes[s].before_size + shapes[s].id_size + shapes[s].after_size;
        widest = size > widest ? size : widest;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    Py_ssize_t frames = view.len / length;
    PyObject *out = PyBytes_FromStringAndSize(NULL, count_shapes ? frames * widest : 0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out), *start = dst;
    const unsigned char *frame = (const unsigned char *)view.buf;
    Py_ssize_t count = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; count < frames && count_shapes; count++, frame += length) {
        const Shape *shape = NULL;
        for (Py_ssize_t s = 0; s < count_shapes; s++) {
            if (same(frame, &shapes[s], length)) {
                shape = &shapes[s];
                break;
            }
        }
        if (shape == NULL) break;
        memcpy(dst, shape->before, shape->before_size);
        dst += shape->before_size;
        memcpy(dst, frame + shape->id_at, shape->id_size);
        dst += shape->id_size;
        memcpy(dst, shape->after, shape->after_size);
        dst += shape->after_size;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (_PyBytes_Resize(&out, dst - start) < 0) return NULL;
    PyObject *n = PyLong_FromSsize_t(count);
    if (n == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    PyObject *result = PyTuple_Pack(2, n, out);
    Py_DECREF(n);
    Py_DECREF(out);
    return result;
}

static PyMethodDef methods[] = {
    {"refuse", (PyCFunction)(void (*)(void))refuse, METH_FASTCALL,
     "refuse(block, length, shapes) -> (count, answers): see the file's header."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_shapes", NULL, -1, methods};

PyMODINIT_FUNC PyInit__shapes(void) { return PyModule_Create(&module); }
