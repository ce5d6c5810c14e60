/* Builder: a `LazyDFA`'s rows built from its `ByteNFA` in C (the subset construction over byte ranges), the
 * Python `LazyDFA._build` and `ByteNFA.closure`/`moves` being the reference. Part of structspec.automaton._core.
 *
 * The Python structures stay the automaton's record: the builder mirrors them (the NFA's states, edges, calls
 * and fragment spans; its positions and stacks; the DFA's state sets), reading what Python added since its
 * last call, and writes what it adds back into them as it goes (a position, a stack, a state set), numbered
 * exactly as the Python automaton numbers them: closures are walked in the same order and rows interned byte
 * range by byte range, ascending. So either side may go on where the other stopped, pickles hold what they
 * held, and one NFA may serve several DFAs. A fragment not built yet is built by Python (`ByteNFA._span`) when
 * a closure first enters it. The caller holds the DFA's lock; the GIL is held throughout (the builder calls
 * back into Python). */
#include "_core.h"

/* A growable array of int32. */
typedef struct {
    int32_t *a;
    Py_ssize_t n, cap;
} Ints;

static int ints_reserve(Ints *v, Py_ssize_t extra) {
    if (v->n + extra <= v->cap)
        return 0;
    Py_ssize_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra)
        cap *= 2;
    int32_t *a = PyMem_Realloc(v->a, cap * sizeof(int32_t));
    if (!a) {
        PyErr_NoMemory();
        return -1;
    }
    v->a = a;
    v->cap = cap;
    return 0;
}

static inline int ints_push(Ints *v, int32_t x) {
    if (v->n == v->cap && ints_reserve(v, 1) < 0)
        return -1;
    v->a[v->n++] = x;
    return 0;
}

/* An open-addressing table of indices (-1: empty) into arrays the caller compares keys against. */
typedef struct {
    int32_t *slot;
    size_t mask, used;
} Table;

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

typedef struct Builder Builder;
typedef int (*same_fn)(const Builder *, int32_t index, const int32_t *key, Py_ssize_t len);
typedef uint64_t (*hash_fn)(const Builder *, int32_t index);

struct Builder {
    PyObject_HEAD
    /* the Python structures mirrored (read since the last call) and extended */
    PyObject *edges, *eps, *calls, *spans, *span;            /* ByteNFA.edges, .eps, .calls, ._spans, ._span */
    PyObject *positions, *position_ids, *stacks, *stack_ids;  /* ByteNFA._positions, ... */
    PyObject *sets, *ids;                                     /* LazyDFA._sets, ._ids */
    PyObject *fragments, *fragment_ids;                       /* fragment keys met, by index, and key -> index */
    int32_t accept;
    /* NFA states: edges (lo, hi, to) and epsilon targets at offsets into pools; call index or -1 */
    Ints edge_at, edge_n, edge_pool, eps_at, eps_n, eps_pool, call_of;
    /* calls: fragment, return state, least passes, most passes (-1: unbounded); fragments' spans (-1: not known) */
    Ints call_fragment, call_back, call_low, call_high, span_start, span_end;
    /* positions (state, stack), stacks (site, below, passes), DFA state sets (ascending positions) */
    Ints pos_state, pos_stack, stack_site, stack_below, stack_passes, set_at, set_n, set_pool;
    Table pos_table, stack_table, set_table;
    /* per position, memoized: closure and moves (lo, hi, to) at offsets into pools (-1: not yet) */
    Ints closure_at, closure_n, closure_pool, moves_at, moves_n, moves_pool;
    Ints mark; /* per position: the walk that last saw it */
    int32_t walk;
    /* scratch of a row */
    Ints events, active, count, key, merged, todo, seen, nexts, rows_todo;
};

static int table_grow(Builder *b, Table *t, hash_fn hash);

/* The slot holding the index whose key is ``key`` (``len`` ints), or the empty slot where it would go. */
static int32_t *table_find(const Builder *b, const Table *t, uint64_t h, same_fn same, const int32_t *key,
                           Py_ssize_t len) {
    size_t i = h & t->mask;
    while (t->slot[i] >= 0 && !same(b, t->slot[i], key, len))
        i = (i + 1) & t->mask;
    return &t->slot[i];
}

static int table_add(Builder *b, Table *t, int32_t index, uint64_t h, hash_fn hash) {
    if ((t->used + 1) * 2 > t->mask + 1 && table_grow(b, t, hash) < 0)
        return -1;
    size_t i = h & t->mask;
    while (t->slot[i] >= 0)
        i = (i + 1) & t->mask;
    t->slot[i] = index;
    t->used++;
    return 0;
}

static int table_grow(Builder *b, Table *t, hash_fn hash) {
    size_t size = t->slot ? (t->mask + 1) * 2 : 1024;
    int32_t *slot = PyMem_Malloc(size * sizeof(int32_t)), *old = t->slot;
    if (!slot) {
        PyErr_NoMemory();
        return -1;
    }
    memset(slot, 0xff, size * sizeof(int32_t));
    size_t old_size = old ? t->mask + 1 : 0;
    t->slot = slot;
    t->mask = size - 1;
    for (size_t i = 0; i < old_size; i++)
        if (old[i] >= 0) {
            size_t j = hash(b, old[i]) & t->mask;
            while (slot[j] >= 0)
                j = (j + 1) & t->mask;
            slot[j] = old[i];
        }
    PyMem_Free(old);
    return 0;
}

static inline uint64_t hash_ints(const int32_t *key, Py_ssize_t len) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)len;
    for (Py_ssize_t i = 0; i < len; i++)
        h = mix(h ^ (uint32_t)key[i]) + 0x9e3779b97f4a7c15ULL;
    return h;
}

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
static uint64_t set_hash(const Builder *b, int32_t d) {
    return hash_ints(b->set_pool.a + b->set_at.a[d], b->set_n.a[d]);
}
static int set_same(const Builder *b, int32_t d, const int32_t *key, Py_ssize_t len) {
    return b->set_n.a[d] == len && !memcmp(b->set_pool.a + b->set_at.a[d], key, len * sizeof(int32_t));
}

/* An int of a Python object, checked to fit an int32 (-1 and an exception otherwise; `*out` set). */
static int as_int32(PyObject *obj, int32_t *out) {
    long v = PyLong_AsLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_SetString(PyExc_OverflowError, "the automaton outgrew the compiled core's int32 numbering");
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

/* Ints of a tuple of ``n`` ints. */
static int tuple_ints(PyObject *t, int32_t *out, Py_ssize_t n) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
        PyErr_SetString(PyExc_TypeError, "the automaton holds an item of an unexpected shape");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (as_int32(PyTuple_GET_ITEM(t, i), &out[i]) < 0)
            return -1;
    return 0;
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

static int add_set(Builder *b, const int32_t *positions, Py_ssize_t len, uint64_t h) {
    int32_t d = (int32_t)b->set_at.n;
    if (ints_push(&b->set_at, (int32_t)b->set_pool.n) < 0 || ints_push(&b->set_n, (int32_t)len) < 0 ||
        ints_reserve(&b->set_pool, len) < 0)
        return -1;
    memcpy(b->set_pool.a + b->set_pool.n, positions, len * sizeof(int32_t));
    b->set_pool.n += len;
    return table_add(b, &b->set_table, d, h, set_hash);
}

/* Mirror what Python added since the last call: NFA states, stacks, positions, DFA state sets. */
static int mirror(Builder *b) {
    int32_t item[3];
    if (sync_states(b) < 0)
        return -1;
    for (Py_ssize_t k = b->stack_site.n; k < PyList_GET_SIZE(b->stacks); k++)
        if (tuple_ints(PyList_GET_ITEM(b->stacks, k), item, 3) < 0 || add_stack(b, item[0], item[1], item[2]) < 0)
            return -1;
    for (Py_ssize_t p = b->pos_state.n; p < PyList_GET_SIZE(b->positions); p++)
        if (tuple_ints(PyList_GET_ITEM(b->positions, p), item, 2) < 0 || add_position(b, item[0], item[1]) < 0)
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
    return grow_position_memos(b);
}

/* A Python tuple of ``n`` ints, added to ``list`` and as the key of ``index`` in ``dict``. */
static int record(PyObject *list, PyObject *dict, const int32_t *items, Py_ssize_t n, Py_ssize_t index) {
    PyObject *t = PyTuple_New(n), *i = NULL;
    if (!t)
        return -1;
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *v = PyLong_FromLong(items[k]);
        if (!v) {
            Py_DECREF(t);
            return -1;
        }
        PyTuple_SET_ITEM(t, k, v);
    }
    PyObject_GC_UnTrack(t);  /* (ints only: no cycle through it, so the collector need not walk it) */
    int failed = (i = PyLong_FromSsize_t(index)) == NULL || PyList_Append(list, t) < 0 || PyDict_SetItem(dict, t, i) < 0;
    Py_XDECREF(i);
    Py_DECREF(t);
    return failed ? -1 : 0;
}

/* The position (state, stack), numbered (here and in Python) when first met; -1 and an exception on failure. */
static int32_t position(Builder *b, int32_t state, int32_t stack) {
    int32_t key[2] = {state, stack};
    int32_t *slot = table_find(b, &b->pos_table, hash_ints(key, 2), pos_same, key, 2);
    if (*slot >= 0)
        return *slot;
    int32_t p = (int32_t)b->pos_state.n;
    if (add_position(b, state, stack) < 0 || record(b->positions, b->position_ids, key, 2, p) < 0 ||
        grow_position_memos(b) < 0)
        return -1;
    return p;
}

/* The stack (site, below, passes), numbered when first met, as `ByteNFA._push`. */
static int32_t push(Builder *b, int32_t site, int32_t below, int32_t passes) {
    int32_t key[3] = {site, below, passes};
    int32_t *slot = table_find(b, &b->stack_table, hash_ints(key, 3), stack_same, key, 3);
    if (*slot >= 0)
        return *slot;
    int32_t k = (int32_t)b->stack_site.n;
    if (add_stack(b, site, below, passes) < 0 || record(b->stacks, b->stack_ids, key, 3, k) < 0)
        return -1;
    return k;
}

/* Fragment ``f``'s start and end states, built by Python (`ByteNFA._span`) when first needed. */
static int span(Builder *b, int32_t f) {
    if (b->span_start.a[f] >= 0)
        return 0;
    PyObject *key = PyList_GET_ITEM(b->fragments, f);
    PyObject *found = PyDict_GetItemWithError(b->spans, key);
    if (found)
        Py_INCREF(found);
    else if (PyErr_Occurred() || !(found = PyObject_CallOneArg(b->span, key)))
        return -1;
    int32_t ends[2];
    int failed = tuple_ints(found, ends, 2) < 0 || sync_states(b) < 0;
    Py_DECREF(found);
    if (failed)
        return -1;
    b->span_start.a[f] = ends[0];
    b->span_end.a[f] = ends[1];
    return 0;
}

static int compare_ints(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, c = *(const int32_t *)y;
    return (a > c) - (a < c);
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
static int closure(Builder *b, int32_t p) {
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
static int moves(Builder *b, int32_t p) {
    if (b->moves_at.a[p] >= 0)
        return 0;
    int32_t state = b->pos_state.a[p], stack = b->pos_stack.a[p], n = b->edge_n.a[state];
    int32_t found[3 * 16], *out = n <= 16 ? found : PyMem_Malloc(3 * n * sizeof(int32_t));
    if (!out) {
        PyErr_NoMemory();
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
                PyErr_SetString(PyExc_ValueError, "an NFA edge's byte range is outside 0-255");
            if (out != found)
                PyMem_Free(out);
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
        PyMem_Free(out);
    return failed ? -1 : 0;
}

/* The DFA state of the positions `key` (ascending, each once) enter: their closures' union, interned (a new
 * state is added to the Python sets too). -1 and an exception on failure. */
static int32_t enter(Builder *b) {
    Py_ssize_t n = b->key.n;
    for (Py_ssize_t i = 0; i < n; i++)  /* every closure first, in order: they number positions as Python's do */
        if (closure(b, b->key.a[i]) < 0)
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
    if (record(b->sets, b->ids, b->set_pool.a + b->set_at.a[d], len, d) < 0)
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
        if (moves(b, b->set_pool.a[b->set_at.a[d] + i]) < 0)
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
 * next row interns (up to 256 new ones): grow them and call again. */
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
    if (mirror(b) < 0 || unbuilt_into(states, &built, &b->rows_todo) < 0)
        goto done;
    for (; at < b->rows_todo.n; at++) {
        if (used >= nrows || b->set_at.n + 256 >= room)
            break;
        int32_t d = b->rows_todo.a[at];
        if (d >= b->set_at.n || used < 1) {
            PyErr_SetString(PyExc_ValueError, "build_rows: not a DFA state, or row 0 (the dead row) taken");
            goto done;
        }
        if (build_row(b, d, table + used * 256) < 0)
            goto done;
        slot_of[d] = (int32_t)used++;  /* (after the row is written: a set slot is a written row) */
        is_built[d] = 1;
    }
    result = Py_BuildValue("Nn", PyBool_FromLong(at == b->rows_todo.n), used);
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
                   &b->merged, &b->todo, &b->seen, &b->nexts, &b->rows_todo};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) {
        PyMem_Free(all[i]->a);
        all[i]->a = NULL;
        all[i]->n = all[i]->cap = 0;
    }
    Table *tables[] = {&b->pos_table, &b->stack_table, &b->set_table};
    for (size_t i = 0; i < 3; i++) {
        PyMem_Free(tables[i]->slot);
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
