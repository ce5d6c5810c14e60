/* The NFA side of the row builder (`Builder`, _subset.c): the NFA's states, fragment spans, stacks and positions
 * mirrored from `ByteNFA` and extended as Python would (numbered alike, recorded back in its lists once the
 * builder holds the GIL again: `ss_record_positions`), and `ByteNFA.closure` and `ByteNFA.moves` of a position,
 * memoized. Closures and moves run with the GIL released; they take it only to build a fragment (`span`) or to
 * raise. Part of structspec.automaton._core. */
#include "_builder.h"

static uint64_t pos_hash(const Builder *b, int32_t p) {
    int32_t key[2] = {b->pos_state.a[p], b->pos_stack.a[p]};
    return hash_ints(key, 2);
}
static int pos_same(const Builder *b, int32_t p, const int32_t *key, Py_ssize_t len) {
    return b->pos_state.a[p] == key[0] && b->pos_stack.a[p] == key[1];
}
static uint64_t stack_hash(const Builder *b, int32_t k) {
    int32_t key[3] = {b->stack_site.a[k], b->stack_below.a[k], b->stack_passes.a[k]};
    return hash_ints(key, 3);
}
static int stack_same(const Builder *b, int32_t k, const int32_t *key, Py_ssize_t len) {
    return b->stack_site.a[k] == key[0] && b->stack_below.a[k] == key[1] && b->stack_passes.a[k] == key[2];
}
/* The index of fragment ``key``, numbered when first met. */
static int32_t fragment_index(Builder *b, PyObject *key) {
    PyObject *found = PyDict_GetItemWithError(b->fragment_ids, key);
    if (found)
        return (int32_t)PyLong_AsLong(found);
    if (PyErr_Occurred())
        return -1;
    int32_t f = (int32_t)PyList_GET_SIZE(b->fragments);
    PyObject *index = PyLong_FromLong(f);
    int failed = !index || PyDict_SetItem(b->fragment_ids, key, index) < 0 || PyList_Append(b->fragments, key) < 0 ||
                 ints_push(&b->span_start, -1) < 0 || ints_push(&b->span_end, -1) < 0;
    Py_XDECREF(index);
    return failed ? -1 : f;
}

/* Mirror the NFA states Python built since the last call (a state never changes once its build is done). */
static int sync_states(Builder *b) {
    Py_ssize_t total = PyList_GET_SIZE(b->edges);
    if (PyList_GET_SIZE(b->eps) != total) {
        PyErr_SetString(PyExc_RuntimeError, "the NFA's edges and epsilon lists disagree in length");
        return -1;
    }
    for (Py_ssize_t s = b->edge_at.n; s < total; s++) {
        PyObject *edges = PyList_GET_ITEM(b->edges, s), *eps = PyList_GET_ITEM(b->eps, s);
        if (!PyList_Check(edges) || !PyList_Check(eps)) {
            PyErr_SetString(PyExc_TypeError, "the NFA's edges and epsilon moves must be lists");
            return -1;
        }
        Py_ssize_t ne = PyList_GET_SIZE(edges), nq = PyList_GET_SIZE(eps);
        if (ints_push(&b->edge_at, (int32_t)b->edge_pool.n) < 0 || ints_push(&b->edge_n, (int32_t)ne) < 0 ||
            ints_push(&b->eps_at, (int32_t)b->eps_pool.n) < 0 || ints_push(&b->eps_n, (int32_t)nq) < 0 ||
            ints_reserve(&b->edge_pool, 3 * ne) < 0 || ints_reserve(&b->eps_pool, nq) < 0)
            return -1;
        for (Py_ssize_t i = 0; i < ne; i++) {
            if (tuple_ints(PyList_GET_ITEM(edges, i), b->edge_pool.a + b->edge_pool.n, 3) < 0)
                return -1;
            b->edge_pool.n += 3;
        }
        for (Py_ssize_t i = 0; i < nq; i++)
            if (as_int32(PyList_GET_ITEM(eps, i), &b->eps_pool.a[b->eps_pool.n++]) < 0)
                return -1;
        int32_t call = -1;
        if (PyDict_GET_SIZE(b->calls)) {
            PyObject *site = PyLong_FromSsize_t(s);
            if (!site)
                return -1;
            PyObject *found = PyDict_GetItemWithError(b->calls, site);
            Py_DECREF(site);
            if (!found && PyErr_Occurred())
                return -1;
            if (found) {  /* (fragment, return state, low, high or None) */
                if (!PyTuple_Check(found) || PyTuple_GET_SIZE(found) != 4) {
                    PyErr_SetString(PyExc_TypeError, "an NFA call must be (fragment, back, low, high)");
                    return -1;
                }
                int32_t fragment = fragment_index(b, PyTuple_GET_ITEM(found, 0)), back, low, high = -1;
                PyObject *most = PyTuple_GET_ITEM(found, 3);
                if (fragment < 0 || as_int32(PyTuple_GET_ITEM(found, 1), &back) < 0 ||
                    as_int32(PyTuple_GET_ITEM(found, 2), &low) < 0 || (most != Py_None && as_int32(most, &high) < 0))
                    return -1;
                call = (int32_t)b->call_fragment.n;
                if (ints_push(&b->call_fragment, fragment) < 0 || ints_push(&b->call_back, back) < 0 ||
                    ints_push(&b->call_low, low) < 0 || ints_push(&b->call_high, high) < 0)
                    return -1;
            }
        }
        if (ints_push(&b->call_of, call) < 0)
            return -1;
    }
    return 0;
}

/* Room for per-position memos of every position numbered. */
static int grow_position_memos(Builder *b) {
    Py_ssize_t n = b->pos_state.n;
    Ints *memos[] = {&b->closure_at, &b->closure_n, &b->moves_at, &b->moves_n, &b->mark, &b->count};
    for (size_t m = 0; m < sizeof memos / sizeof *memos; m++) {
        Ints *v = memos[m];
        if (v->n >= n)
            continue;
        if (ints_reserve(v, n - v->n) < 0)
            return -1;
        int32_t fill = (v == &b->closure_at || v == &b->moves_at) ? -1 : 0;
        for (Py_ssize_t i = v->n; i < n; i++)
            v->a[i] = fill;
        v->n = n;
    }
    return 0;
}

static int add_position(Builder *b, int32_t state, int32_t stack) {
    int32_t p = (int32_t)b->pos_state.n;
    if (ints_push(&b->pos_state, state) < 0 || ints_push(&b->pos_stack, stack) < 0)
        return -1;
    int32_t key[2] = {state, stack};
    return table_add(b, &b->pos_table, p, hash_ints(key, 2), pos_hash);
}

static int add_stack(Builder *b, int32_t site, int32_t below, int32_t passes) {
    int32_t k = (int32_t)b->stack_site.n;
    if (ints_push(&b->stack_site, site) < 0 || ints_push(&b->stack_below, below) < 0 ||
        ints_push(&b->stack_passes, passes) < 0)
        return -1;
    int32_t key[3] = {site, below, passes};
    return table_add(b, &b->stack_table, k, hash_ints(key, 3), stack_hash);
}

/* Record in Python (``ByteNFA._stacks``, ``_positions`` and their ids) the stacks and positions numbered here
 * since the last call, in order: Python's numbering is the builder's. The GIL held. */
int ss_record_positions(Builder *b) {
    for (Py_ssize_t k = PyList_GET_SIZE(b->stacks); k < b->stack_site.n; k++) {
        int32_t key[3] = {b->stack_site.a[k], b->stack_below.a[k], b->stack_passes.a[k]};
        if (record(b->stacks, b->stack_ids, key, 3, k) < 0)
            return -1;
    }
    for (Py_ssize_t p = PyList_GET_SIZE(b->positions); p < b->pos_state.n; p++) {
        int32_t key[2] = {b->pos_state.a[p], b->pos_stack.a[p]};
        if (record(b->positions, b->position_ids, key, 2, p) < 0)
            return -1;
    }
    return 0;
}

/* Mirror the NFA states, stacks and positions Python added since the last call. The GIL held. */
int ss_mirror_positions(Builder *b) {
    int32_t item[3];
    if (sync_states(b) < 0)
        return -1;
    for (Py_ssize_t k = b->stack_site.n; k < PyList_GET_SIZE(b->stacks); k++)
        if (tuple_ints(PyList_GET_ITEM(b->stacks, k), item, 3) < 0 || add_stack(b, item[0], item[1], item[2]) < 0)
            return -1;
    for (Py_ssize_t p = b->pos_state.n; p < PyList_GET_SIZE(b->positions); p++)
        if (tuple_ints(PyList_GET_ITEM(b->positions, p), item, 2) < 0 || add_position(b, item[0], item[1]) < 0)
            return -1;
    return grow_position_memos(b);
}

/* The position (state, stack), numbered when first met (recorded in Python later); -1 and an exception on
 * failure. */
static int32_t position(Builder *b, int32_t state, int32_t stack) {
    int32_t key[2] = {state, stack};
    int32_t *slot = table_find(b, &b->pos_table, hash_ints(key, 2), pos_same, key, 2);
    if (*slot >= 0)
        return *slot;
    int32_t p = (int32_t)b->pos_state.n;
    if (add_position(b, state, stack) < 0 || grow_position_memos(b) < 0)
        return -1;
    return p;
}

/* The stack (site, below, passes), numbered when first met, as `ByteNFA._push` (recorded in Python later). */
static int32_t push(Builder *b, int32_t site, int32_t below, int32_t passes) {
    int32_t key[3] = {site, below, passes};
    int32_t *slot = table_find(b, &b->stack_table, hash_ints(key, 3), stack_same, key, 3);
    if (*slot >= 0)
        return *slot;
    int32_t k = (int32_t)b->stack_site.n;
    if (add_stack(b, site, below, passes) < 0)
        return -1;
    return k;
}

/* Fragment ``f``'s start and end states, built by Python (`ByteNFA._span`, under the GIL, taken here if this
 * thread released it) when first needed. */
static int span(Builder *b, int32_t f) {
    if (b->span_start.a[f] >= 0)
        return 0;
    PyGILState_STATE held = PyGILState_Ensure();
    PyObject *key = PyList_GET_ITEM(b->fragments, f);
    PyObject *found = PyDict_GetItemWithError(b->spans, key);
    int32_t ends[2];
    int failed = 1;
    if (found)
        Py_INCREF(found);
    else if (!PyErr_Occurred())
        found = PyObject_CallOneArg(b->span, key);
    if (found) {
        failed = tuple_ints(found, ends, 2) < 0 || sync_states(b) < 0;
        Py_DECREF(found);
    }
    PyGILState_Release(held);
    if (failed)
        return -1;
    b->span_start.a[f] = ends[0];
    b->span_end.a[f] = ends[1];
    return 0;
}

/* Add position (state, stack) to the walk's `todo` and `seen` unless seen. */
static int reach(Builder *b, int32_t state, int32_t stack) {
    int32_t p = position(b, state, stack);
    if (p < 0)
        return -1;
    if (b->mark.a[p] == b->walk)
        return 0;
    b->mark.a[p] = b->walk;
    return ints_push(&b->todo, p) < 0 || ints_push(&b->seen, p) < 0 ? -1 : 0;
}

/* `ByteNFA.closure`: the positions reachable from ``p`` by epsilon moves, calls and returns that read a byte or
 * accept, ascending; memoized. Positions are numbered in the order the Python walk numbers them. */
int ss_closure(Builder *b, int32_t p) {
    if (b->closure_at.a[p] >= 0)
        return 0;
    int32_t state = b->pos_state.a[p], stack = b->pos_stack.a[p];
    int at_end = 0;
    if (stack) {  /* (the fragment is built: a position inside it was reached; its span may be Python's news) */
        int32_t f = b->call_fragment.a[b->call_of.a[b->stack_site.a[stack]]];
        if (span(b, f) < 0)
            return -1;
        at_end = state == b->span_end.a[f];
    }
    b->seen.n = 0;
    if (!b->eps_n.a[state] && b->call_of.a[state] < 0 && !at_end) {  /* most positions: a byte edge alone */
        if (b->edge_n.a[state] || p == b->accept)
            if (ints_push(&b->seen, p) < 0)
                return -1;
    } else {
        b->walk++;
        b->mark.a[p] = b->walk;
        b->todo.n = 0;
        if (ints_push(&b->todo, p) < 0 || ints_push(&b->seen, p) < 0)
            return -1;
        while (b->todo.n) {
            int32_t q = b->todo.a[--b->todo.n];
            state = b->pos_state.a[q];
            stack = b->pos_stack.a[q];
            /* (state, stack) pairs in the Python walk's order: epsilon moves, a call's entry and skip, a return */
            Ints *nexts = &b->nexts;
            nexts->n = 0;
            for (int32_t i = 0; i < b->eps_n.a[state]; i++)
                if (ints_push(nexts, b->eps_pool.a[b->eps_at.a[state] + i]) < 0 || ints_push(nexts, stack) < 0)
                    return -1;
            int32_t call = b->call_of.a[state];
            if (call >= 0) {
                int32_t f = b->call_fragment.a[call], entered;
                if (span(b, f) < 0 || (entered = push(b, state, stack, 1)) < 0)
                    return -1;
                if (ints_push(nexts, b->span_start.a[f]) < 0 || ints_push(nexts, entered) < 0)
                    return -1;
                if (b->call_low.a[call] == 0 && (ints_push(nexts, b->call_back.a[call]) < 0 || ints_push(nexts, stack) < 0))
                    return -1;
            }
            int32_t site = b->stack_site.a[stack];
            if (site >= 0) {
                int32_t c = b->call_of.a[site], f = b->call_fragment.a[c];
                int32_t low = b->call_low.a[c], high = b->call_high.a[c], passes = b->stack_passes.a[stack];
                int32_t below = b->stack_below.a[stack];
                if (span(b, f) < 0)
                    return -1;
                if (state == b->span_end.a[f]) {  /* the fragment's end: return, or pass once more */
                    if (passes >= low && (ints_push(nexts, b->call_back.a[c]) < 0 || ints_push(nexts, below) < 0))
                        return -1;
                    if (high < 0 || passes < high) {
                        int32_t again = push(b, site, below, high < 0 ? (passes + 1 < low ? passes + 1 : low) : passes + 1);
                        if (again < 0 || ints_push(nexts, b->span_start.a[f]) < 0 || ints_push(nexts, again) < 0)
                            return -1;
                    }
                }
            }
            for (Py_ssize_t i = 0; i < nexts->n; i += 2)
                if (reach(b, nexts->a[i], nexts->a[i + 1]) < 0)
                    return -1;
        }
        Py_ssize_t kept = 0;  /* those that read a byte or accept */
        for (Py_ssize_t i = 0; i < b->seen.n; i++) {
            int32_t s = b->seen.a[i];
            if (b->edge_n.a[b->pos_state.a[s]] || s == b->accept)
                b->seen.a[kept++] = s;
        }
        b->seen.n = kept;
        qsort(b->seen.a, kept, sizeof(int32_t), compare_ints);
    }
    if (ints_reserve(&b->closure_pool, b->seen.n) < 0)
        return -1;
    memcpy(b->closure_pool.a + b->closure_pool.n, b->seen.a, b->seen.n * sizeof(int32_t));
    b->closure_at.a[p] = (int32_t)b->closure_pool.n;
    b->closure_n.a[p] = (int32_t)b->seen.n;
    b->closure_pool.n += b->seen.n;
    return 0;
}

/* `ByteNFA.moves`: the byte-range edges out of ``p`` as (lo, hi, next position); memoized. */
int ss_moves(Builder *b, int32_t p) {
    if (b->moves_at.a[p] >= 0)
        return 0;
    int32_t state = b->pos_state.a[p], stack = b->pos_stack.a[p], n = b->edge_n.a[state];
    int32_t found[3 * 16], *out = n <= 16 ? found : PyMem_RawMalloc(3 * n * sizeof(int32_t));
    if (!out) {
        raise_anywhere(PyExc_MemoryError, NULL);
        return -1;
    }
    for (int32_t i = 0; i < n; i++) {
        const int32_t *e = b->edge_pool.a + b->edge_at.a[state] + 3 * i;
        out[3 * i] = e[0];
        out[3 * i + 1] = e[1];
        int32_t lo = e[0], hi = e[1], to = e[2];
        out[3 * i + 2] = position(b, to, stack);  /* (may grow the pools: `e` not read after) */
        if (out[3 * i + 2] < 0 || lo < 0 || hi > 255 || lo > hi) {
            if (out[3 * i + 2] >= 0)
                raise_anywhere(PyExc_ValueError, "an NFA edge's byte range is outside 0-255");
            if (out != found)
                PyMem_RawFree(out);
            return -1;
        }
    }
    int failed = ints_reserve(&b->moves_pool, 3 * n) < 0;
    if (!failed) {
        memcpy(b->moves_pool.a + b->moves_pool.n, out, 3 * n * sizeof(int32_t));
        b->moves_at.a[p] = (int32_t)b->moves_pool.n;
        b->moves_n.a[p] = n;
        b->moves_pool.n += 3 * n;
    }
    if (out != found)
        PyMem_RawFree(out);
    return failed ? -1 : 0;
}

