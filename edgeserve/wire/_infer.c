/* The common infer request read straight from its frame's bytes, compiled (wire/frames.py).
 *
 * Why: every request the server accepts costs its event loop a msgpack decode into a dict
 * (decode_body) and fast_infer's checks of that dict, ~3 us of the ~37 us the loop spends per
 * served request, all of it holding the GIL. With many connections the loop's time per request
 * decides how often each connection is read, and so how old its frames are when they are read
 * (docs/overload-journal.md, "Many connections: what bounds the answers in deadline"). This reads
 * the same request in a fraction of a microsecond without building the dict.
 *
 * parse(buffer, start, end, table) -> None | (id, model, spec, data_start, deadline_ms, priority)
 *   buffer[start:end]: one frame's msgpack body (no length prefix).
 *   table: a tuple of (name, model, spec, dtype, shape, nbytes), one per model served as it is:
 *     name is the model's name in UTF-8 (bytes), model the same as str, spec any object (handed
 *     back), dtype the wire dtype name (bytes), shape a tuple of ints, nbytes the data's size.
 *   The tuple: the request's id, its model's `model` and `spec`, where the tensor's data starts in
 *   `buffer` (nbytes long), deadline_ms as a float or None, priority as an int or None.
 * It returns a tuple only for a frame that `fast_infer(decode_body(...))` accepts, with the same
 * values, and without capture_ts (a frame with one is left to Python); None for anything else,
 * which the caller then reads the general way (and answers with its errors). Never an exception
 * for any bytes: every read is bounds-checked. tests/wire/test_compiled_infer.py compares the two
 * on valid, random and mutated frames.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DIMS 16
#define MIN_DEADLINE_MS 0.001       /* wire/bounds.py */
#define MAX_DEADLINE_MS 86400000.0  /* wire/bounds.py: 1 day */

typedef struct {
    const unsigned char *p, *end;
} Cursor;

static uint64_t be(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v = (v << 8) | p[i];
    return v;
}

/* An int of any msgpack width: 1 and (negative, magnitude); 0 if the next value is not an int or
 * is cut short (nothing consumed then). */
static int get_int(Cursor *c, int *negative, uint64_t *mag) {
    if (c->p >= c->end) return 0;
    unsigned char b = *c->p;
    if (b <= 0x7f) {
        *negative = 0, *mag = b, c->p += 1;
        return 1;
    }
    if (b >= 0xe0) {
        *negative = 1, *mag = (uint64_t)(256 - b), c->p += 1;
        return 1;
    }
    int n;
    switch (b) {
        case 0xcc: case 0xd0: n = 1; break;
        case 0xcd: case 0xd1: n = 2; break;
        case 0xce: case 0xd2: n = 4; break;
        case 0xcf: case 0xd3: n = 8; break;
        default: return 0;
    }
    if (c->end - c->p < 1 + n) return 0;
    uint64_t v = be(c->p + 1, n);
    c->p += 1 + n;
    if (b >= 0xd0 && (v >> (8 * n - 1)) & 1) { /* a signed width with the sign bit set */
        uint64_t mask = n == 8 ? UINT64_MAX : ((uint64_t)1 << (8 * n)) - 1;
        *negative = 1, *mag = ((~v) & mask) + 1;
    } else {
        *negative = 0, *mag = v;
    }
    return 1;
}

/* A str: 1 with its bytes; 0 if the next value is not a str or is cut short. */
static int get_str(Cursor *c, const unsigned char **s, Py_ssize_t *len) {
    if (c->p >= c->end) return 0;
    unsigned char b = *c->p;
    Py_ssize_t head, size;
    if (b >= 0xa0 && b <= 0xbf) head = 1, size = b & 0x1f;
    else if (b == 0xd9 && c->end - c->p >= 2) head = 2, size = (Py_ssize_t)be(c->p + 1, 1);
    else if (b == 0xda && c->end - c->p >= 3) head = 3, size = (Py_ssize_t)be(c->p + 1, 2);
    else if (b == 0xdb && c->end - c->p >= 5) head = 5, size = (Py_ssize_t)be(c->p + 1, 4);
    else return 0;
    if (c->end - c->p - head < size) return 0;
    *s = c->p + head, *len = size;
    c->p += head + size;
    return 1;
}

/* A map's or an array's count: `fix` is 0x80 (map) or 0x90 (array). */
static int get_count(Cursor *c, unsigned char fix, Py_ssize_t *count) {
    if (c->p >= c->end) return 0;
    unsigned char b = *c->p;
    unsigned char c16 = fix == 0x80 ? 0xde : 0xdc;
    if (b >= fix && b <= fix + 0x0f) {
        *count = b & 0x0f, c->p += 1;
        return 1;
    }
    if (b == c16 && c->end - c->p >= 3) {
        *count = (Py_ssize_t)be(c->p + 1, 2), c->p += 3;
        return 1;
    }
    if (b == c16 + 1 && c->end - c->p >= 5) {
        *count = (Py_ssize_t)be(c->p + 1, 4), c->p += 5;
        return 1;
    }
    return 0;
}

static int equals(const unsigned char *s, Py_ssize_t len, const char *want) {
    return (size_t)len == strlen(want) && memcmp(s, want, (size_t)len) == 0;
}

static int is_nil(Cursor *c) {
    if (c->p < c->end && *c->p == 0xc0) {
        c->p += 1;
        return 1;
    }
    return 0;
}

enum { TYPE, ID, MODEL, TENSOR, DEADLINE, CAPTURE, PRIORITY, KEYS };
static const char *const KEY_NAMES[KEYS] = {
    "type", "id", "model", "tensor", "deadline_ms", "capture_ts", "priority"};

typedef struct {
    const unsigned char *dtype, *data;
    Py_ssize_t dtype_len, data_len, ndim;
    uint64_t dims[MAX_DIMS];
} Tensor;

/* The tensor map: exactly dtype (str), shape (array of non-negative ints) and data (bin). */
static int get_tensor(Cursor *c, Tensor *t) {
    Py_ssize_t count;
    if (!get_count(c, 0x80, &count) || count != 3) return 0;
    int seen = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *key;
        Py_ssize_t key_len;
        if (!get_str(c, &key, &key_len)) return 0;
        if (equals(key, key_len, "dtype") && !(seen & 1)) {
            seen |= 1;
            if (!get_str(c, &t->dtype, &t->dtype_len)) return 0;
        } else if (equals(key, key_len, "shape") && !(seen & 2)) {
            seen |= 2;
            if (!get_count(c, 0x90, &t->ndim) || t->ndim > MAX_DIMS) return 0;
            for (Py_ssize_t d = 0; d < t->ndim; d++) {
                int negative;
                if (!get_int(c, &negative, &t->dims[d]) || negative) return 0;
            }
        } else if (equals(key, key_len, "data") && !(seen & 4)) {
            seen |= 4;
            if (c->p >= c->end) return 0;
            unsigned char b = *c->p;
            int n = b == 0xc4 ? 1 : b == 0xc5 ? 2 : b == 0xc6 ? 4 : 0;
            if (!n || c->end - c->p < 1 + n) return 0;
            Py_ssize_t size = (Py_ssize_t)be(c->p + 1, n);
            if (c->end - c->p - 1 - n < size) return 0;
            t->data = c->p + 1 + n, t->data_len = size;
            c->p += 1 + n + size;
        } else {
            return 0;  /* another key, or one twice */
        }
    }
    return 1;
}

/* Whether `entry` of the table is the request's model: 1 if so and the tensor is what it takes,
 * -1 if it is that model but the tensor is not (left to Python), 0 if another model; -2 with an
 * exception set for an entry that is not (bytes, str, spec, bytes, tuple of ints, int). Only the
 * entries compared are checked, once per request, not the whole table. */
static int matches(PyObject *entry, const Tensor *t, const unsigned char *name, Py_ssize_t name_len) {
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 6 || !PyBytes_Check(PyTuple_GET_ITEM(entry, 0)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(entry, 1)) || !PyBytes_Check(PyTuple_GET_ITEM(entry, 3)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(entry, 4)) || !PyLong_Check(PyTuple_GET_ITEM(entry, 5))) {
        PyErr_SetString(PyExc_TypeError, "parse: table is a tuple of (bytes, str, spec, bytes, shape, nbytes)");
        return -2;
    }
    PyObject *want_name = PyTuple_GET_ITEM(entry, 0), *dtype = PyTuple_GET_ITEM(entry, 3);
    PyObject *shape = PyTuple_GET_ITEM(entry, 4);
    if (PyBytes_GET_SIZE(want_name) != name_len || memcmp(PyBytes_AS_STRING(want_name), name, (size_t)name_len))
        return 0;
    if (PyBytes_GET_SIZE(dtype) != t->dtype_len || memcmp(PyBytes_AS_STRING(dtype), t->dtype, (size_t)t->dtype_len))
        return -1;
    Py_ssize_t nbytes = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 5));
    if (nbytes == -1 && PyErr_Occurred()) return -2;
    if (PyTuple_GET_SIZE(shape) != t->ndim || nbytes != t->data_len) return -1;
    for (Py_ssize_t d = 0; d < t->ndim; d++) {
        unsigned long long want = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape, d));
        if (want == (unsigned long long)-1 && PyErr_Occurred()) return -2;  /* not an int >= 0 */
        if (want != t->dims[d]) return -1;
    }
    return 1;
}

static PyObject *parse(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "parse(buffer, start, end, table)");
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]), stop = PyLong_AsSsize_t(args[2]);
    if ((start == -1 || stop == -1) && PyErr_Occurred()) return NULL;
    PyObject *table = args[3];
    if (!PyTuple_Check(table)) {
        PyErr_SetString(PyExc_TypeError, "parse: table is a tuple of (bytes, str, spec, bytes, shape, nbytes)");
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = NULL;
    if (start < 0 || stop < start || stop > view.len) {
        PyErr_SetString(PyExc_ValueError, "parse: start and end must lie within the buffer");
        goto done;
    }
    const unsigned char *base = (const unsigned char *)view.buf;
    Cursor c = {base + start, base + stop};
    Py_ssize_t count;
    if (!get_count(&c, 0x80, &count)) goto none;
    int seen = 0, has_deadline = 0, has_priority = 0;
    uint64_t id = 0;
    double deadline = 0.0;
    int64_t priority = 0;
    const unsigned char *name = NULL;
    Py_ssize_t name_len = 0;
    Tensor tensor;
    memset(&tensor, 0, sizeof tensor);
    for (Py_ssize_t i = 0; i < count; i++) {
        const unsigned char *key;
        Py_ssize_t key_len;
        if (!get_str(&c, &key, &key_len)) goto none;
        int k = 0;
        while (k < KEYS && !equals(key, key_len, KEY_NAMES[k])) k++;
        if (k == KEYS || (seen & (1 << k))) goto none;  /* an unknown key, or one twice */
        seen |= 1 << k;
        int negative;
        uint64_t mag;
        const unsigned char *s;
        Py_ssize_t len;
        switch (k) {
            case TYPE:
                if (!get_str(&c, &s, &len) || !equals(s, len, "infer")) goto none;
                break;
            case ID:
                if (!get_int(&c, &negative, &mag) || negative || mag > (uint64_t)INT64_MAX) goto none;
                id = mag;
                break;
            case MODEL:
                if (!get_str(&c, &name, &name_len)) goto none;
                break;
            case TENSOR:
                if (!get_tensor(&c, &tensor)) goto none;
                break;
            case DEADLINE:
                if (is_nil(&c)) break;
                if (get_int(&c, &negative, &mag)) {
                    if (negative || mag == 0 || mag > (uint64_t)MAX_DEADLINE_MS) goto none;
                    deadline = (double)mag;
                } else if (c.p < c.end && *c.p == 0xcb && c.end - c.p >= 9) {
                    uint64_t bits = be(c.p + 1, 8);
                    memcpy(&deadline, &bits, 8);
                    c.p += 9;
                } else if (c.p < c.end && *c.p == 0xca && c.end - c.p >= 5) {
                    uint32_t bits = (uint32_t)be(c.p + 1, 4);
                    float f;
                    memcpy(&f, &bits, 4);
                    deadline = (double)f;
                    c.p += 5;
                } else {
                    goto none;
                }
                if (!(deadline >= MIN_DEADLINE_MS && deadline <= MAX_DEADLINE_MS)) goto none;
                has_deadline = 1;
                break;
            case CAPTURE:
                if (!is_nil(&c)) goto none;  /* a capture_ts: Python checks it against the clock */
                break;
            case PRIORITY:
                if (is_nil(&c)) break;
                if (!get_int(&c, &negative, &mag)) goto none;
                if (negative ? mag > ((uint64_t)1 << 31) : mag >= ((uint64_t)1 << 31)) goto none;
                priority = negative ? -(int64_t)mag : (int64_t)mag;
                has_priority = 1;
                break;
        }
    }
    if (c.p != c.end) goto none;  /* bytes after the map: the decoder refuses the frame */
    if ((seen & ((1 << TYPE) | (1 << ID) | (1 << MODEL) | (1 << TENSOR))) !=
        ((1 << TYPE) | (1 << ID) | (1 << MODEL) | (1 << TENSOR)))
        goto none;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(table); i++) {
        PyObject *entry = PyTuple_GET_ITEM(table, i);
        int m = matches(entry, &tensor, name, name_len);
        if (m == 0) continue;
        if (m == -2) goto done;  /* out stays NULL: the exception */
        if (m < 0) goto none;
        PyObject *deadline_obj = has_deadline ? PyFloat_FromDouble(deadline) : Py_NewRef(Py_None);
        PyObject *priority_obj = has_priority ? PyLong_FromLongLong(priority) : Py_NewRef(Py_None);
        if (deadline_obj && priority_obj)
            out = Py_BuildValue("(KOOnOO)", (unsigned long long)id, PyTuple_GET_ITEM(entry, 1),
                                PyTuple_GET_ITEM(entry, 2), (Py_ssize_t)(tensor.data - base),
                                deadline_obj, priority_obj);
        Py_XDECREF(deadline_obj);
        Py_XDECREF(priority_obj);
        goto done;
    }
none:
    out = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"parse", (PyCFunction)(void (*)(void))parse, METH_FASTCALL,
     "parse(buffer, start, end, table): the common infer request, or None (see the module source)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_infer", NULL, -1, methods};

PyMODINIT_FUNC PyInit__infer(void) { return PyModule_Create(&module); }
