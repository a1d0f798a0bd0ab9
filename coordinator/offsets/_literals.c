/*
 * A batch's write statement's nine array literals, in C: what
 * coordinator/offsets/repository.py's _write_parameters formats in Python.
 *
 * A group commit writes every partition it changed back in one statement whose parameters are
 * Postgres array literals in text (the repository says why). Formatting them in Python (a few
 * joins and an f-string per partition) cost about as much as the merge itself. Here it is one
 * pass over the states into one buffer per column.
 *
 * The text is byte for byte the Python path's (tests/offsets/test_literals.py checks both on
 * random batches): keys and metadata as quoted array elements ("..." with \ and " escaped,
 * NULL for a missing metadata), the IC ranges as Postgres writes an int8multirange
 * ({[a,b),[c,d)}, half-open), the watermark pieces as one bigint array per column. Each
 * state's text (stable|ranges|starts|ends|offsets) is also returned: the reading statement
 * gives a row's state in that form, so the batcher recognises a row it wrote by it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    char *bytes;
    Py_ssize_t length, capacity;
} Buffer;

static int reserve(Buffer *buffer, Py_ssize_t more)
{
    if (buffer->length + more <= buffer->capacity) {
        return 0;
    }
    Py_ssize_t capacity = buffer->capacity ? buffer->capacity : 256;
    while (capacity < buffer->length + more) {
        capacity *= 2;
    }
    char *grown = PyMem_Realloc(buffer->bytes, (size_t)capacity);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    buffer->bytes = grown;
    buffer->capacity = capacity;
    return 0;
}

static int append(Buffer *buffer, const char *bytes, Py_ssize_t length)
{
    if (reserve(buffer, length) < 0) {
        return -1;
    }
    memcpy(buffer->bytes + buffer->length, bytes, (size_t)length);
    buffer->length += length;
    return 0;
}

static int append_char(Buffer *buffer, char c) { return append(buffer, &c, 1); }

static int append_unsigned(Buffer *buffer, unsigned long long value)
{
    char digits[24];
    int length = snprintf(digits, sizeof digits, "%llu", value);
    return append(buffer, digits, length);
}

/* An int the stored state holds: within int64 and not negative. */
static int append_offset(Buffer *buffer, PyObject *value)
{
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (number < 0) {
        PyErr_SetString(PyExc_ValueError, "a stored offset or partition is negative");
        return -1;
    }
    return append_unsigned(buffer, (unsigned long long)number);
}

/* `text` as a quoted array element: "...", with \ and " escaped; NULL for None. */
static int append_element(Buffer *buffer, PyObject *text)
{
    if (text == Py_None) {
        return append(buffer, "NULL", 4);
    }
    Py_ssize_t size;
    const char *bytes = PyUnicode_AsUTF8AndSize(text, &size);
    if (bytes == NULL) {
        return -1;
    }
    if (reserve(buffer, 2 * size + 2) < 0) {
        return -1;
    }
    char *out = buffer->bytes + buffer->length;
    *out++ = '"';
    for (Py_ssize_t i = 0; i < size; i++) {
        if (bytes[i] == '\\' || bytes[i] == '"') {
            *out++ = '\\';
        }
        *out++ = bytes[i];
    }
    *out++ = '"';
    buffer->length = out - buffer->bytes;
    return 0;
}

/* Column `field` of the pieces (tuples of three ints) as a bigint array: {a,b}. */
static int append_piece_column(Buffer *buffer, PyObject *pieces, int field)
{
    if (append_char(buffer, '{') < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(pieces); i++) {
        PyObject *piece = PyTuple_GET_ITEM(pieces, i);
        if (!PyTuple_Check(piece) || PyTuple_GET_SIZE(piece) != 3) {
            PyErr_SetString(PyExc_TypeError, "a watermark piece is a tuple of three ints");
            return -1;
        }
        if ((i && append_char(buffer, ',') < 0) ||
            append_offset(buffer, PyTuple_GET_ITEM(piece, field)) < 0) {
            return -1;
        }
    }
    return append_char(buffer, '}');
}

/* The IC ranges (tuples of two ints, closed) as Postgres writes an int8multirange. */
static int append_ranges(Buffer *buffer, PyObject *ranges)
{
    if (append_char(buffer, '{') < 0) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(ranges); i++) {
        PyObject *range = PyTuple_GET_ITEM(ranges, i);
        if (!PyTuple_Check(range) || PyTuple_GET_SIZE(range) != 2) {
            PyErr_SetString(PyExc_TypeError, "an offset range is a tuple of two ints");
            return -1;
        }
        long long start = PyLong_AsLongLong(PyTuple_GET_ITEM(range, 0));
        long long end = PyLong_AsLongLong(PyTuple_GET_ITEM(range, 1));
        if ((start == -1 || end == -1) && PyErr_Occurred()) {
            return -1;
        }
        if (start < 0 || end < start) {
            PyErr_SetString(PyExc_ValueError, "a stored offset range is malformed");
            return -1;
        }
        if ((i && append_char(buffer, ',') < 0) || append_char(buffer, '[') < 0 ||
            append_unsigned(buffer, (unsigned long long)start) < 0 ||
            append_char(buffer, ',') < 0 ||
            /* half-open: end + 1, at most 2**63, which fits unsigned */
            append_unsigned(buffer, (unsigned long long)end + 1) < 0 ||
            append_char(buffer, ')') < 0) {
            return -1;
        }
    }
    return append_char(buffer, '}');
}

enum { GROUPS, TOPICS, PARTITIONS, STABLE, RANGES, STARTS, ENDS, OFFSETS, METADATA, COLUMNS };

static PyObject *stable_offset_name, *ranges_name, *pieces_name, *metadata_name;

static PyObject *write_literals(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
        PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "write_literals(keys, states) takes two lists of one length");
        return NULL;
    }
    PyObject *keys = args[0], *states = args[1];
    Py_ssize_t count = PyList_GET_SIZE(keys);
    Buffer columns[COLUMNS];
    memset(columns, 0, sizeof columns);
    Buffer state_text = {0};
    PyObject *state_texts = PyList_New(count);
    PyObject *result = NULL;
    if (state_texts == NULL) {
        return NULL;
    }
    for (int column = 0; column < COLUMNS; column++) {
        if (append_char(&columns[column], '{') < 0) {
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *key = PyList_GET_ITEM(keys, i), *state = PyList_GET_ITEM(states, i);
        if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 3) {
            PyErr_SetString(PyExc_TypeError, "a key is (group, topic, partition)");
            goto done;
        }
        if (i) {
            for (int column = 0; column < COLUMNS; column++) {
                if (append_char(&columns[column], ',') < 0) {
                    goto done;
                }
            }
        }
        if (append_element(&columns[GROUPS], PyTuple_GET_ITEM(key, 0)) < 0 ||
            append_element(&columns[TOPICS], PyTuple_GET_ITEM(key, 1)) < 0 ||
            append_offset(&columns[PARTITIONS], PyTuple_GET_ITEM(key, 2)) < 0) {
            goto done;
        }
        PyObject *stable = PyObject_GetAttr(state, stable_offset_name);
        PyObject *ranges = PyObject_GetAttr(state, ranges_name);
        PyObject *pieces = PyObject_GetAttr(state, pieces_name);
        PyObject *metadata = PyObject_GetAttr(state, metadata_name);
        int failed = stable == NULL || ranges == NULL || pieces == NULL || metadata == NULL;
        if (!failed && (!PyTuple_Check(ranges) || !PyTuple_Check(pieces))) {
            PyErr_SetString(PyExc_TypeError, "a state's ranges and pieces are tuples");
            failed = 1;
        }
        if (!failed) {
            /* The state's text, part by part; each part goes to its column too. */
            Py_ssize_t bounds[6];
            state_text.length = 0;
            bounds[0] = 0;
            failed = append_offset(&state_text, stable) < 0;
            for (int part = 1; part < 5 && !failed; part++) {
                bounds[part] = state_text.length;
                failed = append_char(&state_text, '|') < 0 ||
                         (part == 1 ? append_ranges(&state_text, ranges)
                                    : append_piece_column(&state_text, pieces, part - 2)) < 0;
            }
            bounds[5] = state_text.length;
            for (int part = 0; part < 5 && !failed; part++) {
                /* Past the '|' that opens every part but the first. */
                Py_ssize_t from = bounds[part] + (part ? 1 : 0);
                Buffer *column = &columns[STABLE + part];
                failed = (part && append_char(column, '"') < 0) ||
                         append(column, state_text.bytes + from, bounds[part + 1] - from) < 0 ||
                         (part && append_char(column, '"') < 0);
            }
            failed = failed || append_element(&columns[METADATA], metadata) < 0;
        }
        if (!failed) {
            PyObject *text = PyUnicode_DecodeASCII(state_text.bytes, state_text.length, NULL);
            if (text == NULL) {
                failed = 1;
            } else {
                PyList_SET_ITEM(state_texts, i, text);
            }
        }
        Py_XDECREF(stable);
        Py_XDECREF(ranges);
        Py_XDECREF(pieces);
        Py_XDECREF(metadata);
        if (failed) {
            goto done;
        }
    }
    PyObject *literals = PyList_New(COLUMNS);
    if (literals == NULL) {
        goto done;
    }
    for (int column = 0; column < COLUMNS; column++) {
        PyObject *text = NULL;
        if (append_char(&columns[column], '}') == 0) {
            text = PyUnicode_DecodeUTF8(columns[column].bytes, columns[column].length, NULL);
        }
        if (text == NULL) {
            Py_DECREF(literals);
            goto done;
        }
        PyList_SET_ITEM(literals, column, text);
    }
    result = PyTuple_Pack(2, literals, state_texts);
    Py_DECREF(literals);
done:
    for (int column = 0; column < COLUMNS; column++) {
        PyMem_Free(columns[column].bytes);
    }
    PyMem_Free(state_text.bytes);
    Py_DECREF(state_texts);
    return result;
}

static PyMethodDef methods[] = {
    {"write_literals", (PyCFunction)(void (*)(void))write_literals, METH_FASTCALL,
     "write_literals(keys, states) -> (literals, state_texts)\n\n"
     "The write statement's nine array literals for the (group, topic, partition) keys and "
     "their CommittedOffsets states, in order, and each state as the text the reading "
     "statement gives for it (stable|ranges|starts|ends|offsets)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_literals",
    .m_doc = "A commit batch's write literals, formatted in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__literals(void)
{
    stable_offset_name = PyUnicode_InternFromString("stable_offset");
    ranges_name = PyUnicode_InternFromString("ranges");
    pieces_name = PyUnicode_InternFromString("pieces");
    metadata_name = PyUnicode_InternFromString("metadata");
    if (stable_offset_name == NULL || ranges_name == NULL || pieces_name == NULL ||
        metadata_name == NULL) {
        return NULL;
    }
    return PyModule_Create(&module_definition);
}
