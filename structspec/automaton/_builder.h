/* The row builder's state, shared by _closure.c (the NFA's positions and closures) and _subset.c (the DFA's
 * state sets and rows): growable int arrays, index tables, the `Builder` object itself.
 *
 * Rows are built with the GIL released (`build_rows`), so what runs there allocates with the raw allocator
 * (PyMem_Raw*, which needs no GIL) and takes the GIL only to raise (`raise_anywhere`) or to call Python. */
#ifndef STRUCTSPEC_BUILDER_H
#define STRUCTSPEC_BUILDER_H
#include "_core.h"

/* Set an exception (``type`` MemoryError: no memory; else ``message``) from code that may run with or without
 * the GIL: it is taken for the call if this thread released it. */
static inline void raise_anywhere(PyObject *type, const char *message) {
    PyGILState_STATE held = PyGILState_Ensure();
    if (type == PyExc_MemoryError)
        PyErr_NoMemory();
    else
        PyErr_SetString(type, message);
    PyGILState_Release(held);
}

/* A growable array of int32. */
typedef struct {
    int32_t *a;
    Py_ssize_t n, cap;
} Ints;

static inline int ints_reserve(Ints *v, Py_ssize_t extra) {
    if (v->n + extra <= v->cap)
        return 0;
    Py_ssize_t cap = v->cap ? v->cap : 64;
    while (cap < v->n + extra)
        cap *= 2;
    int32_t *a = PyMem_RawRealloc(v->a, cap * sizeof(int32_t));
    if (!a) {
        raise_anywhere(PyExc_MemoryError, NULL);
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
    /* scratch of a row; the rows a call built, as (state, slot) pairs, published once it holds the GIL again */
    Ints events, active, count, key, merged, todo, seen, nexts, rows_todo, finished;
};

static inline int table_grow(Builder *b, Table *t, hash_fn hash);

/* The slot holding the index whose key is ``key`` (``len`` ints), or the empty slot where it would go. */
static inline int32_t *table_find(const Builder *b, const Table *t, uint64_t h, same_fn same, const int32_t *key,
                           Py_ssize_t len) {
    size_t i = h & t->mask;
    while (t->slot[i] >= 0 && !same(b, t->slot[i], key, len))
        i = (i + 1) & t->mask;
    return &t->slot[i];
}

static inline int table_add(Builder *b, Table *t, int32_t index, uint64_t h, hash_fn hash) {
    if ((t->used + 1) * 2 > t->mask + 1 && table_grow(b, t, hash) < 0)
        return -1;
    size_t i = h & t->mask;
    while (t->slot[i] >= 0)
        i = (i + 1) & t->mask;
    t->slot[i] = index;
    t->used++;
    return 0;
}

static inline int table_grow(Builder *b, Table *t, hash_fn hash) {
    size_t size = t->slot ? (t->mask + 1) * 2 : 1024;
    int32_t *slot = PyMem_RawMalloc(size * sizeof(int32_t)), *old = t->slot;
    if (!slot) {
        raise_anywhere(PyExc_MemoryError, NULL);
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
    PyMem_RawFree(old);
    return 0;
}

static inline uint64_t hash_ints(const int32_t *key, Py_ssize_t len) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)len;
    for (Py_ssize_t i = 0; i < len; i++)
        h = mix(h ^ (uint32_t)key[i]) + 0x9e3779b97f4a7c15ULL;
    return h;
}

/* An int of a Python object, checked to fit an int32 (-1 and an exception otherwise; `*out` set). */
static inline int as_int32(PyObject *obj, int32_t *out) {
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
static inline int tuple_ints(PyObject *t, int32_t *out, Py_ssize_t n) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != n) {
        PyErr_SetString(PyExc_TypeError, "the automaton holds an item of an unexpected shape");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (as_int32(PyTuple_GET_ITEM(t, i), &out[i]) < 0)
            return -1;
    return 0;
}

/* A Python tuple of ``n`` ints, added to ``list`` and as the key of ``index`` in ``dict`` (the GIL held). */
static inline int record(PyObject *list, PyObject *dict, const int32_t *items, Py_ssize_t n, Py_ssize_t index) {
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

static inline int compare_ints(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, c = *(const int32_t *)y;
    return (a > c) - (a < c);
}


/* _closure.c: mirror the NFA's states, stacks and positions Python added since the last call, and record in
 * Python those the builder added since (both with the GIL); `ByteNFA.closure` and `ByteNFA.moves` of a
 * position, memoized in `b` (the GIL released or not). Each: 0, or -1 and an exception. */
int ss_mirror_positions(Builder *b);
int ss_record_positions(Builder *b);
int ss_closure(Builder *b, int32_t p);
int ss_moves(Builder *b, int32_t p);

#endif
