/* structspec.automaton._core: the automaton's hot loops in C, the Python automaton (nfa.py, dfa.py, index.py)
 * being the reference they are tested against (tests/automaton/test_core.py). One concept per file:
 *   _core.c    this module, the walks of bytes and tokens over built rows (`step`, `walk_tokens`), and the copy
 *              of a packed mask row into a caller's bitmask by address (`copy_row`);
 *   _levels.c  a state's first mask once its region is known (`first_mask`): the region shape's tokens, its
 *              leaving tokens' trie walked (the GIL released), the rows it needs built, the end tokens;
 *   _walk.c    a region shape's walk over the vocabulary and its leaving tokens' trie (`walk_shape`), the GIL
 *              released;
 *   _region.c  a state's region over the built rows, as a canonical table (`region`);
 *   _classes.c the classes of a region's states (`equivalent`);
 *   _closure.c the NFA's positions, closures and moves, mirrored from `ByteNFA` (for `Builder`);
 *   _subset.c  the DFA's rows built from the NFA (`Builder`: state sets, the subset construction);
 *   _builder.h what the two share (the `Builder` object, int arrays, index tables).
 *
 * The walks read a `LazyDFA`'s built rows as they are: ``rows`` int32 [n, 256] (row 0 dead), ``slots`` int32
 * (state -> its row, 0 while not built). None builds a row: where one is missing they stop and say which states
 * need one, `LazyDFA.ensure` builds them (with `Builder`, or in Python), and the call resumes where it stopped. */
#include "_core.h"

/* A C-contiguous view of `obj` whose items are `itemsize` bytes (-1: 4 or 8, an int32 or int64 array). No format
 * string is asked for (numpy builds one on each request: a third of a first mask's call overhead), so the item
 * size is what is checked, not the item type. */
int ss_view(PyObject *obj, Py_buffer *buf, Py_ssize_t itemsize, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
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
    if (ss_view(slots_obj, &slots, 4, 0, "slots") < 0) {
        PyBuffer_Release(&data);
        return NULL;
    }
    if (ss_view(rows_obj, &rows, 4, 0, "rows") < 0) {
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

/* successors(slots, rows, state) -> tuple: the distinct states of ``state``'s row, in the order of the first
 * byte leading to each (dead included where a byte leads there; a state not built reads the dead row). */
static PyObject *successors(PyObject *self, PyObject *args) {
    PyObject *slots_obj, *rows_obj;
    Py_buffer slots, rows;
    long long state;
    if (!PyArg_ParseTuple(args, "OOL", &slots_obj, &rows_obj, &state))
        return NULL;
    if (ss_view(slots_obj, &slots, 4, 0, "slots") < 0)
        return NULL;
    if (ss_view(rows_obj, &rows, 4, 0, "rows") < 0) {
        PyBuffer_Release(&slots);
        return NULL;
    }
    int32_t found[256];
    int n = 0;
    Py_ssize_t slot = state >= 0 && state < slots.len / 4 ? ((const int32_t *)slots.buf)[state] : -1;
    if (slot >= 0 && slot < rows.len / (4 * 256)) {
        const int32_t *row = (const int32_t *)rows.buf + slot * 256;
        for (int b = 0; b < 256; b++) {
            int k = n - 1;
            while (k >= 0 && found[k] != row[b])  /* (from the last: runs of one state are the common case) */
                k--;
            if (k < 0)
                found[n++] = row[b];
        }
    }
    PyBuffer_Release(&slots);
    PyBuffer_Release(&rows);
    if (slot < 0 || !n) {
        PyErr_SetString(PyExc_IndexError, "successors: not a state of these rows");
        return NULL;
    }
    PyObject *t = PyTuple_New(n);
    for (int k = 0; t && k < n; k++) {
        PyObject *v = PyLong_FromLong(found[k]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, k, v);
    }
    return t;
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
        if (ss_view(objs[taken], &b[taken], sizes[taken], 0, names[taken]) < 0)
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

/* copy_row(address, packed): ``packed`` (an int32 array, C-contiguous) copied to the memory at ``address`` (an
 * int: a checked CPU bitmask's row, `structspec.automaton.bitmask`). No check of the address: the caller's. The
 * GIL stays held: a row (19 KB over a 152k vocabulary) copies in about a microsecond, and a thread that drops the
 * GIL while another waits for it gets it back only after that one's switch interval (5 ms by default). */
static PyObject *copy_row(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy_row(address, packed) takes 2 arguments");
        return NULL;
    }
    void *address = PyLong_AsVoidPtr(args[0]);
    if (address == NULL && PyErr_Occurred())
        return NULL;
    Py_buffer packed;
    if (ss_view(args[1], &packed, 4, 0, "packed") < 0)
        return NULL;
    memcpy(address, packed.buf, (size_t)packed.len);
    PyBuffer_Release(&packed);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy_row", (PyCFunction)(void (*)(void))copy_row, METH_FASTCALL,
     "copy_row(address, packed) -> None: packed's bytes written at address (a checked bitmask row)"},
    {"step", step, METH_VARARGS, "step(slots, rows, state, data, pos) -> (state, pos)"},
    {"walk_tokens", walk_tokens, METH_VARARGS,
     "walk_tokens(slots, rows, data, starts, ends, row_of, state, tokens, first, pos) -> (states, k, pos, state)"},
    {"successors", successors, METH_VARARGS, "successors(slots, rows, state) -> tuple: the distinct states of a row"},
    {"unbuilt", ss_unbuilt, METH_VARARGS, "unbuilt(states, built) -> bool: whether a state of states has no row built"},
    {"first_mask", ss_first_mask, METH_VARARGS,
     "first_mask(dfa, ensure, trie, base, exits, ends, width, found) -> bool: a state's first mask, in found"},
    {"equivalent", ss_equivalent, METH_VARARGS, "equivalent(table, regions) -> bytes: int64 classes per code"},
    {"walk_shape", ss_walk_shape, METH_VARARGS,
     "walk_shape(table, regions, data, starts, ends, ids, by_first, first_starts, size) -> (base, trie)"},
    {"region", ss_region, METH_VARARGS, "region(dfa, state, ensure, depth, limit) -> (table, regions, exits)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core", "The automaton's hot loops in C.", -1, methods};

PyMODINIT_FUNC PyInit__core(void) {
    if (PyType_Ready(&ss_builder_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddObjectRef(m, "Builder", (PyObject *)&ss_builder_type) < 0)
        Py_CLEAR(m);
    return m;
}