/*
 * One partition entry of an individual commit merged into a small stored state, in C: the
 * common case of coordinator/core/offsets.py's apply_individual_commit.
 *
 * A member commits a few partitions at a time, each with one watermark per slice and a few
 * IC ranges, onto a state that holds a few of each. In Python that merge (clip, sort,
 * coalesce, raise the watermarks, settle the stable offset, compare with what was stored)
 * cost about 5 microseconds per partition, a fifth of the coordinator's CPU per commit. Here
 * it costs a tenth of that, with no Python object made but the result.
 *
 * The rules are the Python module's, which stays the reference: this module declines (returns
 * None) whatever it does not decide itself, and the caller then runs the Python path, which
 * decides it (or raises its error):
 *   - more than MOST stored plus committed ranges, or pieces (large states: the Python path
 *     touches only the stretch a commit overlaps);
 *   - a value that is not an int within int64, a malformed range or watermark (the Python
 *     path raises the error that names it);
 *   - a result over a limit (max_ic_ranges, max_watermark_pieces: the Python path decides
 *     which part to refuse).
 * tests/core/test_offsets.py runs the model test and the examples on both paths and checks
 * them equal on random states and commits.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define MOST 64

typedef struct {
    int64_t start, end;
} Span;

typedef struct {
    int64_t start, end, offset;
} Piece;

typedef enum { DECLINED = 0, READ = 1 } Reading;

static Reading read_int(PyObject *value, int64_t *out)
{
    /* Exactly int: a bool is an int subclass, and the Python path rejects nothing the
     * schema lets through, so anything unusual is left to it. */
    if (!PyLong_CheckExact(value)) {
        return DECLINED;
    }
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (overflow || (number == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return DECLINED;
    }
    *out = (int64_t)number;
    return READ;
}

/* The tuples (or lists) of `width` ints in `sequence`, appended to `out` at `*count`. */
static Reading read_tuples(PyObject *sequence, int width, int64_t *out, Py_ssize_t *count,
                           Py_ssize_t room)
{
    PyObject **items;
    Py_ssize_t length;
    if (PyTuple_CheckExact(sequence)) {
        items = &PyTuple_GET_ITEM(sequence, 0);
        length = PyTuple_GET_SIZE(sequence);
    } else if (PyList_CheckExact(sequence)) {
        items = PySequence_Fast_ITEMS(sequence);
        length = PyList_GET_SIZE(sequence);
    } else {
        return DECLINED;
    }
    if (*count + length > room) {
        return DECLINED;
    }
    for (Py_ssize_t i = 0; i < length; i++) {
        PyObject *item = items[i];
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != width) {
            return DECLINED;
        }
        for (int field = 0; field < width; field++) {
            if (read_int(PyTuple_GET_ITEM(item, field), &out[(*count + i) * width + field]) !=
                READ) {
                return DECLINED;
            }
        }
    }
    *count += length;
    return READ;
}

static void sort_spans(Span *spans, Py_ssize_t count)
{
    for (Py_ssize_t i = 1; i < count; i++) {
        Span moving = spans[i];
        Py_ssize_t j = i;
        while (j > 0 && (spans[j - 1].start > moving.start ||
                         (spans[j - 1].start == moving.start && spans[j - 1].end > moving.end))) {
            spans[j] = spans[j - 1];
            j--;
        }
        spans[j] = moving;
    }
}

static void sort_bounds(uint64_t *bounds, Py_ssize_t count)
{
    for (Py_ssize_t i = 1; i < count; i++) {
        uint64_t moving = bounds[i];
        Py_ssize_t j = i;
        while (j > 0 && bounds[j - 1] > moving) {
            bounds[j] = bounds[j - 1];
            j--;
        }
        bounds[j] = moving;
    }
}

/* Overlapping and adjacent spans of sorted `spans` merged, in place; the new count. */
static Py_ssize_t coalesce(Span *spans, Py_ssize_t count)
{
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 1; i < count; i++) {
        /* start - 1 rather than end + 1: an end may be INT64_MAX, a start is never below 0. */
        if (spans[i].start - 1 <= spans[kept].end) {
            if (spans[i].end > spans[kept].end) {
                spans[kept].end = spans[i].end;
            }
        } else {
            spans[++kept] = spans[i];
        }
    }
    return count ? kept + 1 : 0;
}

/* The pointwise maximum of `pieces` as sorted pieces, touching neighbours of one offset
 * merged: the canonical form every stored state has. */
static Py_ssize_t upper_envelope(const Piece *pieces, Py_ssize_t count, Piece *out)
{
    uint64_t bounds[4 * MOST];
    Py_ssize_t bound_count = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        bounds[bound_count++] = (uint64_t)pieces[i].start;
        bounds[bound_count++] = (uint64_t)pieces[i].end + 1; /* at most 2**63: fits */
    }
    sort_bounds(bounds, bound_count);
    Py_ssize_t made = 0;
    for (Py_ssize_t b = 0; b + 1 < bound_count; b++) {
        uint64_t left = bounds[b], right = bounds[b + 1];
        if (left == right) {
            continue;
        }
        /* Every bound is some piece's start or end + 1, so a piece covers all of [left,
         * right) or none of it. */
        int64_t level = -1;
        for (Py_ssize_t i = 0; i < count; i++) {
            if ((uint64_t)pieces[i].start <= left && (uint64_t)pieces[i].end + 1 >= right &&
                pieces[i].offset > level) {
                level = pieces[i].offset;
            }
        }
        if (level < 0) {
            continue;
        }
        if (made && (uint64_t)out[made - 1].end + 1 == left && out[made - 1].offset == level) {
            out[made - 1].end = (int64_t)(right - 1);
        } else {
            out[made].start = (int64_t)left;
            out[made].end = (int64_t)(right - 1);
            out[made].offset = level;
            made++;
        }
    }
    return made;
}

static PyObject *spans_tuple(const Span *spans, Py_ssize_t count)
{
    PyObject *result = PyTuple_New(count);
    if (result == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = Py_BuildValue("(LL)", (long long)spans[i].start, (long long)spans[i].end);
        if (item == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyTuple_SET_ITEM(result, i, item);
    }
    return result;
}

static PyObject *pieces_tuple(const Piece *pieces, Py_ssize_t count)
{
    PyObject *result = PyTuple_New(count);
    if (result == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = Py_BuildValue("(LLL)", (long long)pieces[i].start,
                                       (long long)pieces[i].end, (long long)pieces[i].offset);
        if (item == NULL) {
            Py_DECREF(result);
            return NULL;
        }
        PyTuple_SET_ITEM(result, i, item);
    }
    return result;
}

static int same_spans(const Span *a, const Span *b, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (a[i].start != b[i].start || a[i].end != b[i].end) {
            return 0;
        }
    }
    return 1;
}

static int same_pieces(const Piece *a, const Piece *b, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        if (a[i].start != b[i].start || a[i].end != b[i].end || a[i].offset != b[i].offset) {
            return 0;
        }
    }
    return 1;
}

static PyObject *apply(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError,
                        "apply(stable_offset, stored_ranges, stored_pieces, ranges, watermarks, "
                        "max_ic_ranges, max_watermark_pieces) takes 7 arguments");
        return NULL;
    }
    PyObject *stored_ranges_object = args[1], *stored_pieces_object = args[2];
    int64_t stable, max_ranges, max_pieces;
    if (read_int(args[0], &stable) != READ || stable < 0 ||
        read_int(args[5], &max_ranges) != READ || read_int(args[6], &max_pieces) != READ) {
        Py_RETURN_NONE;
    }
    /* Stored and committed side by side, so the merge sorts them in place. */
    Span ranges[2 * MOST];
    Piece pieces[2 * MOST];
    Py_ssize_t stored_range_count = 0, range_count = 0, stored_piece_count = 0, piece_count = 0;
    if (read_tuples(stored_ranges_object, 2, (int64_t *)ranges, &stored_range_count, MOST) !=
            READ ||
        read_tuples(stored_pieces_object, 3, (int64_t *)pieces, &stored_piece_count, MOST) !=
            READ) {
        Py_RETURN_NONE;
    }
    range_count = stored_range_count;
    piece_count = stored_piece_count;
    if (read_tuples(args[3], 2, (int64_t *)ranges, &range_count, 2 * MOST) != READ ||
        read_tuples(args[4], 3, (int64_t *)pieces, &piece_count, 2 * MOST) != READ) {
        Py_RETURN_NONE;
    }
    Py_ssize_t committed_ranges = range_count - stored_range_count;
    Py_ssize_t committed_pieces = piece_count - stored_piece_count;
    Span stored_ranges[MOST];
    Piece stored_pieces[MOST];
    memcpy(stored_ranges, ranges, (size_t)stored_range_count * sizeof(Span));
    memcpy(stored_pieces, pieces, (size_t)stored_piece_count * sizeof(Piece));

    /* Ranges: clipped to the stable offset, and merged when any part is left. */
    Py_ssize_t fresh = 0;
    for (Py_ssize_t i = stored_range_count; i < range_count; i++) {
        Span range = ranges[i];
        if (range.start < 0 || range.start > range.end) {
            Py_RETURN_NONE;
        }
        if (range.end >= stable) {
            ranges[stored_range_count + fresh].start = range.start >= stable ? range.start : stable;
            ranges[stored_range_count + fresh].end = range.end;
            fresh++;
        }
    }
    Py_ssize_t merged_count = stored_range_count;
    if (fresh) {
        sort_spans(ranges, stored_range_count + fresh);
        merged_count = coalesce(ranges, stored_range_count + fresh);
    }

    /* Watermarks: those above the stable offset raise W(h) under them. */
    Py_ssize_t effective = 0;
    for (Py_ssize_t i = stored_piece_count; i < piece_count; i++) {
        Piece mark = pieces[i];
        if (mark.start < 0 || mark.start > mark.end || mark.offset < 0) {
            Py_RETURN_NONE;
        }
        if (mark.offset > stable) {
            pieces[stored_piece_count + effective++] = mark;
        }
    }
    /* Nested pieces split what holds them: an envelope has up to twice as many pieces. */
    Piece raised[4 * MOST];
    Py_ssize_t raised_count;
    if (effective) {
        raised_count = upper_envelope(pieces, stored_piece_count + effective, raised);
    } else {
        memcpy(raised, pieces, (size_t)stored_piece_count * sizeof(Piece));
        raised_count = stored_piece_count;
    }

    /* Settle: the stable offset moves to the first offset not known processed. */
    int64_t new_stable = stable;
    if (raised_count && raised[0].start == 0 && raised[raised_count - 1].end == INT64_MAX) {
        int64_t lowest = raised[0].offset;
        int whole = 1;
        for (Py_ssize_t i = 1; i < raised_count; i++) {
            if (raised[i].start - 1 != raised[i - 1].end) {
                whole = 0;
                break;
            }
            if (raised[i].offset < lowest) {
                lowest = raised[i].offset;
            }
        }
        if (whole && lowest >= stable) {
            new_stable = lowest;
        }
    }
    Py_ssize_t first_kept = 0;
    while (first_kept < merged_count && ranges[first_kept].start <= new_stable) {
        first_kept++;
    }
    if (first_kept && ranges[first_kept - 1].end >= new_stable) {
        int64_t end = ranges[first_kept - 1].end;
        new_stable = end == INT64_MAX ? INT64_MAX : end + 1;
    }
    Py_ssize_t kept_ranges = merged_count - first_kept;
    Py_ssize_t kept_pieces = raised_count;
    if (new_stable != stable) {
        kept_pieces = 0;
        for (Py_ssize_t i = 0; i < raised_count; i++) {
            if (raised[i].offset > new_stable) {
                raised[kept_pieces++] = raised[i];
            }
        }
    }
    if (kept_ranges > max_ranges || kept_pieces > max_pieces) {
        Py_RETURN_NONE; /* the Python path decides what to refuse */
    }

    int too_old = committed_ranges && !fresh;
    int advanced = new_stable > stable;
    int ranges_unchanged = kept_ranges == stored_range_count &&
                           same_spans(ranges + first_kept, stored_ranges, kept_ranges);
    int pieces_unchanged =
        kept_pieces == stored_piece_count && same_pieces(raised, stored_pieces, kept_pieces);
    int duplicate = !too_old && (committed_ranges || committed_pieces) && !advanced &&
                    ranges_unchanged && pieces_unchanged;

    PyObject *ranges_result, *pieces_result;
    if (ranges_unchanged) {
        Py_INCREF(stored_ranges_object);
        ranges_result = stored_ranges_object;
    } else {
        ranges_result = spans_tuple(ranges + first_kept, kept_ranges);
        if (ranges_result == NULL) {
            return NULL;
        }
    }
    if (pieces_unchanged) {
        Py_INCREF(stored_pieces_object);
        pieces_result = stored_pieces_object;
    } else {
        pieces_result = pieces_tuple(raised, kept_pieces);
        if (pieces_result == NULL) {
            Py_DECREF(ranges_result);
            return NULL;
        }
    }
    PyObject *stable_result;
    if (new_stable == stable) {
        Py_INCREF(args[0]);
        stable_result = args[0];
    } else {
        stable_result = PyLong_FromLongLong((long long)new_stable);
        if (stable_result == NULL) {
            Py_DECREF(ranges_result);
            Py_DECREF(pieces_result);
            return NULL;
        }
    }
    return Py_BuildValue("(NNNOOO)", stable_result, ranges_result, pieces_result,
                         too_old ? Py_True : Py_False, advanced ? Py_True : Py_False,
                         duplicate ? Py_True : Py_False);
}

static PyMethodDef methods[] = {
    {"apply", (PyCFunction)(void (*)(void))apply, METH_FASTCALL,
     "apply(stable_offset, stored_ranges, stored_pieces, ranges, watermarks, max_ic_ranges, "
     "max_watermark_pieces) -> (stable_offset, ranges, pieces, too_old, advanced, duplicate) "
     "| None\n\n"
     "One partition entry of an individual commit merged into a stored state, as "
     "coordinator.core.offsets.apply_individual_commit merges it; None for what this module "
     "leaves to the Python path (large states, values it does not read, a result over a "
     "limit)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_commit",
    .m_doc = "The common case of an individual commit's merge, in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__commit(void) { return PyModule_Create(&module_definition); }
