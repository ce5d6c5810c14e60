/* Builder: a `LazyDFA`'s rows built from its `ByteNFA` in C (the subset construction over byte ranges), the
 * Python `LazyDFA._build` and `ByteNFA.closure`/`moves` being the reference; the NFA's side (positions,
 * closures, moves) is in _closure.c. Part of structspec.automaton._core.
 *
 * The Python structures stay the automaton's record: the builder mirrors them (the NFA's states, edges, calls
 * and fragment spans; its positions and stacks; the DFA's state sets), reading what Python added since its
 * last call, and writes what it adds back into them as it goes (a position, a stack, a state set), numbered
 * exactly as the Python automaton numbers them: closures are walked in the same order and rows interned byte
 * range by byte range, ascending. So either side may go on where the other stopped, pickles hold what they
 * held, and one NFA may serve several DFAs. A fragment not built yet is built by Python (`ByteNFA._span`) when
 * a closure first enters it. The caller holds the DFA's lock. Rows are built with the GIL released: what the
 * builder adds is recorded in Python's lists after it takes the GIL back, and only then are the rows published
 * (their slots set), so a thread reading the rows without the lock never meets a state Python does not know.
 * Building a fragment and raising take the GIL for the call. */
#include "_builder.h"

static uint64_t set_hash(const Builder *b, int32_t d) {
    return hash_ints(b->set_pool.a + b->set_at.a[d], b->set_n.a[d]);
}
static int set_same(const Builder *b, int32_t d, const int32_t *key, Py_ssize_t len) {
    return b->set_n.a[d] == len && !memcmp(b->set_pool.a + b->set_at.a[d], key, len * sizeof(int32_t));
}

static int add_set(Builder *b, const int32_t *positions, Py_ssize_t len, uint64_t h) {
    int32_t d = (int32_t)b->set_at.n;
    if (ints_push(&b->set_at, (int32_t)b->set_pool.n) < 0 || ints_push(&b->set_n, (int32_t)len) < 0 ||
        ints_reserve(&b->set_pool, len) < 0)
        return -1;
    memcpy(b->set_pool.a + b->set_pool.n, positions, len * sizeof(int32_t));
    b->set_pool.n += len;
    return table_add(b, &b->set_table, d, h, set_hash);
}

/* Mirror what Python added since the last call: NFA states, stacks, positions (_closure.c), DFA state sets.
 * The GIL held. */
static int mirror(Builder *b) {
    if (ss_mirror_positions(b) < 0)
        return -1;
    for (Py_ssize_t d = b->set_at.n; d < PyList_GET_SIZE(b->sets); d++) {
        PyObject *set = PyList_GET_ITEM(b->sets, d);
        if (!PyTuple_Check(set)) {
            PyErr_SetString(PyExc_TypeError, "a DFA state's set must be a tuple");
            return -1;
        }
        Py_ssize_t len = PyTuple_GET_SIZE(set);
        b->key.n = 0;
        if (ints_reserve(&b->key, len) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < len; i++)
            if (as_int32(PyTuple_GET_ITEM(set, i), &b->key.a[i]) < 0)
                return -1;
        if (add_set(b, b->key.a, len, hash_ints(b->key.a, len)) < 0)
            return -1;
    }
    return 0;
}

/* Record in Python (``LazyDFA._sets``, ``_ids``) the stacks, positions and state sets added since the last call,
 * in order. The GIL held. */
static int record_all(Builder *b) {
    if (ss_record_positions(b) < 0)
        return -1;
    for (Py_ssize_t d = PyList_GET_SIZE(b->sets); d < b->set_at.n; d++)
        if (record(b->sets, b->ids, b->set_pool.a + b->set_at.a[d], b->set_n.a[d], d) < 0)
            return -1;
    return 0;
}

/* The DFA state of the positions `key` (ascending, each once) enter: their closures' union, interned (a new
 * state is recorded in the Python sets by `record_all`). -1 and an exception on failure. */
static int32_t enter(Builder *b) {
    Py_ssize_t n = b->key.n;
    for (Py_ssize_t i = 0; i < n; i++)  /* every closure first, in order: they number positions as Python's do */
        if (ss_closure(b, b->key.a[i]) < 0)
            return -1;
    const int32_t *items;
    Py_ssize_t len;
    if (n == 1) {
        items = b->closure_pool.a + b->closure_at.a[b->key.a[0]];
        len = b->closure_n.a[b->key.a[0]];
    } else {
        b->merged.n = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t p = b->key.a[i], m = b->closure_n.a[p];
            if (ints_reserve(&b->merged, m) < 0)
                return -1;
            memcpy(b->merged.a + b->merged.n, b->closure_pool.a + b->closure_at.a[p], m * sizeof(int32_t));
            b->merged.n += m;
        }
        qsort(b->merged.a, b->merged.n, sizeof(int32_t), compare_ints);
        len = 0;
        for (Py_ssize_t i = 0; i < b->merged.n; i++)
            if (!len || b->merged.a[len - 1] != b->merged.a[i])
                b->merged.a[len++] = b->merged.a[i];
        b->merged.n = len;
        items = b->merged.a;
    }
    uint64_t h = hash_ints(items, len);
    int32_t *slot = table_find(b, &b->set_table, h, set_same, items, len);
    if (*slot >= 0)
        return *slot;
    int32_t d = (int32_t)b->set_at.n;
    if (add_set(b, items, len, h) < 0)  /* (copies `items` before the pools can move) */
        return -1;
    return d;
}

static int compare_events(const void *x, const void *y) {
    const int32_t *a = x, *c = y;
    return (a[0] > c[0]) - (a[0] < c[0]);
}

/* Row ``d`` into ``row`` (256 states): for each byte, the state of the positions its moves enter, interned
 * byte range by byte range, ascending (as `LazyDFA._sweep` and `_partition` do). */
static int build_row(Builder *b, int32_t d, int32_t *row) {
    Py_ssize_t at = b->set_at.a[d], n = b->set_n.a[d];
    for (Py_ssize_t i = 0; i < n; i++)  /* every position's moves first, in order, as `LazyDFA._build` */
        if (ss_moves(b, b->set_pool.a[b->set_at.a[d] + i]) < 0)
            return -1;
    b->events.n = 0;  /* (byte, +1 entering / -1 leaving, position) */
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t p = b->set_pool.a[at + i];
        for (int32_t k = 0; k < b->moves_n.a[p]; k++) {
            const int32_t *m = b->moves_pool.a + b->moves_at.a[p] + 3 * k;
            if (ints_reserve(&b->events, 6) < 0)
                return -1;
            int32_t *e = b->events.a + b->events.n;
            e[0] = m[0], e[1] = 1, e[2] = m[2], e[3] = m[1] + 1, e[4] = -1, e[5] = m[2];
            b->events.n += 6;
        }
    }
    Py_ssize_t count = b->events.n / 3;
    qsort(b->events.a, count, 3 * sizeof(int32_t), compare_events);
    memset(row, 0, 256 * sizeof(int32_t));
    b->active.n = 0;
    for (Py_ssize_t i = 0; i < count;) {
        int32_t lo = b->events.a[3 * i];
        for (; i < count && b->events.a[3 * i] == lo; i++) {
            int32_t change = b->events.a[3 * i + 1], p = b->events.a[3 * i + 2];
            int32_t was = b->count.a[p];
            b->count.a[p] = was + change;
            if (!was && ints_push(&b->active, p) < 0)
                return -1;
        }
        /* the positions some range covers from here, ascending, each once (one left and entered again at this
         * byte, by ranges side by side, was added twice) */
        qsort(b->active.a, b->active.n, sizeof(int32_t), compare_ints);
        Py_ssize_t live = 0;
        for (Py_ssize_t k = 0; k < b->active.n; k++)
            if (b->count.a[b->active.a[k]] && (!live || b->active.a[live - 1] != b->active.a[k]))
                b->active.a[live++] = b->active.a[k];
        b->active.n = live;
        int32_t end = i < count ? b->events.a[3 * i] : 256;
        if (!live || lo >= 256)
            continue;
        if (ints_reserve(&b->key, live) < 0)
            return -1;
        memcpy(b->key.a, b->active.a, live * sizeof(int32_t));
        b->key.n = live;
        int32_t state = enter(b);  /* (may number positions: `count` grows with them, zeroed) */
        if (state < 0)
            return -1;
        for (int32_t byte = lo; byte < end && byte < 256; byte++)
            row[byte] = state;
    }
    return 0;
}

/* The states of ``states`` (an int32 or int64 array) whose row is not built (``built``, bool), ascending, each
 * once, into ``out``; -1 and an exception if one is not a state ``built`` covers. */
static int unbuilt_into(PyObject *states_obj, const Py_buffer *built, Ints *out) {
    Py_buffer states;
    if (ss_view(states_obj, &states, -1, 0, "states") < 0)
        return -1;
    const unsigned char *is_built = built->buf;
    Py_ssize_t n = states.len / states.itemsize;
    out->n = 0;
    int failed = 0;
    for (Py_ssize_t i = 0; i < n && !failed; i++) {
        int64_t d = states.itemsize == 8 ? ((const int64_t *)states.buf)[i] : ((const int32_t *)states.buf)[i];
        if (d < 0 || d >= built->len) {
            PyErr_SetString(PyExc_IndexError, "states: not a DFA state");
            failed = 1;
        } else if (!is_built[d]) {
            failed = ints_push(out, (int32_t)d) < 0;
        }
    }
    PyBuffer_Release(&states);
    if (failed)
        return -1;
    qsort(out->a, out->n, sizeof(int32_t), compare_ints);
    Py_ssize_t kept = 0;
    for (Py_ssize_t i = 0; i < out->n; i++)
        if (!kept || out->a[kept - 1] != out->a[i])
            out->a[kept++] = out->a[i];
    out->n = kept;
    return 0;
}

/* unbuilt(states, built) -> bool: whether a state of ``states`` has no row built (the lock-free check before
 * `build_rows`). */
PyObject *ss_unbuilt(PyObject *self, PyObject *args) {
    PyObject *states_obj, *built_obj;
    Py_buffer states, built;
    if (!PyArg_ParseTuple(args, "OO", &states_obj, &built_obj))
        return NULL;
    if (ss_view(states_obj, &states, -1, 0, "states") < 0)
        return NULL;
    if (ss_view(built_obj, &built, 1, 0, "built") < 0) {
        PyBuffer_Release(&states);
        return NULL;
    }
    const unsigned char *is_built = built.buf;
    Py_ssize_t n = states.len / states.itemsize;
    int found = 0, bad = 0;
    for (Py_ssize_t i = 0; i < n && !found; i++) {
        int64_t d = states.itemsize == 8 ? ((const int64_t *)states.buf)[i] : ((const int32_t *)states.buf)[i];
        bad = d < 0 || d >= built.len;
        found = bad || !is_built[d];
    }
    PyBuffer_Release(&states);
    PyBuffer_Release(&built);
    if (bad) {
        PyErr_SetString(PyExc_IndexError, "states: not a DFA state");
        return NULL;
    }
    return PyBool_FromLong(found);
}

/* build_rows(states, rows, slots, built, used) -> (done, used): the rows of the states of ``states`` not built
 * yet (ascending, each once) written into ``rows[used]``, ``rows[used + 1]``, ...; ``slots`` and ``built`` set
 * for each. Stops early (``done`` False) when ``rows`` is full or ``slots``/``built`` may not hold the states a
 * next row interns (up to 256 new ones): grow them and call again. The rows are built with the GIL released. */
static PyObject *build_rows(Builder *b, PyObject *args) {
    PyObject *states, *rows_obj, *slots_obj, *built_obj;
    Py_ssize_t used;
    if (!PyArg_ParseTuple(args, "OOOOn", &states, &rows_obj, &slots_obj, &built_obj, &used))
        return NULL;
    Py_buffer rows, slots, built;
    if (ss_view(rows_obj, &rows, 4, 1, "rows") < 0)
        return NULL;
    if (ss_view(slots_obj, &slots, 4, 1, "slots") < 0) {
        PyBuffer_Release(&rows);
        return NULL;
    }
    if (ss_view(built_obj, &built, 1, 1, "built") < 0) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&slots);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t nrows = rows.len / (4 * 256), room = slots.len / 4 < built.len ? slots.len / 4 : built.len, at = 0;
    int32_t *table = rows.buf, *slot_of = slots.buf;
    unsigned char *is_built = built.buf;
    int failed = 0;
    if (mirror(b) < 0 || unbuilt_into(states, &built, &b->rows_todo) < 0)
        goto done;
    b->finished.n = 0;
    PyThreadState *released = b->rows_todo.n ? PyEval_SaveThread() : NULL;  /* (nothing to build: kept) */
    for (; at < b->rows_todo.n && !failed; at++) {
        if (used >= nrows || b->set_at.n + 256 >= room)
            break;
        int32_t d = b->rows_todo.a[at];
        if (d >= b->set_at.n || used < 1) {
            raise_anywhere(PyExc_ValueError, "build_rows: not a DFA state, or row 0 (the dead row) taken");
            failed = 1;
        } else if (build_row(b, d, table + used * 256) < 0 || ints_push(&b->finished, d) < 0 ||
                   ints_push(&b->finished, (int32_t)used) < 0) {
            failed = 1;
        } else {
            used++;
        }
    }
    if (released)
        PyEval_RestoreThread(released);
    /* what was added is recorded even after a failure (the numbering goes on from it), the exception kept */
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    failed |= record_all(b) < 0;
    if (type) {
        PyErr_Restore(type, value, traceback);
    } else if (!failed) {
        for (Py_ssize_t i = 0; i < b->finished.n; i += 2) {  /* published: a set slot is a written row */
            slot_of[b->finished.a[i]] = b->finished.a[i + 1];
            is_built[b->finished.a[i]] = 1;
        }
        result = Py_BuildValue("Nn", PyBool_FromLong(at == b->rows_todo.n), used);
    }
done:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&built);
    return result;
}

static void builder_clear_memory(Builder *b) {
    Ints *all[] = {&b->edge_at, &b->edge_n, &b->edge_pool, &b->eps_at, &b->eps_n, &b->eps_pool, &b->call_of,
                   &b->call_fragment, &b->call_back, &b->call_low, &b->call_high, &b->span_start, &b->span_end,
                   &b->pos_state, &b->pos_stack, &b->stack_site, &b->stack_below, &b->stack_passes, &b->set_at,
                   &b->set_n, &b->set_pool, &b->closure_at, &b->closure_n, &b->closure_pool, &b->moves_at,
                   &b->moves_n, &b->moves_pool, &b->mark, &b->events, &b->active, &b->count, &b->key,
                   &b->merged, &b->todo, &b->seen, &b->nexts, &b->rows_todo, &b->finished};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        PyMem_RawFree(all[i]->a);
        all[i]->a = NULL;
        all[i]->n = all[i]->cap = 0;
    }
    Table *tables[] = {&b->pos_table, &b->stack_table, &b->set_table};
    for (size_t i = 0; i < 3; i++) {
        PyMem_RawFree(tables[i]->slot);
        tables[i]->slot = NULL;
        tables[i]->mask = tables[i]->used = 0;
    }
}

static void builder_dealloc(Builder *b) {
    Py_XDECREF(b->edges);
    Py_XDECREF(b->eps);
    Py_XDECREF(b->calls);
    Py_XDECREF(b->spans);
    Py_XDECREF(b->span);
    Py_XDECREF(b->positions);
    Py_XDECREF(b->position_ids);
    Py_XDECREF(b->stacks);
    Py_XDECREF(b->stack_ids);
    Py_XDECREF(b->sets);
    Py_XDECREF(b->ids);
    Py_XDECREF(b->fragments);
    Py_XDECREF(b->fragment_ids);
    builder_clear_memory(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

/* An attribute of ``obj`` that must be of ``type`` (NULL: any). */
static PyObject *attribute(PyObject *obj, const char *name, PyTypeObject *type) {
    PyObject *found = PyObject_GetAttrString(obj, name);
    if (found && type && !PyObject_TypeCheck(found, type)) {
        PyErr_Format(PyExc_TypeError, "Builder: %s is not a %s", name, type->tp_name);
        Py_CLEAR(found);
    }
    return found;
}

static PyObject *builder_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    PyObject *nfa, *sets, *ids;
    static char *names[] = {"nfa", "sets", "ids", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO!O!", names, &nfa, &PyList_Type, &sets, &PyDict_Type, &ids))
        return NULL;
    Builder *b = (Builder *)type->tp_alloc(type, 0);
    if (!b)
        return NULL;
    PyObject *accept = NULL;
    if (!(b->edges = attribute(nfa, "edges", &PyList_Type)) || !(b->eps = attribute(nfa, "eps", &PyList_Type)) ||
        !(b->calls = attribute(nfa, "calls", &PyDict_Type)) || !(b->spans = attribute(nfa, "_spans", &PyDict_Type)) ||
        !(b->span = attribute(nfa, "_span", NULL)) || !(b->positions = attribute(nfa, "_positions", &PyList_Type)) ||
        !(b->position_ids = attribute(nfa, "_position_ids", &PyDict_Type)) ||
        !(b->stacks = attribute(nfa, "_stacks", &PyList_Type)) ||
        !(b->stack_ids = attribute(nfa, "_stack_ids", &PyDict_Type)) || !(b->fragments = PyList_New(0)) ||
        !(b->fragment_ids = PyDict_New()) || !(accept = PyObject_GetAttrString(nfa, "accept")) ||
        as_int32(accept, &b->accept) < 0) {
        Py_XDECREF(accept);
        Py_DECREF(b);
        return NULL;
    }
    Py_DECREF(accept);
    b->sets = Py_NewRef(sets);
    b->ids = Py_NewRef(ids);
    return (PyObject *)b;
}

static PyMethodDef builder_methods[] = {
    {"build_rows", (PyCFunction)build_rows, METH_VARARGS,
     "build_rows(states, rows, slots, built, used) -> (done, used): the rows of states not built, written in place"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject ss_builder_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "structspec.automaton._core.Builder",
    .tp_basicsize = sizeof(Builder),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Builder(nfa, sets, ids): a LazyDFA's rows built from its ByteNFA (the DFA's state sets `sets` and "
              "their ids `ids`), numbering positions, stacks and states as the Python automaton does.",
    .tp_new = builder_new,
    .tp_dealloc = (destructor)builder_dealloc,
    .tp_methods = builder_methods,
};
