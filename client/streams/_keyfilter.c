/*
 * The key-range judgement of a changelog restore, for one uncompressed record batch.
 *
 * A restore fetches every record of a changelog partition and keeps those whose key hash
 * falls in the task's ranges. In Python each record costs a record object, a murmur3 call
 * and a few comparisons, about 0.2 us: for a task that owns a quarter of the key space,
 * judging the three quarters it skips took longer than writing the quarter it keeps. Here
 * a record that is skipped costs its varints and its hash, and no Python object is made
 * for it.
 *
 * The judgement is client.protocol.keyspace's: key_hash(key) is the first half of
 * murmur3 x64 128 (seed 0) shifted right by one bit, and a null key hashes its offset as
 * 8 big-endian bytes. tests/streams/test_keyfilter.py checks both against mmh3 and against
 * the Python path of client/streams/restore.py, record by record.
 *
 * The record batch format is Kafka's v2 (KIP-98): a 61-byte header, then each record as
 * varints and bytes. A batch this module does not read (compressed, or not v2) is left to
 * the Python path, which reads every format aiokafka reads.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define HEADER_BYTES 61
#define LOG_OVERHEAD 12
#define MAGIC_AT 16
#define ATTRIBUTES_AT 21
#define RECORD_COUNT_AT 57
#define COMPRESSION_MASK 0x07
#define MAX_RANGES 1024

static uint64_t load_le64(const unsigned char *p)
{
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 |
           (uint64_t)p[7] << 56;
}

static uint64_t load_be(const unsigned char *p, int bytes)
{
    uint64_t value = 0;
    for (int i = 0; i < bytes; i++) {
        value = value << 8 | p[i];
    }
    return value;
}

static uint64_t rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return k;
}

/* The first half of murmur3 x64 128 with seed 0. */
static uint64_t murmur3_first_half(const unsigned char *data, Py_ssize_t length)
{
    const uint64_t c1 = 0x87c37b91114253d5ULL;
    const uint64_t c2 = 0x4cf5ad432745937fULL;
    uint64_t h1 = 0;
    uint64_t h2 = 0;
    Py_ssize_t blocks = length / 16;
    for (Py_ssize_t i = 0; i < blocks; i++) {
        uint64_t k1 = load_le64(data + i * 16);
        uint64_t k2 = load_le64(data + i * 16 + 8);
        k1 *= c1;
        k1 = rotl64(k1, 31);
        k1 *= c2;
        h1 ^= k1;
        h1 = rotl64(h1, 27);
        h1 += h2;
        h1 = h1 * 5 + 0x52dce729;
        k2 *= c2;
        k2 = rotl64(k2, 33);
        k2 *= c1;
        h2 ^= k2;
        h2 = rotl64(h2, 31);
        h2 += h1;
        h2 = h2 * 5 + 0x38495ab5;
    }
    const unsigned char *tail = data + blocks * 16;
    Py_ssize_t rest = length & 15;
    uint64_t k1 = 0;
    uint64_t k2 = 0;
    for (Py_ssize_t i = rest - 1; i >= 8; i--) {
        k2 = k2 << 8 | tail[i];
    }
    if (rest > 8) {
        k2 *= c2;
        k2 = rotl64(k2, 33);
        k2 *= c1;
        h2 ^= k2;
    }
    for (Py_ssize_t i = (rest < 8 ? rest : 8) - 1; i >= 0; i--) {
        k1 = k1 << 8 | tail[i];
    }
    if (rest > 0) {
        k1 *= c1;
        k1 = rotl64(k1, 31);
        k1 *= c2;
        h1 ^= k1;
    }
    h1 ^= (uint64_t)length;
    h2 ^= (uint64_t)length;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    return h1 + h2;
}

/* A zigzag varint (Kafka's varint and varlong); 0 when it runs past the end or is too long. */
static int read_varint(const unsigned char **at, const unsigned char *end, int64_t *value)
{
    uint64_t raw = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*at >= end) {
            return 0;
        }
        unsigned char byte = *(*at)++;
        raw |= (uint64_t)(byte & 0x7f) << shift;
        if (!(byte & 0x80)) {
            *value = (int64_t)((raw >> 1) ^ (0 - (raw & 1)));
            return 1;
        }
    }
    return 0;
}

/* A length-prefixed field: its start, or NULL for a null (-1) field; 0 when malformed. */
static int read_field(
    const unsigned char **at, const unsigned char *end, const unsigned char **field,
    Py_ssize_t *length)
{
    int64_t size;
    if (!read_varint(at, end, &size) || size < -1 || size > end - *at) {
        return 0;
    }
    *field = size < 0 ? NULL : *at;
    *length = size < 0 ? 0 : (Py_ssize_t)size;
    *at += *length;
    return 1;
}

static int within(uint64_t hashed, const uint64_t *ranges, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (ranges[2 * i] <= hashed && hashed <= ranges[2 * i + 1]) {
            return 1;
        }
    }
    return 0;
}

static int append_field(PyObject *list, const unsigned char *field, Py_ssize_t length)
{
    PyObject *item = field == NULL ? Py_NewRef(Py_None)
                                   : PyBytes_FromStringAndSize((const char *)field, length);
    if (item == NULL) {
        return -1;
    }
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

static int corrupt(const char *what, long long offset)
{
    PyErr_Format(PyExc_ValueError, "malformed record batch: %s (offset %lld)", what, offset);
    return -1;
}

/* Walks the batch's records; returns the count read, or -1 with an exception set. */
static Py_ssize_t judge_records(
    const unsigned char *batch, Py_ssize_t size, long long position, const uint64_t *ranges,
    Py_ssize_t range_count, PyObject *keys, PyObject *values)
{
    int64_t base_offset = (int64_t)load_be(batch, 8);
    int64_t record_count = (int32_t)load_be(batch + RECORD_COUNT_AT, 4);
    const unsigned char *at = batch + HEADER_BYTES;
    const unsigned char *end = batch + size;
    Py_ssize_t read = 0;
    if (record_count < 0 || base_offset < 0) {
        return corrupt("negative record count or base offset", base_offset);
    }
    for (int64_t index = 0; index < record_count; index++) {
        int64_t record_size;
        int64_t timestamp_delta;
        int64_t offset_delta;
        const unsigned char *key;
        const unsigned char *value;
        Py_ssize_t key_length;
        Py_ssize_t value_length;
        if (!read_varint(&at, end, &record_size) || record_size < 1 || record_size > end - at) {
            return corrupt("record length", base_offset);
        }
        const unsigned char *record_end = at + record_size;
        at++; /* the record's attributes, unused */
        if (!read_varint(&at, record_end, &timestamp_delta) ||
            !read_varint(&at, record_end, &offset_delta) ||
            !read_field(&at, record_end, &key, &key_length) ||
            !read_field(&at, record_end, &value, &value_length)) {
            return corrupt("record fields", base_offset);
        }
        at = record_end; /* headers: not part of a store's state */
        if (offset_delta < 0 || offset_delta > INT64_MAX - base_offset) {
            return corrupt("offset delta", base_offset);
        }
        int64_t offset = base_offset + offset_delta;
        if (offset < position) {
            continue;
        }
        read++;
        uint64_t half;
        if (key == NULL) {
            unsigned char offset_bytes[8];
            for (int i = 0; i < 8; i++) {
                offset_bytes[i] = (unsigned char)((uint64_t)offset >> (56 - 8 * i));
            }
            half = murmur3_first_half(offset_bytes, 8);
        }
        else {
            half = murmur3_first_half(key, key_length);
        }
        if (within(half >> 1, ranges, range_count)) {
            if (append_field(keys, key, key_length) < 0 ||
                append_field(values, value, value_length) < 0) {
                return -1;
            }
        }
    }
    return read;
}

/* The bounds as (start, end) pairs; 0 with an exception set, or when there are too many. */
static int read_ranges(PyObject *bounds, uint64_t *ranges, Py_ssize_t *count)
{
    PyObject *sequence = PySequence_Fast(bounds, "bounds must be a sequence of (start, end)");
    int ok = sequence != NULL;
    if (ok) {
        *count = PySequence_Fast_GET_SIZE(sequence);
        ok = *count <= MAX_RANGES;
    }
    for (Py_ssize_t i = 0; ok && i < *count; i++) {
        unsigned long long start;
        unsigned long long end;
        ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(sequence, i), "KK:bounds", &start, &end);
        ranges[2 * i] = start;
        ranges[2 * i + 1] = end;
    }
    Py_XDECREF(sequence);
    return ok;
}

static PyObject *select_records(PyObject *module, PyObject *args)
{
    Py_buffer batch;
    long long position;
    PyObject *bounds;
    uint64_t ranges[2 * MAX_RANGES];
    Py_ssize_t range_count = 0;
    PyObject *keys = NULL;
    PyObject *values = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*LO:select", &batch, &position, &bounds)) {
        return NULL;
    }
    const unsigned char *data = batch.buf;
    if (!read_ranges(bounds, ranges, &range_count)) {
        /* Past MAX_RANGES no exception is set: the Python path judges such a task. */
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    else if (batch.len < HEADER_BYTES || data[MAGIC_AT] != 2 ||
             (load_be(data + ATTRIBUTES_AT, 2) & COMPRESSION_MASK) != 0) {
        result = Py_NewRef(Py_None);
    }
    else if ((int64_t)(int32_t)load_be(data + 8, 4) + LOG_OVERHEAD != batch.len) {
        corrupt("batch length", (long long)load_be(data, 8));
    }
    else if ((keys = PyList_New(0)) != NULL && (values = PyList_New(0)) != NULL) {
        Py_ssize_t read =
            judge_records(data, batch.len, position, ranges, range_count, keys, values);
        if (read >= 0) {
            result = Py_BuildValue("(nOO)", read, keys, values);
        }
    }
    Py_XDECREF(keys);
    Py_XDECREF(values);
    PyBuffer_Release(&batch);
    return result;
}

static PyObject *key_hash_of(PyObject *module, PyObject *args)
{
    Py_buffer key;
    if (!PyArg_ParseTuple(args, "y*:key_hash", &key)) {
        return NULL;
    }
    uint64_t half = murmur3_first_half(key.buf, key.len);
    PyBuffer_Release(&key);
    return PyLong_FromUnsignedLongLong(half >> 1);
}

static PyMethodDef methods[] = {
    {"select", select_records, METH_VARARGS,
     "select(batch, position, bounds) -> (read, keys, values) | None\n\n"
     "The records of one complete v2 record batch from offset `position` on whose key hash "
     "lies in one of the closed ranges `bounds`; None for a batch this module does not read "
     "(compressed, or another format)."},
    {"key_hash", key_hash_of, METH_VARARGS,
     "key_hash(key) -> int: client.protocol.keyspace.key_hash of a non-null key."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_keyfilter",
    .m_doc = "Key-range judgement of changelog record batches.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__keyfilter(void) { return PyModule_Create(&module_definition); }
