/* Candidate keys straight from named tensors as they came off the wire (offgraph.server.api.wire_keys).
 *
 * candidate_keys(prefix: bytes, n: int, columns: list[tuple[int, int, object, int]]) -> list[bytes]
 *
 * Each column is (kind, k, data, itemsize), k elements per candidate, n * k in all:
 *   kind 0: data is a bytes-like buffer of length-prefixed elements (each a 4-byte little-endian length, then
 *           that many bytes: KServe v2's raw BYTES contents), exactly n * k of them, nothing after;
 *   kind 1: data is a list of n * k bytes objects (TensorFlow Serving's string_val, KServe's bytes_contents);
 *   kind 2: data is a bytes-like buffer of n * k fixed-size elements of itemsize bytes each.
 * Candidate i's key is prefix, then for each column its elements i*k .. i*k+k-1: kinds 0 and 1 as a 4-byte
 * little-endian length and the bytes (so an element sent raw or typed gives the same key), kind 2 as the
 * k * itemsize bytes. One pass over the lengths, then one allocation and copy per key: what the pure-Python
 * twin (wire_keys._candidate_keys_py) does element by element; the tests check both agree bit for bit.
 *
 * Malformed data (a raw BYTES buffer that ends inside a length or an element, or holds more, a buffer of the
 * wrong size, a list of the wrong length or with a non-bytes element) raises ValueError or TypeError: the caller
 * then reads the tensors the slow way, whose errors name the input and the element.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int kind;
    Py_ssize_t k, itemsize;
    PyObject *list;      /* kind 1 */
    Py_buffer view;      /* kinds 0 and 2 */
    int has_view;
    Py_ssize_t *offsets; /* kind 0: the start of each element's length prefix, n * k + 1 of them */
} column_t;

static void release(column_t *cols, Py_ssize_t m) {
    for (Py_ssize_t c = 0; c < m; c++) {
        if (cols[c].has_view) PyBuffer_Release(&cols[c].view);
        PyMem_Free(cols[c].offsets);
    }
    PyMem_Free(cols);
}

static uint32_t read_u32(const unsigned char *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void write_u32(char *p, uint32_t v) {
    p[0] = (char)(v & 0xff);
    p[1] = (char)((v >> 8) & 0xff);
    p[2] = (char)((v >> 16) & 0xff);
    p[3] = (char)((v >> 24) & 0xff);
}

/* Walk a raw BYTES buffer: the offsets of its count elements, or -1 with ValueError set. */
static int walk(column_t *col, Py_ssize_t count) {
    const unsigned char *buf = (const unsigned char *)col->view.buf;
    Py_ssize_t end = col->view.len, at = 0;
    col->offsets = PyMem_New(Py_ssize_t, count + 1);
    if (col->offsets == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t j = 0; j < count; j++) {
        col->offsets[j] = at;
        if (end - at < 4) {
            PyErr_SetString(PyExc_ValueError, "raw BYTES data ends inside an element's length");
            return -1;
        }
        uint32_t len = read_u32(buf + at);
        at += 4;
        if ((Py_ssize_t)len > end - at) {
            PyErr_SetString(PyExc_ValueError, "raw BYTES element runs past the data's end");
            return -1;
        }
        at += (Py_ssize_t)len;
    }
    col->offsets[count] = at;
    if (at != end) {
        PyErr_SetString(PyExc_ValueError, "raw BYTES data holds more than its elements");
        return -1;
    }
    return 0;
}

static PyObject *candidate_keys(PyObject *self, PyObject *args) {
    Py_buffer prefix;
    Py_ssize_t n;
    PyObject *columns;
    if (!PyArg_ParseTuple(args, "y*nO!", &prefix, &n, &PyList_Type, &columns)) return NULL;
    PyObject *out = NULL;
    Py_ssize_t m = PyList_GET_SIZE(columns);
    column_t *cols = PyMem_New(column_t, m > 0 ? m : 1);
    if (cols == NULL) {
        PyBuffer_Release(&prefix);
        return PyErr_NoMemory();
    }
    memset(cols, 0, sizeof(column_t) * (m > 0 ? m : 1));
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "n must be >= 0");
        goto done;
    }
    for (Py_ssize_t c = 0; c < m; c++) {
        column_t *col = &cols[c];
        PyObject *data;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(columns, c), "inOn;a column is (kind, k, data, itemsize)",
                              &col->kind, &col->k, &data, &col->itemsize))
            goto done;
        if (col->k < 1 || (n > 0 && col->k > PY_SSIZE_T_MAX / n)) {
            PyErr_SetString(PyExc_ValueError, "k must be >= 1");
            goto done;
        }
        Py_ssize_t count = n * col->k;
        if (col->kind == 1) {
            if (!PyList_Check(data) || PyList_GET_SIZE(data) != count) {
                PyErr_SetString(PyExc_ValueError, "a kind 1 column is a list of n * k bytes");
                goto done;
            }
            for (Py_ssize_t j = 0; j < count; j++) {
                PyObject *x = PyList_GET_ITEM(data, j);
                if (!PyBytes_CheckExact(x)) {
                    PyErr_SetString(PyExc_TypeError, "a kind 1 column holds bytes only");
                    goto done;
                }
                if ((uint64_t)PyBytes_GET_SIZE(x) > 0xffffffffu) {
                    PyErr_SetString(PyExc_ValueError, "an element longer than 4 GiB");
                    goto done;
                }
            }
            col->list = data;
        } else if (col->kind == 0 || col->kind == 2) {
            if (PyObject_GetBuffer(data, &col->view, PyBUF_SIMPLE) < 0) goto done;
            col->has_view = 1;
            if (col->kind == 0) {
                if (walk(col, count) < 0) goto done;
            } else if (col->itemsize < 1 || col->view.len != count * col->itemsize) {
                PyErr_SetString(PyExc_ValueError, "a kind 2 buffer holds n * k * itemsize bytes");
                goto done;
            }
        } else {
            PyErr_SetString(PyExc_ValueError, "kind is 0 (raw BYTES), 1 (list of bytes) or 2 (fixed size)");
            goto done;
        }
    }
    out = PyList_New(n);
    if (out == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t size = prefix.len;
        for (Py_ssize_t c = 0; c < m; c++) {
            column_t *col = &cols[c];
            Py_ssize_t a = i * col->k, b = a + col->k;
            if (col->kind == 0) {
                size += col->offsets[b] - col->offsets[a];
            } else if (col->kind == 1) {
                for (Py_ssize_t j = a; j < b; j++) size += 4 + PyBytes_GET_SIZE(PyList_GET_ITEM(col->list, j));
            } else {
                size += col->k * col->itemsize;
            }
        }
        PyObject *key = PyBytes_FromStringAndSize(NULL, size);
        if (key == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        char *p = PyBytes_AS_STRING(key);
        memcpy(p, prefix.buf, prefix.len);
        p += prefix.len;
        for (Py_ssize_t c = 0; c < m; c++) {
            column_t *col = &cols[c];
            Py_ssize_t a = i * col->k, b = a + col->k;
            if (col->kind == 0) {
                Py_ssize_t len = col->offsets[b] - col->offsets[a];
                memcpy(p, (const char *)col->view.buf + col->offsets[a], len);
                p += len;
            } else if (col->kind == 1) {
                for (Py_ssize_t j = a; j < b; j++) {
                    PyObject *x = PyList_GET_ITEM(col->list, j);
                    Py_ssize_t len = PyBytes_GET_SIZE(x);
                    write_u32(p, (uint32_t)len);
                    memcpy(p + 4, PyBytes_AS_STRING(x), len);
                    p += 4 + len;
                }
            } else {
                Py_ssize_t len = col->k * col->itemsize;
                memcpy(p, (const char *)col->view.buf + a * col->itemsize, len);
                p += len;
            }
        }
        PyList_SET_ITEM(out, i, key);
    }
done:
    release(cols, m);
    PyBuffer_Release(&prefix);
    return out;
}

/* field_contents(message: bytes-like, field: int, width: int) -> tuple[bytes, int]
 *
 * One repeated field of a serialized protobuf message (TensorFlow's TensorProto: string_val, float_val, double_val)
 * as contents the score path reads like KServe's raw contents, without a Python object per element:
 *   width 0: the field's elements are length-delimited (repeated bytes): each becomes a 4-byte little-endian
 *            length and its bytes (raw BYTES contents);
 *   width 4 or 8: the field holds fixed-size numbers (float, double), packed (wire type 2) or not (wire types 5,
 *            1): their little-endian bytes, concatenated.
 * Returns (contents, element count). Every other field is skipped by its wire type. Malformed data (a varint or a
 * length running past the end, a wire type this field cannot have, a packed run that is not a whole number of
 * elements) raises ValueError: protobuf's own parser accepted the message before, so this never happens to a
 * message gRPC delivered; the check keeps a read past the buffer impossible all the same.
 */
static int read_varint(const unsigned char *p, Py_ssize_t end, Py_ssize_t *at, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*at >= end) return -1;
        unsigned char b = p[(*at)++];
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return 0;
        }
    }
    return -1;
}

static PyObject *field_contents(PyObject *self, PyObject *args) {
    Py_buffer msg;
    unsigned long long want;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "y*Kn", &msg, &want, &width)) return NULL;
    PyObject *result = NULL;
    const unsigned char *p = (const unsigned char *)msg.buf;
    Py_ssize_t end = msg.len, at = 0, size = 0, count = 0;
    if (width != 0 && width != 4 && width != 8) {
        PyErr_SetString(PyExc_ValueError, "width is 0 (length-delimited), 4 or 8");
        goto done;
    }
    /* one pass into a buffer as large as the contents can be, shrunk at the end: an element takes at least 2 bytes
     * on the wire (its tag and length) and 4 + its bytes here, so at most twice the message; numbers no more */
    result = PyBytes_FromStringAndSize(NULL, width ? end : 2 * end);
    if (result == NULL) goto done;
    char *out = PyBytes_AS_STRING(result);
    while (at < end) {
        uint64_t tag, len;
        if (read_varint(p, end, &at, &tag)) goto malformed;
        uint64_t field = tag >> 3;
        int type = (int)(tag & 7);
        Py_ssize_t start = at, n = 0;
        if (type == 0) {
            if (read_varint(p, end, &at, &len)) goto malformed;
        } else if (type == 1 || type == 5) {
            n = type == 1 ? 8 : 4;
            if (end - at < n) goto malformed;
            at += n;
        } else if (type == 2) {
            if (read_varint(p, end, &at, &len) || len > (uint64_t)(end - at)) goto malformed;
            start = at;
            n = (Py_ssize_t)len;
            at += n;
        } else {
            goto malformed; /* groups (3, 4) and 6, 7: not in these messages */
        }
        if (field != want) continue;
        if (width == 0) {
            if (type != 2 || n > 0xffffffffLL) goto malformed;
            uint32_t le = (uint32_t)n;
            out[0] = (char)(le & 0xff);
            out[1] = (char)((le >> 8) & 0xff);
            out[2] = (char)((le >> 16) & 0xff);
            out[3] = (char)((le >> 24) & 0xff);
            memcpy(out + 4, p + start, n);
            out += 4 + n;
            count++;
        } else {
            if (type == 2) {
                if (n % width) goto malformed;
            } else if (!((type == 1 && width == 8) || (type == 5 && width == 4))) {
                goto malformed;
            }
            memcpy(out, p + start, n); /* fixed-size numbers are little-endian on the wire whatever the host */
            out += n;
            count += n / width;
        }
    }
    size = out - PyBytes_AS_STRING(result);
    if (_PyBytes_Resize(&result, size)) goto done; /* it cleared result */
    {
        PyObject *pair = Py_BuildValue("(Nn)", result, count);
        result = pair; /* Py_BuildValue's N took the bytes' reference */
    }
    goto done;
malformed:
    Py_CLEAR(result);
    PyErr_SetString(PyExc_ValueError, "malformed protobuf message");
done:
    PyBuffer_Release(&msg);
    return result;
}

static PyMethodDef methods[] = {
    {"candidate_keys", candidate_keys, METH_VARARGS, "candidate_keys(prefix, n, columns) -> list[bytes]"},
    {"field_contents", field_contents, METH_VARARGS, "field_contents(message, field, width) -> (bytes, int)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_wire_keys", NULL, -1, methods};

PyMODINIT_FUNC PyInit__wire_keys(void) { return PyModule_Create(&module); }
