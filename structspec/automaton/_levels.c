/* walk_levels: a region shape's leaving tokens walked trie level by level over the built DFA rows, the GIL
 * released over the loops (the caller holds the DFA's lock). Part of structspec.automaton._core. */
#include "_core.h"

typedef struct {
    Py_buffer parents, bytes, ends, ids;
} Level;

/* Item i of an int32 or int64 array (the trie's arrays are either, as numpy made them). */
static inline int64_t at_index(const Py_buffer *b, Py_ssize_t i) {
    return b->itemsize == 8 ? ((const int64_t *)b->buf)[i] : ((const int32_t *)b->buf)[i];
}

static void release_levels(Level *levels, Py_ssize_t count) {
    for (Py_ssize_t i = 0; i < count; i++) {
        PyBuffer_Release(&levels[i].parents);
        PyBuffer_Release(&levels[i].bytes);
        PyBuffer_Release(&levels[i].ends);
        PyBuffer_Release(&levels[i].ids);
    }
    PyMem_Free(levels);
}

/* Views of the levels (parents, bytes uint8, ends, ids: int64 or int32) from `first` on; NULL and an
 * exception if one is not that (int32 arrays are taken for int64 ones too). `*count` is set to how many were taken. */
static Level *take_levels(PyObject *seq, Py_ssize_t first, Py_ssize_t total, Py_ssize_t *count) {
    Level *levels = PyMem_Calloc(total - first + 1, sizeof(Level));
    *count = 0;
    if (!levels) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t i = first; i < total; i++) {
        PyObject *level = PySequence_Fast_GET_ITEM(seq, i);
        Level *l = &levels[i - first];
        PyObject *parts[4];
        if (!PyTuple_Check(level) || PyTuple_GET_SIZE(level) != 4) {
            PyErr_SetString(PyExc_TypeError, "levels: each level must be a 4-tuple (parents, bytes, ends, ids)");
            release_levels(levels, *count);
            return NULL;
        }
        for (int k = 0; k < 4; k++)
            parts[k] = PyTuple_GET_ITEM(level, k);
        if (ss_view(parts[0], &l->parents, -1, 0, "parents") < 0)
            goto fail;
        if (ss_view(parts[1], &l->bytes, 1, 0, "bytes") < 0) {
            PyBuffer_Release(&l->parents);
            goto fail;
        }
        if (ss_view(parts[2], &l->ends, -1, 0, "ends") < 0) {
            PyBuffer_Release(&l->parents);
            PyBuffer_Release(&l->bytes);
            goto fail;
        }
        if (ss_view(parts[3], &l->ids, -1, 0, "ids") < 0) {
            PyBuffer_Release(&l->parents);
            PyBuffer_Release(&l->bytes);
            PyBuffer_Release(&l->ends);
            goto fail;
        }
        (*count)++;
        if (l->ids.len / l->ids.itemsize != l->ends.len / l->ends.itemsize ||
            l->bytes.len != l->parents.len / l->parents.itemsize) {
            PyErr_SetString(PyExc_ValueError, "levels: a level's arrays disagree in length");
            goto fail;
        }
    }
    return levels;
fail:
    release_levels(levels, *count);
    return NULL;
}

enum { WALK_DONE, WALK_MISSING, WALK_BAD_NODE, WALK_BAD_ID };

/* walk_levels(levels, first, states, slots, rows, found) -> None or (level, states, missing).
 *
 * The trie of a region shape's leaving tokens, level by level from ``first``: ``states`` (int32, raw) are the
 * DFA states of the nodes of the level before (``first`` 0: the exits). Node i of a level reads ``bytes[i]``
 * from node ``parents[i]``; the token ``ids[k]`` ending on node ``ends[k]`` is allowed when that node's state is
 * not dead: its bit (little bit order) is set in ``found``. Stops when every node is dead or the levels end
 * (None), or where a level starts from states whose rows are not built: (that level, its ``states`` as int32
 * bytes, the states to build), to be called again from there once they are. */
PyObject *ss_walk_levels(PyObject *self, PyObject *args) {
    PyObject *levels_obj, *slots_obj, *rows_obj, *found_obj;
    Py_buffer start, slots, rows, found;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "Ony*OOO", &levels_obj, &first, &start, &slots_obj, &rows_obj, &found_obj))
        return NULL;
    PyObject *seq = PySequence_Fast(levels_obj, "levels must be a sequence");
    if (!seq) {
        PyBuffer_Release(&start);
        return NULL;
    }
    Py_ssize_t total = PySequence_Fast_GET_SIZE(seq), count = 0;
    if (first < 0 || first > total) {
        PyErr_SetString(PyExc_ValueError, "first: not a level");
        Py_DECREF(seq);
        PyBuffer_Release(&start);
        return NULL;
    }
    Level *levels = take_levels(seq, first, total, &count);
    Py_DECREF(seq);
    if (!levels) {
        PyBuffer_Release(&start);
        return NULL;
    }
    if (ss_view(slots_obj, &slots, 4, 0, "slots") < 0)
        goto fail_levels;
    if (ss_view(rows_obj, &rows, 4, 0, "rows") < 0) {
        PyBuffer_Release(&slots);
        goto fail_levels;
    }
    if (ss_view(found_obj, &found, 1, 1, "found") < 0) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&slots);
        goto fail_levels;
    }

    Py_ssize_t widest = start.len / 4;
    for (Py_ssize_t i = 0; i < count; i++)
        if (levels[i].bytes.len > widest)
            widest = levels[i].bytes.len;
    int32_t *cur = PyMem_RawMalloc((widest + 1) * 4), *next = PyMem_RawMalloc((widest + 1) * 4);
    int32_t *missing = PyMem_RawMalloc((widest + 1) * 4);
    PyObject *result = NULL;
    if (!cur || !next || !missing) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(cur, start.buf, (start.len / 4) * 4);
    Py_ssize_t ncur = start.len / 4, nmissing = 0, at = 0;
    int outcome = WALK_DONE;
    {
        const int32_t *slot_of = slots.buf, *table = rows.buf;
        unsigned char *bits = found.buf;
        Py_ssize_t nslots = slots.len / 4, nrows = rows.len / (4 * 256), nbits = found.len * 8;
        Py_BEGIN_ALLOW_THREADS
        for (at = 0; at < count; at++) {
            const Level *l = &levels[at];
            const unsigned char *bytes = l->bytes.buf;
            Py_ssize_t n = l->bytes.len, nends = l->ends.len / l->ends.itemsize;
            for (Py_ssize_t i = 0; i < n; i++) {
                int64_t p = at_index(&l->parents, i);
                if (p < 0 || p >= ncur) {
                    outcome = WALK_BAD_NODE;
                    break;
                }
                int32_t s = cur[p];
                if (s != 0 && (s < 0 || s >= nslots || slot_of[s] <= 0 || slot_of[s] >= nrows)) {
                    /* (repeats side by side dropped: `LazyDFA.ensure` takes each state once) */
                    if (!nmissing || missing[nmissing - 1] != s)
                        missing[nmissing++] = s;
                }
            }
            if (outcome != WALK_DONE)
                break;
            if (nmissing) {
                outcome = WALK_MISSING;
                break;
            }
            int any = 0;
            for (Py_ssize_t i = 0; i < n; i++) {
                int32_t s = cur[at_index(&l->parents, i)];  /* the dead state's slot is 0: the dead row, all dead */
                int32_t t = table[(Py_ssize_t)slot_of[s] * 256 + bytes[i]];
                next[i] = t;
                any |= t != 0;
            }
            for (Py_ssize_t k = 0; k < nends; k++) {
                int64_t e = at_index(&l->ends, k), id = at_index(&l->ids, k);
                if (e < 0 || e >= n) {
                    outcome = WALK_BAD_NODE;
                    break;
                }
                if (next[e] == 0)
                    continue;
                if (id < 0 || id >= nbits) {
                    outcome = WALK_BAD_ID;
                    break;
                }
                bits[id >> 3] |= (unsigned char)(1u << (id & 7));
            }
            if (outcome != WALK_DONE)
                break;
            int32_t *swap = cur;
            cur = next;
            next = swap;
            ncur = n;
            if (!any) {
                at = count;
                break;
            }
        }
        Py_END_ALLOW_THREADS
    }
    if (outcome == WALK_BAD_NODE) {
        PyErr_SetString(PyExc_ValueError, "levels: a node's parent or a token's end is not a node");
    } else if (outcome == WALK_BAD_ID) {
        PyErr_SetString(PyExc_ValueError, "found: a token id past its bits");
    } else if (outcome == WALK_DONE) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *list = PyList_New(nmissing);
        if (list) {
            int ok = 1;
            for (Py_ssize_t i = 0; i < nmissing && ok; i++) {
                PyObject *state = PyLong_FromLong(missing[i]);
                ok = state != NULL;
                if (ok)
                    PyList_SET_ITEM(list, i, state);
            }
            if (ok)
                result = Py_BuildValue("ny#N", first + at, (const char *)cur, ncur * 4, list);
            else
                Py_DECREF(list);
        }
    }
done:
    PyMem_RawFree(cur);
    PyMem_RawFree(next);
    PyMem_RawFree(missing);
    PyBuffer_Release(&found);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&slots);
    release_levels(levels, count);
    PyBuffer_Release(&start);
    return result;
fail_levels:
    release_levels(levels, count);
    PyBuffer_Release(&start);
    return NULL;
}
