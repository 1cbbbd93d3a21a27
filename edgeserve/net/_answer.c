/* The frame of an `ok` answer, written from AnswerFrames' cached pieces, compiled
 * (net/answer_frames.py).
 *
 * Why: every request the server serves costs its event loop one answer, and the Python writer
 * of the frame (AnswerFrames.frame: cache lookups, three rounded timings, two packed ints, a
 * join) took ~3.5 us of the ~38 us the loop spends per served request, all of it holding the
 * GIL. With many connections the loop's time per request decides how often each connection is
 * read, and so how old its frames are when they are read (docs/overload-journal.md, "Many
 * connections: what bounds the answers in deadline"). This writes the same bytes in a fraction.
 *
 * frame(request_id, result, priority, tables) -> bytes | None
 *   tables: (Result, Status.OK, numpy.ndarray, models, layouts, exits, served), the last four
 *   AnswerFrames' caches (dicts): model -> its fields up to "output"; (name, dtype, shape) ->
 *   (the output's name and tensor map up to its data, the same without the name); (exit_index,
 *   exit_name, expected_accuracy) -> the "exit" field up to "late"; served_by -> its fields up
 *   to "queue_ms".
 * It returns the frame (length prefix included) only where every piece it needs is cached and
 * the result is a plain `ok` one (the exact types: Result, ndarray outputs C-ordered, float
 * times, int id, batch size and priority); None for anything else, and the caller writes it in
 * Python, which fills the caches. The bytes are AnswerFrames' Python path's to the bit, timings
 * rounded as timing_ms rounds them; tests/net/test_answer_frames.py compares the three writers.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define MAX_OUTPUTS 15                                        /* a fixmap */
#define ROUNDED_BELOW 1e15                                    /* timing_ms: larger ms are kept */
static const char HEAD[] = "\x8c\xa4type\xa6result\xa2id";    /* the map and its first field */
static const char OUTPUTS[] = "\xa7outputs";
static const char SERVICE[] = "\xaaservice_ms";
static const char TOTAL[] = "\xa8total_ms";
static const char BATCH[] = "\xaa" "batch_size";
static const char PRIORITY[] = "\xa8priority";
static const char ERROR_NIL[] = "\xa5" "error\xc0";
#define LEN(s) ((Py_ssize_t)sizeof(s) - 1)

static PyObject *s_status, *s_outputs, *s_exit_index, *s_exit_name, *s_accuracy, *s_error,
    *s_model, *s_served_by, *s_queued, *s_start, *s_end, *s_deadline, *s_batch_size, *s_dtype,
    *s_shape;

/* A Python int as msgpack-python packs it: 1 and its bytes in out (at most 9); 0 if it is not an
 * int or is out of msgpack's range (the caller declines, Python raises its own error). */
static int pack_int(PyObject *v, unsigned char *out, Py_ssize_t *n) {
    if (!PyLong_CheckExact(v)) return 0;
    int overflow;
    long long d = PyLong_AsLongLongAndOverflow(v, &overflow);
    uint64_t u;
    int width;
    unsigned char tag;
    if (overflow > 0) {
        unsigned long long big = PyLong_AsUnsignedLongLong(v);
        if (big == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            return 0;
        }
        u = big, tag = 0xcf, width = 8;
    } else if (overflow < 0 || (d == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    } else if (d < -(1LL << 5)) {
        u = (uint64_t)d;
        if (d < -(1LL << 31)) tag = 0xd3, width = 8;
        else if (d < -(1LL << 15)) tag = 0xd2, width = 4;
        else if (d < -(1LL << 7)) tag = 0xd1, width = 2;
        else tag = 0xd0, width = 1;
    } else if (d < (1LL << 7)) {
        out[0] = (unsigned char)(d & 0xff); /* a positive or negative fixint */
        *n = 1;
        return 1;
    } else {
        u = (uint64_t)d;
        if (d < (1LL << 8)) tag = 0xcc, width = 1;
        else if (d < (1LL << 16)) tag = 0xcd, width = 2;
        else if (d < (1LL << 32)) tag = 0xce, width = 4;
        else tag = 0xcf, width = 8;
    }
    out[0] = tag;
    for (int i = 0; i < width; i++) out[1 + i] = (unsigned char)(u >> (8 * (width - 1 - i)));
    *n = 1 + width;
    return 1;
}

/* A timing in ms as timing_ms gives it, packed: nil for nan, else a float 64. */
static Py_ssize_t pack_ms(double seconds, unsigned char *out) {
    double ms = seconds * 1000.0;
    if (ms != ms) {
        out[0] = 0xc0;
        return 1;
    }
    if (fabs(ms) < ROUNDED_BELOW) {
        double r = rint(ms * 1e4); /* to nearest, ties to even: Python's round() */
        ms = (r == 0.0 ? 0.0 : r) / 1e4; /* round() gives the int 0 for -0.0 */
    }
    uint64_t bits;
    memcpy(&bits, &ms, 8);
    out[0] = 0xcb;
    for (int i = 0; i < 8; i++) out[1 + i] = (unsigned char)(bits >> (8 * (7 - i)));
    return 9;
}

/* An attribute that must be an exact float: 1 and its value, 0 otherwise. */
static int get_double(PyObject *obj, PyObject *name, double *v) {
    PyObject *x = PyObject_GetAttr(obj, name);
    if (x == NULL) {
        PyErr_Clear();
        return 0;
    }
    int ok = PyFloat_CheckExact(x);
    if (ok) *v = PyFloat_AS_DOUBLE(x);
    Py_DECREF(x);
    return ok;
}

/* dict[key] as a borrowed bytes object, or NULL (missing, not bytes, or an error, cleared). */
static PyObject *cached(PyObject *dict, PyObject *key) {
    PyObject *v = PyDict_GetItemWithError(dict, key);
    if (v == NULL) {
        PyErr_Clear();
        return NULL;
    }
    return v;
}

typedef struct {
    PyObject *named, *bare; /* borrowed from the layouts cache (kept alive by `layout`) */
    PyObject *layout;       /* a new reference to the cached tuple */
    Py_buffer view;
    int has_view;
} Output;

static PyObject *frame(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyTuple_Check(args[3]) || PyTuple_GET_SIZE(args[3]) != 7) {
        PyErr_SetString(PyExc_TypeError,
                         "frame(request_id, result, priority, (Result, ok, ndarray, models, layouts, exits, served))");
        return NULL;
    }
    PyObject *request_id = args[0], *result = args[1], *priority = args[2], *tables = args[3];
    PyObject *result_type = PyTuple_GET_ITEM(tables, 0), *ok = PyTuple_GET_ITEM(tables, 1);
    PyObject *ndarray = PyTuple_GET_ITEM(tables, 2), *models = PyTuple_GET_ITEM(tables, 3);
    PyObject *layouts = PyTuple_GET_ITEM(tables, 4), *exits = PyTuple_GET_ITEM(tables, 5);
    PyObject *served_cache = PyTuple_GET_ITEM(tables, 6);
    if (!PyDict_CheckExact(models) || !PyDict_CheckExact(layouts) || !PyDict_CheckExact(exits) ||
        !PyDict_CheckExact(served_cache)) {
        PyErr_SetString(PyExc_TypeError, "frame: the caches must be dicts");
        return NULL;
    }
    if ((PyObject *)Py_TYPE(result) != result_type) Py_RETURN_NONE;

    PyObject *frame_bytes = NULL;
    PyObject *status = NULL, *outputs = NULL, *error = NULL, *model = NULL, *served_by = NULL;
    PyObject *exit_index = NULL, *exit_name = NULL, *accuracy = NULL, *batch_size = NULL;
    PyObject *exit_key = NULL;
    Output outs[MAX_OUTPUTS];
    Py_ssize_t n_outs = 0;
    unsigned char id_bytes[9], batch_bytes[9], priority_bytes[9], late, timings[3][9];
    Py_ssize_t id_len, batch_len, priority_len, timing_len[3];
    double queued, start, end, deadline;

#define GET(var, name)                          \
    var = PyObject_GetAttr(result, name);       \
    if (var == NULL) {                          \
        PyErr_Clear();                          \
        goto decline;                           \
    }
    GET(status, s_status);
    if (status != ok) goto decline;
    GET(error, s_error);
    if (error != Py_None) goto decline;
    GET(exit_index, s_exit_index);
    if (exit_index == Py_None) goto decline;
    GET(outputs, s_outputs);
    if (!PyDict_CheckExact(outputs)) goto decline;
    Py_ssize_t count = PyDict_GET_SIZE(outputs);
    if (count < 1 || count > MAX_OUTPUTS) goto decline;
    if (!pack_int(request_id, id_bytes, &id_len)) goto decline;
    if (priority == Py_None) {
        priority_bytes[0] = 0xc0, priority_len = 1;
    } else if (!pack_int(priority, priority_bytes, &priority_len)) {
        goto decline;
    }
    GET(batch_size, s_batch_size);
    if (!pack_int(batch_size, batch_bytes, &batch_len)) goto decline;
    if (!get_double(result, s_queued, &queued) || !get_double(result, s_start, &start) ||
        !get_double(result, s_end, &end) || !get_double(result, s_deadline, &deadline))
        goto decline;
    late = end > deadline ? 0xc3 : 0xc2;
    timing_len[0] = pack_ms(start - queued, timings[0]);
    timing_len[1] = pack_ms(end - start, timings[1]);
    timing_len[2] = pack_ms(end - queued, timings[2]);

    GET(model, s_model);
    PyObject *model_piece = cached(models, model);
    if (model_piece == NULL || !PyBytes_CheckExact(model_piece)) goto decline;
    GET(exit_name, s_exit_name);
    GET(accuracy, s_accuracy);
    exit_key = PyTuple_Pack(3, exit_index, exit_name, accuracy);
    if (exit_key == NULL) goto fail;
    PyObject *exit_piece = cached(exits, exit_key);
    if (exit_piece == NULL || !PyBytes_CheckExact(exit_piece)) goto decline;
    GET(served_by, s_served_by);
    PyObject *served_piece = cached(served_cache, served_by);
    if (served_piece == NULL || !PyBytes_CheckExact(served_piece)) goto decline;

    Py_ssize_t size = LEN(HEAD) + id_len + PyBytes_GET_SIZE(model_piece) + LEN(OUTPUTS) + 1 +
                      PyBytes_GET_SIZE(exit_piece) + 1 + PyBytes_GET_SIZE(served_piece) +
                      timing_len[0] + LEN(SERVICE) + timing_len[1] + LEN(TOTAL) + timing_len[2] +
                      LEN(BATCH) + batch_len + LEN(PRIORITY) + priority_len + LEN(ERROR_NIL);
    Py_ssize_t pos = 0;
    PyObject *name, *value;
    while (PyDict_Next(outputs, &pos, &name, &value)) {
        if ((PyObject *)Py_TYPE(value) != ndarray) goto decline;
        Output *o = &outs[n_outs];
        o->layout = NULL, o->has_view = 0;
        n_outs++;
        PyObject *dtype = PyObject_GetAttr(value, s_dtype);
        PyObject *shape = dtype == NULL ? NULL : PyObject_GetAttr(value, s_shape);
        PyObject *key = shape == NULL ? NULL : PyTuple_Pack(3, name, dtype, shape);
        Py_XDECREF(dtype);
        Py_XDECREF(shape);
        if (key == NULL) goto fail;
        PyObject *layout = cached(layouts, key);
        Py_DECREF(key);
        if (layout == NULL || !PyTuple_CheckExact(layout) || PyTuple_GET_SIZE(layout) != 2) goto decline;
        Py_INCREF(layout);
        o->layout = layout;
        o->named = PyTuple_GET_ITEM(layout, 0), o->bare = PyTuple_GET_ITEM(layout, 1);
        if (!PyBytes_CheckExact(o->named) || !PyBytes_CheckExact(o->bare)) goto decline;
        if (PyObject_GetBuffer(value, &o->view, PyBUF_C_CONTIGUOUS) < 0) {
            PyErr_Clear(); /* not C-ordered */
            goto decline;
        }
        o->has_view = 1;
        size += PyBytes_GET_SIZE(o->named) + o->view.len;
        if (n_outs == 1) size += PyBytes_GET_SIZE(o->bare) + o->view.len; /* "output" */
    }
    if (n_outs != count || size > 0xFFFFFFFF) goto decline;

    frame_bytes = PyBytes_FromStringAndSize(NULL, 4 + size);
    if (frame_bytes == NULL) goto fail;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(frame_bytes);
    p[0] = (unsigned char)(size >> 24), p[1] = (unsigned char)(size >> 16);
    p[2] = (unsigned char)(size >> 8), p[3] = (unsigned char)size;
    p += 4;
#define PUT(src, len)              \
    do {                           \
        memcpy(p, (src), (len));   \
        p += (len);                \
    } while (0)
#define PUT_BYTES(obj) PUT(PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj))
    PUT(HEAD, LEN(HEAD));
    PUT(id_bytes, id_len);
    PUT_BYTES(model_piece);
    PUT_BYTES(outs[0].bare);
    PUT(outs[0].view.buf, outs[0].view.len);
    PUT(OUTPUTS, LEN(OUTPUTS));
    *p++ = (unsigned char)(0x80 | count);
    for (Py_ssize_t i = 0; i < n_outs; i++) {
        PUT_BYTES(outs[i].named);
        PUT(outs[i].view.buf, outs[i].view.len);
    }
    PUT_BYTES(exit_piece);
    *p++ = late;
    PUT_BYTES(served_piece);
    PUT(timings[0], timing_len[0]);
    PUT(SERVICE, LEN(SERVICE));
    PUT(timings[1], timing_len[1]);
    PUT(TOTAL, LEN(TOTAL));
    PUT(timings[2], timing_len[2]);
    PUT(BATCH, LEN(BATCH));
    PUT(batch_bytes, batch_len);
    PUT(PRIORITY, LEN(PRIORITY));
    PUT(priority_bytes, priority_len);
    PUT(ERROR_NIL, LEN(ERROR_NIL));
    goto done;

decline:
    frame_bytes = Py_None;
    Py_INCREF(Py_None);
    goto done;
fail:
    frame_bytes = NULL;
done:
    for (Py_ssize_t i = 0; i < n_outs; i++) {
        if (outs[i].has_view) PyBuffer_Release(&outs[i].view);
        Py_XDECREF(outs[i].layout);
    }
    Py_XDECREF(status);
    Py_XDECREF(outputs);
    Py_XDECREF(error);
    Py_XDECREF(model);
    Py_XDECREF(served_by);
    Py_XDECREF(exit_index);
    Py_XDECREF(exit_name);
    Py_XDECREF(accuracy);
    Py_XDECREF(batch_size);
    Py_XDECREF(exit_key);
    return frame_bytes;
}

static PyMethodDef methods[] = {
    {"frame", (PyCFunction)(void (*)(void))frame, METH_FASTCALL,
     "frame(request_id, result, priority, tables) -> bytes | None: see the file's header."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_answer", NULL, -1, methods};

PyMODINIT_FUNC PyInit__answer(void) {
    struct {
        PyObject **slot;
        const char *name;
    } names[] = {
        {&s_status, "status"},     {&s_outputs, "outputs"},     {&s_exit_index, "exit_index"},
        {&s_exit_name, "exit_name"}, {&s_accuracy, "expected_accuracy"}, {&s_error, "error"},
        {&s_model, "model"},       {&s_served_by, "served_by"}, {&s_queued, "queued"},
        {&s_start, "start"},       {&s_end, "end"},             {&s_deadline, "deadline"},
        {&s_batch_size, "batch_size"}, {&s_dtype, "dtype"},   {&s_shape, "shape"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL) return NULL;
    }
    return PyModule_Create(&module);
}
