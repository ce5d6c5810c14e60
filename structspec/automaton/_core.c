/* structspec.automaton._core: the automaton's hot loops in C, the Python automaton (dfa.py, index.py) being the
 * reference they are tested against (tests/automaton/test_core.py).
 *
 * Both functions read a `LazyDFA`'s built rows as they are: ``rows`` int32 [n, 256] (row 0 dead), ``slots``
 * int32 (state -> its row, 0 while not built). Neither builds a row: where one is missing they stop and say
 * which states need one, Python builds them (the NFA, its closures and the DFA's interning stay in Python), and
 * the call resumes where it stopped. So the states are numbered exactly as the Python automaton numbers them.
 *
 * `walk_levels` releases the GIL over its loops: it owns copies of the states it steps and reads only buffers
 * it holds views of; the caller holds the DFA's lock, so no row is built (and no array replaced) meanwhile. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A C-contiguous view of `obj` whose items are `itemsize` bytes (-1: 4 or 8, an int32 or int64 array). */
static int view(PyObject *obj, Py_buffer *buf, Py_ssize_t itemsize, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, buf, flags) < 0)
        return -1;
    if (itemsize == -1 ? buf->itemsize != 4 && buf->itemsize != 8 : buf->itemsize != itemsize) {
        PyErr_Format(PyExc_TypeError, "%s: expected items of %zd bytes, got %zd", name, itemsize, buf->itemsize);
        PyBuffer_Release(buf);
        return -1;
    }
    return 0;
}

/* step(slots, rows, state, data, pos) -> (state, pos): ``data[pos:]`` read from ``state`` through the built
 * rows, stopping at its end, at the dead state (0), or before a byte whose row is not built here (then
 * ``state`` is the state to build and ``pos`` the byte it stopped before). */
static PyObject *step(PyObject *self, PyObject *args) {
    PyObject *slots_obj, *rows_obj;
    Py_buffer slots, rows, data;
    long long state;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "OOLy*n", &slots_obj, &rows_obj, &state, &data, &pos))
        return NULL;
    if (view(slots_obj, &slots, 4, 0, "slots") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (view(rows_obj, &rows, 4, 0, "rows") < 0) {
        PyBuffer_Release(&slots);
        PyBuffer_Release(&data);
        return NULL;
    }
    const int32_t *slot_of = slots.buf, *table = rows.buf;
    const unsigned char *bytes = data.buf;
    Py_ssize_t nslots = slots.len / 4, nrows = rows.len / (4 * 256), len = data.len;
    if (pos < 0)
        pos = 0;
    while (pos < len && state != 0) {
        if (state < 0 || state >= nslots)
            break;  /* not in this (older) slots array: Python builds or reads it */
        int32_t slot = slot_of[state];
        if (slot <= 0 || slot >= nrows)
            break;  /* not built, or built into a newer rows array */
        state = table[(Py_ssize_t)slot * 256 + bytes[pos]];
        pos++;
    }
    PyBuffer_Release(&slots);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&data);
    return Py_BuildValue("Ln", state, pos);
}

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
        if (view(parts[0], &l->parents, -1, 0, "parents") < 0)
            goto fail;
        if (view(parts[1], &l->bytes, 1, 0, "bytes") < 0) {
            PyBuffer_Release(&l->parents);
            goto fail;
        }
        if (view(parts[2], &l->ends, -1, 0, "ends") < 0) {
            PyBuffer_Release(&l->parents);
            PyBuffer_Release(&l->bytes);
            goto fail;
        }
        if (view(parts[3], &l->ids, -1, 0, "ids") < 0) {
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
static PyObject *walk_levels(PyObject *self, PyObject *args) {
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
    if (view(slots_obj, &slots, 4, 0, "slots") < 0)
        goto fail_levels;
    if (view(rows_obj, &rows, 4, 0, "rows") < 0) {
        PyBuffer_Release(&slots);
        goto fail_levels;
    }
    if (view(found_obj, &found, 1, 1, "found") < 0) {
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


/* walk_tokens(slots, rows, data, starts, ends, row_of, state, tokens, first, pos) -> (states, k, pos, state).
 *
 * Token ids ``tokens`` (int64) from ``tokens[first]``, byte ``pos`` of it, in DFA state ``state``: a token
 * reads the bytes ``data[starts[r]:ends[r]]`` of its row ``r = row_of[token]`` (-1: no text, an end token or an
 * id the vocabulary lacks: rejected). ``states`` are the states after each token read whole. Stops at the end
 * (``k`` = len(tokens)), at a rejected token (``k`` names it, ``pos`` -1), or before a byte whose state's row
 * is not built here (``k`` and ``pos`` name the byte, ``state`` the state to build: call again from there). */
static PyObject *walk_tokens(PyObject *self, PyObject *args) {
    PyObject *objs[7];
    Py_buffer b[7];
    static const Py_ssize_t sizes[7] = {4, 4, 1, 8, 8, 8, 8};
    static const char *names[7] = {"slots", "rows", "data", "starts", "ends", "row_of", "tokens"};
    long long state;
    Py_ssize_t first, pos;
    if (!PyArg_ParseTuple(args, "OOOOOOLOnn", &objs[0], &objs[1], &objs[2], &objs[3], &objs[4], &objs[5], &state,
                          &objs[6], &first, &pos))
        return NULL;
    int taken = 0;
    for (; taken < 7; taken++)
        if (view(objs[taken], &b[taken], sizes[taken], 0, names[taken]) < 0)
            break;
    PyObject *states = taken == 7 ? PyList_New(0) : NULL;
    PyObject *result = NULL;
    if (states) {
        const int32_t *slot_of = b[0].buf, *table = b[1].buf;
        const unsigned char *data = b[2].buf;
        const int64_t *starts = b[3].buf, *ends = b[4].buf, *row_of = b[5].buf, *tokens = b[6].buf;
        Py_ssize_t nslots = b[0].len / 4, nrows = b[1].len / (4 * 256), ntext = b[3].len / 8;
        Py_ssize_t nids = b[5].len / 8, ntokens = b[6].len / 8, k = first < 0 ? 0 : first;
        int ok = 1;
        for (; k < ntokens && ok; k++, pos = 0) {
            int64_t t = tokens[k], r = t >= 0 && t < nids ? row_of[t] : -1;
            if (r < 0 || r >= ntext || ends[r] > b[2].len || starts[r] < 0) {
                pos = -1;
                break;
            }
            Py_ssize_t at = starts[r] + (pos > 0 ? pos : 0), end = ends[r];
            for (; at < end && state != 0; at++) {
                int32_t slot = state > 0 && state < nslots ? slot_of[state] : 0;
                if (slot <= 0 || slot >= nrows)
                    break;
                state = table[(Py_ssize_t)slot * 256 + data[at]];
            }
            if (state == 0) {
                pos = -1;
                break;
            }
            if (at < end) {  /* a row to build */
                pos = at - starts[r];
                break;
            }
            PyObject *item = PyLong_FromLongLong(state);
            ok = item != NULL && PyList_Append(states, item) == 0;
            Py_XDECREF(item);
        }
        if (ok)
            result = Py_BuildValue("Onnl", states, k, pos, (long)state);
        Py_DECREF(states);
    }
    for (int i = 0; i < taken; i++)
        PyBuffer_Release(&b[i]);
    return result;
}

/* partition_row(moves, one, many, enter_one, enter_many) -> bytes: a DFA row (256 int32 states, dead 0) from
 * ``moves``, the sorted (low byte, high byte, position) edges out of a state's positions whose ranges are equal
 * or disjoint. A range entered from one position takes its state from ``one`` (position -> its state as 4
 * little-endian bytes), else from ``enter_one(position)``; a range entered from several, from ``many``
 * (their positions, ascending, each once -> state), else ``enter_many(positions)``: the callables intern the
 * state in Python (and add it to the dict), as `LazyDFA._partition` does. */
static PyObject *get_or_enter(PyObject *dict, PyObject *key, PyObject *enter) {
    PyObject *found = PyDict_GetItemWithError(dict, key);
    if (found)
        return Py_NewRef(found);
    return PyErr_Occurred() ? NULL : PyObject_CallOneArg(enter, key);
}

static PyObject *partition_row(PyObject *self, PyObject *args) {
    PyObject *moves, *one, *many, *enter_one, *enter_many;
    if (!PyArg_ParseTuple(args, "O!O!O!OO", &PyList_Type, &moves, &PyDict_Type, &one, &PyDict_Type, &many,
                          &enter_one, &enter_many))
        return NULL;
    int32_t row[256] = {0};
    Py_ssize_t n = PyList_GET_SIZE(moves), i = 0;
    long lo, hi, to;
    while (i < n) {
        PyObject *move = PyList_GET_ITEM(moves, i);
        if (!PyArg_ParseTuple(move, "lll", &lo, &hi, &to))
            return NULL;
        if (lo < 0 || hi > 255 || lo > hi) {
            PyErr_SetString(PyExc_ValueError, "moves: a byte range outside 0-255");
            return NULL;
        }
        Py_ssize_t j = i + 1;
        long l2, h2, t2;
        while (j < n) {
            if (!PyArg_ParseTuple(PyList_GET_ITEM(moves, j), "lll", &l2, &h2, &t2))
                return NULL;
            if (l2 != lo || h2 != hi)
                break;
            j++;
        }
        long state;
        if (j == i + 1) {
            PyObject *key = PyLong_FromLong(to);
            if (!key)
                return NULL;
            PyObject *cell = get_or_enter(one, key, enter_one);
            Py_DECREF(key);
            if (!cell)
                return NULL;
            if (!PyBytes_Check(cell) || PyBytes_GET_SIZE(cell) != 4) {
                Py_DECREF(cell);
                PyErr_SetString(PyExc_TypeError, "one: a state's cell must be 4 bytes");
                return NULL;
            }
            const unsigned char *c = (const unsigned char *)PyBytes_AS_STRING(cell);
            state = (long)((uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24);
            Py_DECREF(cell);
        } else {
            PyObject *key = PyTuple_New(j - i), *found;
            if (!key)
                return NULL;
            Py_ssize_t size = 0;
            long last = -1;
            for (Py_ssize_t k = i; k < j; k++) {  /* (sorted: a position repeated sits beside itself) */
                PyObject *item = PyTuple_GET_ITEM(PyList_GET_ITEM(moves, k), 2);
                long position = PyLong_AsLong(item);
                if (position == -1 && PyErr_Occurred()) {
                    Py_DECREF(key);
                    return NULL;
                }
                if (size && position == last)
                    continue;
                Py_INCREF(item);
                PyTuple_SET_ITEM(key, size++, item);
                last = position;
            }
            if (size < j - i && _PyTuple_Resize(&key, size) < 0)
                return NULL;
            found = get_or_enter(many, key, enter_many);
            Py_DECREF(key);
            if (!found)
                return NULL;
            state = PyLong_AsLong(found);
            Py_DECREF(found);
            if (state == -1 && PyErr_Occurred())
                return NULL;
        }
        for (long b = lo; b <= hi; b++)
            row[b] = (int32_t)state;
        i = j;
    }
    return PyBytes_FromStringAndSize((const char *)row, sizeof row);
}

static PyMethodDef methods[] = {
    {"step", step, METH_VARARGS, "step(slots, rows, state, data, pos) -> (state, pos)"},
    {"walk_tokens", walk_tokens, METH_VARARGS,
     "walk_tokens(slots, rows, data, starts, ends, row_of, state, tokens, first, pos) -> (states, k, pos, state)"},
    {"partition_row", partition_row, METH_VARARGS,
     "partition_row(moves, one, many, enter_one, enter_many) -> bytes: a DFA row from disjoint or equal moves"},
    {"walk_levels", walk_levels, METH_VARARGS,
     "walk_levels(levels, first, states, slots, rows, found) -> None or (level, states, missing)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", "The automaton's hot loops in C.", -1, methods};

PyMODINIT_FUNC PyInit__core(void) { return PyModule_Create(&module); }
