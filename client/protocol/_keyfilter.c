/*
 * The key-range judgement of Kafka record batches, read in place: the changelog restore of
 * client/streams/restore.py (`select`) and the consumer's fetch (`scan`, client/intake.py).
 *
 * A member that owns a part of a partition's key space fetches every record of the partition
 * (the broker does not filter by key) and keeps those whose key hash falls in its ranges. In
 * Python each record costs a record object, a murmur3 call and a few comparisons: for a member
 * that owns a quarter of the key space, judging the three quarters it skips took longer than
 * handling the quarter it keeps. Here a record that is skipped costs its varints and its hash,
 * and no Python object is made for it; a record kept is built as the very object aiokafka's
 * consumer builds (`ConsumerRecord`, with its headers, timestamp and timestamp type).
 *
 * The judgement is client.protocol.keyspace's: key_hash(key) is the first half of
 * murmur3 x64 128 (seed 0) shifted right by one bit, and a null key hashes its offset as
 * 8 big-endian bytes. tests/streams/test_keyfilter.py and tests/client/test_intake.py check
 * both against mmh3, against the Python paths, and against aiokafka's own reading of the
 * same batches.
 *
 * The record batch format is Kafka's v2 (KIP-98): a 61-byte header, then each record as
 * varints and bytes (compressed: the records after the header, as one compressed block; the
 * caller decompresses them with aiokafka's codecs and passes them apart). A batch this module
 * does not read (another format) is left to the Python path, which reads every format
 * aiokafka reads.
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
#define TIMESTAMP_TYPE_MASK 0x08
#define FIRST_TIMESTAMP_AT 27
#define MAX_TIMESTAMP_AT 35
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

/* The error of a malformed batch: a ValueError, apart from what a deserializer raises. */
static PyObject *MalformedBatch;

static int corrupt(const char *what, long long offset)
{
    PyErr_Format(MalformedBatch, "malformed record batch: %s (offset %lld)", what, offset);
    return 0;
}

/* A closed range of key hashes, and the first offset a record of it is kept from. */
typedef struct {
    uint64_t start;
    uint64_t end;
    int64_t from;
} Bound;

static int within(uint64_t hashed, int64_t offset, const Bound *bounds, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (bounds[i].start <= hashed && hashed <= bounds[i].end && offset >= bounds[i].from) {
            return 1;
        }
    }
    return 0;
}

/* The bounds as (start, end) pairs, or (start, end, from) triples with `triples`; 0 with an
 * exception set, or with none when there are more than MAX_RANGES (the caller judges in
 * Python then). */
static int read_bounds(PyObject *given, Bound *bounds, Py_ssize_t *count, int triples)
{
    PyObject *sequence = PySequence_Fast(given, "bounds must be a sequence of tuples");
    int ok = sequence != NULL;
    if (ok) {
        *count = PySequence_Fast_GET_SIZE(sequence);
        ok = *count <= MAX_RANGES;
    }
    for (Py_ssize_t i = 0; ok && i < *count; i++) {
        unsigned long long start;
        unsigned long long end;
        long long from = 0;
        PyObject *item = PySequence_Fast_GET_ITEM(sequence, i);
        ok = triples ? PyArg_ParseTuple(item, "KKL:bounds", &start, &end, &from)
                     : PyArg_ParseTuple(item, "KK:bounds", &start, &end);
        bounds[i].start = start;
        bounds[i].end = end;
        bounds[i].from = from;
    }
    Py_XDECREF(sequence);
    return ok;
}

/* One record's fields, read in place. */
typedef struct {
    int64_t offset;
    int64_t timestamp_delta;
    const unsigned char *key;
    Py_ssize_t key_length;
    const unsigned char *value;
    Py_ssize_t value_length;
    const unsigned char *headers; /* the header count, then the headers */
    const unsigned char *end;
} Record;

/* Reads the record at *at and moves past it; 0 with an exception set when malformed. */
static int next_record(
    const unsigned char **at, const unsigned char *end, int64_t base_offset, Record *record)
{
    int64_t record_size;
    int64_t offset_delta;
    if (!read_varint(at, end, &record_size) || record_size < 1 || record_size > end - *at) {
        return corrupt("record length", base_offset);
    }
    record->end = *at + record_size;
    (*at)++; /* the record's attributes, unused */
    if (!read_varint(at, record->end, &record->timestamp_delta) ||
        !read_varint(at, record->end, &offset_delta) ||
        !read_field(at, record->end, &record->key, &record->key_length) ||
        !read_field(at, record->end, &record->value, &record->value_length)) {
        return corrupt("record fields", base_offset);
    }
    if (offset_delta < 0 || offset_delta > INT64_MAX - base_offset) {
        return corrupt("offset delta", base_offset);
    }
    record->offset = base_offset + offset_delta;
    record->headers = *at;
    *at = record->end;
    return 1;
}

static uint64_t record_hash(const Record *record)
{
    if (record->key == NULL) {
        unsigned char offset_bytes[8];
        for (int i = 0; i < 8; i++) {
            offset_bytes[i] = (unsigned char)((uint64_t)record->offset >> (56 - 8 * i));
        }
        return murmur3_first_half(offset_bytes, 8) >> 1;
    }
    return murmur3_first_half(record->key, record->key_length) >> 1;
}

static PyObject *field_object(const unsigned char *field, Py_ssize_t length)
{
    return field == NULL ? Py_NewRef(Py_None)
                         : PyBytes_FromStringAndSize((const char *)field, length);
}

static int append_field(PyObject *list, const unsigned char *field, Py_ssize_t length)
{
    PyObject *item = field_object(field, length);
    if (item == NULL) {
        return -1;
    }
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* The batch's v2 header checks; 1 when the records can be read, 0 for a batch this module
 * does not read (None to the caller), -1 with an exception set. */
static int readable(const Py_buffer *batch, int compressed_apart)
{
    const unsigned char *data = batch->buf;
    if (batch->len < HEADER_BYTES || data[MAGIC_AT] != 2) {
        return 0;
    }
    if ((load_be(data + ATTRIBUTES_AT, 2) & COMPRESSION_MASK) != 0 && !compressed_apart) {
        return 0;
    }
    if ((int64_t)(int32_t)load_be(data + 8, 4) + LOG_OVERHEAD != batch->len) {
        return corrupt("batch length", (long long)load_be(data, 8)) - 1;
    }
    int64_t record_count = (int32_t)load_be(data + RECORD_COUNT_AT, 4);
    if (record_count < 0 || (int64_t)load_be(data, 8) < 0) {
        return corrupt("negative record count or base offset", (long long)load_be(data, 8)) - 1;
    }
    return 1;
}

/* Walks the batch's records for a restore; returns the count read, or -1 with an exception. */
static Py_ssize_t judge_records(
    const unsigned char *batch, Py_ssize_t size, long long position, const Bound *bounds,
    Py_ssize_t bound_count, PyObject *keys, PyObject *values)
{
    int64_t base_offset = (int64_t)load_be(batch, 8);
    int64_t record_count = (int32_t)load_be(batch + RECORD_COUNT_AT, 4);
    const unsigned char *at = batch + HEADER_BYTES;
    const unsigned char *end = batch + size;
    Py_ssize_t read = 0;
    Record record;
    for (int64_t index = 0; index < record_count; index++) {
        if (!next_record(&at, end, base_offset, &record)) {
            return -1;
        }
        if (record.offset < position) {
            continue;
        }
        read++;
        if (within(record_hash(&record), record.offset, bounds, bound_count)) {
            if (append_field(keys, record.key, record.key_length) < 0 ||
                append_field(values, record.value, record.value_length) < 0) {
                return -1;
            }
        }
    }
    return read;
}

static PyObject *select_records(PyObject *module, PyObject *args)
{
    Py_buffer batch;
    long long position;
    PyObject *given;
    Bound bounds[MAX_RANGES];
    Py_ssize_t bound_count = 0;
    PyObject *keys = NULL;
    PyObject *values = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*LO:select", &batch, &position, &given)) {
        return NULL;
    }
    int state = 0;
    if (!read_bounds(given, bounds, &bound_count, 0)) {
        /* Past MAX_RANGES no exception is set: the Python path judges such a task. */
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    else if ((state = readable(&batch, 0)) == 0) {
        result = Py_NewRef(Py_None);
    }
    else if (state > 0 && (keys = PyList_New(0)) != NULL && (values = PyList_New(0)) != NULL) {
        Py_ssize_t read =
            judge_records(batch.buf, batch.len, position, bounds, bound_count, keys, values);
        if (read >= 0) {
            result = Py_BuildValue("(nOO)", read, keys, values);
        }
    }
    Py_XDECREF(keys);
    Py_XDECREF(values);
    PyBuffer_Release(&batch);
    return result;
}

/* What a consumer's scan builds its records with: `fields` the class's field names when a
 * record is built by setting them on a new instance (what a plain dataclass's __init__ does,
 * without its Python frame), None to call `make`. */
typedef struct {
    PyObject *make;
    PyObject *fields;
    PyObject *topic;
    PyObject *partition;
    PyObject *timestamp_type;
    PyObject *key_decode;
    PyObject *value_decode;
    PyObject *no_arguments;
    int64_t base_offset;
} Builder;

/* A record's headers as aiokafka reads them: a tuple of (str key, bytes or None value). */
static PyObject *read_headers(const Record *record, int64_t base_offset)
{
    const unsigned char *at = record->headers;
    int64_t count;
    if (!read_varint(&at, record->end, &count) || count < 0 || count > record->end - at) {
        corrupt("header count", base_offset);
        return NULL;
    }
    PyObject *headers = PyTuple_New((Py_ssize_t)count);
    for (Py_ssize_t i = 0; headers != NULL && i < (Py_ssize_t)count; i++) {
        const unsigned char *name;
        const unsigned char *value;
        Py_ssize_t name_length;
        Py_ssize_t value_length;
        PyObject *pair = NULL;
        if (!read_field(&at, record->end, &name, &name_length) || name == NULL ||
            !read_field(&at, record->end, &value, &value_length)) {
            corrupt("record headers", base_offset);
        }
        else {
            PyObject *key = PyUnicode_DecodeUTF8((const char *)name, name_length, "strict");
            PyObject *data = key == NULL ? NULL : field_object(value, value_length);
            if (data != NULL && (pair = PyTuple_Pack(2, key, data)) != NULL) {
                /* A str and bytes or None: the pair can never be in a reference cycle. */
                PyObject_GC_UnTrack(pair);
            }
            Py_XDECREF(key);
            Py_XDECREF(data);
        }
        if (pair == NULL) {
            Py_CLEAR(headers);
        }
        else {
            PyTuple_SET_ITEM(headers, i, pair);
        }
    }
    if (headers != NULL && at != record->end) {
        corrupt("bytes after the headers", base_offset);
        Py_CLEAR(headers);
    }
    if (headers != NULL) {
        /* Immutable and holding only untracked pairs: what the collector would find itself,
         * had it visited the tuple first. */
        PyObject_GC_UnTrack(headers);
    }
    return headers;
}

/* A field as user code gets it: the bytes, deserialized when a deserializer is given (a null
 * field stays None, never passed to it). */
static PyObject *decoded(PyObject *decode, const unsigned char *field, Py_ssize_t length)
{
    PyObject *raw = field_object(field, length);
    if (raw == NULL || field == NULL || decode == Py_None) {
        return raw;
    }
    PyObject *result = PyObject_CallOneArg(decode, raw);
    Py_DECREF(raw);
    return result;
}

/* The record built of `record`, whose offset as an int is `offset` (borrowed). */
static PyObject *build_record(
    const Builder *builder, const Record *record, PyObject *offset, int64_t timestamp)
{
    static const int owned[] = {3, 5, 6, 8, 9, 10};
    PyObject *argv[11] = {
        builder->topic, builder->partition, offset, NULL, builder->timestamp_type, NULL, NULL,
        Py_None,        NULL,               NULL,   NULL,
    };
    PyObject *result = NULL;
    /* One at a time, in this order: the deserializers run key first, and nothing is called
     * with an exception pending. */
    int complete = (argv[3] = PyLong_FromLongLong(timestamp)) != NULL &&
                   (argv[5] = decoded(builder->key_decode, record->key, record->key_length)) !=
                       NULL &&
                   (argv[6] = decoded(
                        builder->value_decode, record->value, record->value_length)) != NULL &&
                   (argv[8] = PyLong_FromSsize_t(
                        record->key == NULL ? -1 : record->key_length)) != NULL &&
                   (argv[9] = PyLong_FromSsize_t(
                        record->value == NULL ? -1 : record->value_length)) != NULL &&
                   (argv[10] = read_headers(record, builder->base_offset)) != NULL;
    if (complete && builder->fields == Py_None) {
        result = PyObject_Vectorcall(builder->make, argv, 11, NULL);
    }
    else if (complete) {
        PyTypeObject *type = (PyTypeObject *)builder->make;
        result = type->tp_new(type, builder->no_arguments, NULL);
        for (Py_ssize_t i = 0; result != NULL && i < 11; i++) {
            if (PyObject_GenericSetAttr(
                    result, PyTuple_GET_ITEM(builder->fields, i), argv[i]) < 0) {
                Py_CLEAR(result);
            }
        }
        if (result != NULL && !PyObject_GC_IsTracked(argv[5]) &&
            !PyObject_GC_IsTracked(argv[6])) {
            /* Every field is atomic (ints, str, bytes, None, the untracked headers), so the
             * record is in no reference cycle and the cyclic collector need not walk it: a
             * fetch buffers tens of thousands of records, and walking them again and again
             * was most of a whole-range member's CPU. A key or value a deserializer made a
             * container keeps the record tracked; docs/architecture.md ("The raw filter")
             * says what this means for an attribute user code sets on a record. */
            PyObject_GC_UnTrack(result);
        }
    }
    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) {
        Py_XDECREF(argv[owned[i]]);
    }
    return result;
}

static int append_owned(PyObject *list, PyObject *item)
{
    if (item == NULL) {
        return -1;
    }
    int failed = PyList_Append(list, item);
    Py_DECREF(item);
    return failed;
}

/* Walks the records of a consumer's batch; 0 when done, -1 with an exception set. */
static int scan_batch(
    const unsigned char *header, const unsigned char *at, const unsigned char *end,
    long long position, const Bound *bounds, Py_ssize_t bound_count, Builder *builder,
    PyObject *records, PyObject *offsets, PyObject *hashes)
{
    int64_t base_offset = builder->base_offset;
    int64_t record_count = (int32_t)load_be(header + RECORD_COUNT_AT, 4);
    int log_append_time = (load_be(header + ATTRIBUTES_AT, 2) & TIMESTAMP_TYPE_MASK) != 0;
    int64_t first_timestamp = (int64_t)load_be(header + FIRST_TIMESTAMP_AT, 8);
    int64_t max_timestamp = (int64_t)load_be(header + MAX_TIMESTAMP_AT, 8);
    Record record;
    for (int64_t index = 0; index < record_count; index++) {
        if (!next_record(&at, end, base_offset, &record)) {
            return -1;
        }
        if (record.offset < position) {
            continue;
        }
        uint64_t hashed = record_hash(&record);
        if (!within(hashed, record.offset, bounds, bound_count)) {
            continue;
        }
        int64_t timestamp =
            log_append_time ? max_timestamp : first_timestamp + record.timestamp_delta;
        /* One int for the offset, in the record and in `offsets` alike. */
        PyObject *offset = PyLong_FromLongLong(record.offset);
        if (offset == NULL) {
            return -1;
        }
        int failed = append_owned(records, build_record(builder, &record, offset, timestamp)) <
                         0 ||
                     PyList_Append(offsets, offset) < 0 ||
                     append_owned(hashes, PyLong_FromUnsignedLongLong(hashed)) < 0;
        Py_DECREF(offset);
        if (failed) {
            return -1;
        }
    }
    if (at != end) {
        return corrupt("bytes after the last record", base_offset) - 1;
    }
    return 0;
}

static PyObject *scan_records(PyObject *module, PyObject *args)
{
    Py_buffer batch;
    Py_buffer body = {0};
    PyObject *body_object;
    long long position;
    PyObject *given;
    Builder builder;
    Bound bounds[MAX_RANGES];
    Py_ssize_t bound_count = 0;
    PyObject *records = NULL;
    PyObject *offsets = NULL;
    PyObject *hashes = NULL;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(
            args, "y*OLOOOOOOO:scan", &batch, &body_object, &position, &given, &builder.make,
            &builder.fields, &builder.topic, &builder.partition, &builder.key_decode,
            &builder.value_decode)) {
        return NULL;
    }
    if (builder.fields != Py_None &&
        (!PyType_Check(builder.make) || !PyTuple_Check(builder.fields) ||
         PyTuple_GET_SIZE(builder.fields) != 11)) {
        PyBuffer_Release(&batch);
        PyErr_SetString(PyExc_TypeError, "fields must be 11 names of the class make");
        return NULL;
    }
    builder.no_arguments = PyTuple_New(0);
    if (builder.no_arguments == NULL) {
        PyBuffer_Release(&batch);
        return NULL;
    }
    const unsigned char *header = batch.buf;
    int apart = body_object != Py_None;
    int state = 0;
    if (apart && PyObject_GetBuffer(body_object, &body, PyBUF_SIMPLE) < 0) {
        apart = 0;
    }
    else if (!read_bounds(given, bounds, &bound_count, 1)) {
        result = PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    }
    else if ((state = readable(&batch, apart)) == 0) {
        result = Py_NewRef(Py_None);
    }
    else if (state > 0 && (records = PyList_New(0)) != NULL &&
             (offsets = PyList_New(0)) != NULL && (hashes = PyList_New(0)) != NULL) {
        builder.base_offset = (int64_t)load_be(header, 8);
        builder.timestamp_type = PyLong_FromLong(
            (load_be(header + ATTRIBUTES_AT, 2) & TIMESTAMP_TYPE_MASK) != 0);
        const unsigned char *at = apart ? (const unsigned char *)body.buf : header + HEADER_BYTES;
        const unsigned char *end = apart ? at + body.len : header + batch.len;
        if (builder.timestamp_type != NULL &&
            scan_batch(
                header, at, end, position, bounds, bound_count, &builder, records, offsets,
                hashes) == 0) {
            result = PyTuple_Pack(3, records, offsets, hashes);
        }
        Py_XDECREF(builder.timestamp_type);
    }
    Py_XDECREF(records);
    Py_XDECREF(offsets);
    Py_XDECREF(hashes);
    if (apart) {
        PyBuffer_Release(&body);
    }
    Py_DECREF(builder.no_arguments);
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
    {"scan", scan_records, METH_VARARGS,
     "scan(batch, body, position, bounds, make, fields, topic, partition, key_decode,\n"
     "     value_decode)\n"
     "    -> (records, offsets, hashes) | None\n\n"
     "The records of one complete v2 record batch from offset `position` on whose key hash h "
     "and offset o lie in one of `bounds`, (start, end, from) with start <= h <= end and "
     "o >= from, each built as make(topic, partition, offset, timestamp, timestamp_type, "
     "key, value, None, key_size, value_size, headers), or, with `fields` its 11 field "
     "names, as a new instance of the class `make` with them set; `body` holds the records of a "
     "compressed batch decompressed (None: they follow the header). None for a batch this "
     "module does not read."},
    {"key_hash", key_hash_of, METH_VARARGS,
     "key_hash(key) -> int: client.protocol.keyspace.key_hash of a non-null key."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_keyfilter",
    .m_doc = "Key-range judgement of Kafka record batches, read in place.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__keyfilter(void)
{
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL) {
        return NULL;
    }
    MalformedBatch = PyErr_NewException(
        "client.protocol._keyfilter.MalformedBatch", PyExc_ValueError, NULL);
    if (MalformedBatch == NULL ||
        PyModule_AddObjectRef(module, "MalformedBatch", MalformedBatch) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
