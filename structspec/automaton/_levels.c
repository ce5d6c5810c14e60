/* first_mask: a state's first mask once its region is known, in one call: the region shape's own tokens, its
 * leaving tokens walked trie level by level over the built DFA rows, only below live nodes, the GIL released over
 * the loops (under the DFA's lock), and the end tokens. Part of structspec.automaton._core. */
#include "_core.h"

enum { WALK_DONE, WALK_MISSING, WALK_BAD_ID, WALK_NO_MEMORY };

/* Room for ``need`` items in both arrays of a pair (nodes, states) holding ``*cap``; -1 where there is no memory. */
static int reserve(int32_t **nodes, int32_t **states, Py_ssize_t *cap, Py_ssize_t need) {
    Py_ssize_t size = *cap;
    while (size < need)
        size = size ? 2 * size : 64;
    if (size == *cap)
        return 0;
    int32_t *a = PyMem_RawRealloc(*nodes, size * 4);
    if (a)
        *nodes = a;
    int32_t *b = a ? PyMem_RawRealloc(*states, size * 4) : NULL;
    if (!b)
        return -1;
    *states = b;
    *cap = size;
    return 0;
}

/* The first index in [lo, n) of ``a`` (non-decreasing there, as a level's parents and ends are) not below ``v``,
 * galloping from ``lo``: the live nodes are met in ascending order, and where most of a level is live (a state
 * allowing almost every byte walks nearly the whole vocabulary) the next one is a step or two on, which a
 * bisection over the rest of the level would reach only after a dozen reads far apart. */
static Py_ssize_t lower_bound(const int64_t *a, Py_ssize_t lo, Py_ssize_t n, int64_t v) {
    Py_ssize_t step = 1;
    while (lo + step < n && a[lo + step] < v) {
        lo += step;
        step *= 2;
    }
    if (lo + step < n)
        n = lo + step + 1;
    while (lo < n) {
        Py_ssize_t mid = lo + (n - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            n = mid;
    }
    return lo;
}

/* Whether ``a[0:n]`` (non-decreasing) holds only nodes below ``nodes``, checked at its ends. */
static int holds_nodes(const int64_t *a, Py_ssize_t n, Py_ssize_t nodes) {
    return !n || (a[0] >= 0 && a[n - 1] < nodes);
}

/* Whether ``starts`` (``count`` + 1 offsets) cut ``[0, total)`` into levels. */
static int cuts(const int64_t *starts, Py_ssize_t count, Py_ssize_t total) {
    if (starts[0] != 0 || starts[count] != total)
        return 0;
    for (Py_ssize_t k = 0; k < count; k++)
        if (starts[k + 1] < starts[k])
            return 0;
    return 1;
}

/* A trie's six arrays (`_Trie`) viewed, and checked to cut into levels. */
typedef struct {
    Py_buffer b[6];
    int taken;
    const int64_t *parents, *ends, *ids, *node_starts, *end_starts;
    const unsigned char *bytes;
    Py_ssize_t count;
} Trie;

static void trie_drop(Trie *t) {
    for (int i = 0; i < t->taken; i++)
        PyBuffer_Release(&t->b[i]);
    t->taken = 0;
}

/* View ``trie`` (`_Trie`) and check that its levels cut its arrays and that every parent and every token's end
 * is a node (level 0's parents: the ``roots``); -1 and an exception if not. */
static int trie_take(PyObject *trie, Trie *t, Py_ssize_t roots) {
    static const Py_ssize_t sizes[6] = {8, 1, 8, 8, 8, 8};
    static const char *names[6] = {"parents", "bytes", "ends", "ids", "node_starts", "end_starts"};
    t->taken = 0;
    if (!PyTuple_Check(trie) || PyTuple_GET_SIZE(trie) != 6) {
        PyErr_SetString(PyExc_TypeError, "trie: (parents, bytes, ends, ids, node_starts, end_starts)");
        return -1;
    }
    for (; t->taken < 6; t->taken++)
        if (ss_view(PyTuple_GET_ITEM(trie, t->taken), &t->b[t->taken], sizes[t->taken], 0, names[t->taken]) < 0) {
            trie_drop(t);
            return -1;
        }
    t->parents = t->b[0].buf;
    t->bytes = t->b[1].buf;
    t->ends = t->b[2].buf;
    t->ids = t->b[3].buf;
    t->node_starts = t->b[4].buf;
    t->end_starts = t->b[5].buf;
    t->count = t->b[4].len / 8 - 1;
    const char *wrong = NULL;
    if (t->count < 0 || t->b[5].len != t->b[4].len || t->b[1].len * 8 != t->b[0].len || t->b[3].len != t->b[2].len
        || !cuts(t->node_starts, t->count, t->b[1].len) || !cuts(t->end_starts, t->count, t->b[3].len / 8))
        wrong = "trie: its levels do not cut its arrays";
    for (Py_ssize_t k = 0; k < t->count && !wrong; k++) {
        Py_ssize_t n = t->node_starts[k + 1] - t->node_starts[k];
        if (!holds_nodes(t->parents + t->node_starts[k], n, k ? t->node_starts[k] - t->node_starts[k - 1] : roots) ||
            !holds_nodes(t->ends + t->end_starts[k], t->end_starts[k + 1] - t->end_starts[k], n))
            wrong = "trie: a node's parent or a token's end is not a node";
    }
    if (wrong) {
        PyErr_SetString(PyExc_ValueError, wrong);
        trie_drop(t);
        return -1;
    }
    return 0;
}

/* Live nodes of one level (ascending) and their DFA states. */
typedef struct {
    int32_t *nodes, *states;
    Py_ssize_t n, cap;
} Live;

static void live_free(Live *v) {
    PyMem_RawFree(v->nodes);
    PyMem_RawFree(v->states);
}

/* The DFA's rows as the walk reads them, and the packed bits it sets. */
typedef struct {
    const int32_t *slot_of, *table;
    Py_ssize_t nslots, nrows;
    unsigned char *bits;
    Py_ssize_t nbits;
} Target;

/* The walk of ``t`` from level ``*at`` over the live nodes ``cur``, setting the bits of the tokens ending on live
 * nodes; runs without the GIL (no Python object touched). WALK_DONE: no node live, or the levels end.
 * WALK_MISSING: live nodes with children at level ``*at`` (``cur``) have no row built; the states to build are
 * ``next->states[0:*nmissing]``. */
static int walk_run(const Trie *t, Py_ssize_t *at, Live *cur, Live *next, Py_ssize_t *nmissing, const Target *g) {
    Py_ssize_t nm = 0;
    for (; *at < t->count && cur->n; (*at)++) {
        Py_ssize_t k = *at;
        const int64_t *up = t->parents + t->node_starts[k], *on = t->ends + t->end_starts[k];
        const int64_t *who = t->ids + t->end_starts[k];
        const unsigned char *by = t->bytes + t->node_starts[k];
        Py_ssize_t n = t->node_starts[k + 1] - t->node_starts[k], nends = t->end_starts[k + 1] - t->end_starts[k];
        Py_ssize_t nnext = 0;
        if (reserve(&next->nodes, &next->states, &next->cap, cur->n + 1) < 0)
            return WALK_NO_MEMORY;
        int32_t *missing = next->states;  /* (free until the children are found, not needed once states are missing) */
        /* the rows of the live nodes with children here (those the Python walk ensures: states numbered alike) */
        for (Py_ssize_t i = 0, j = 0; i < cur->n; i++) {
            int32_t s = cur->states[i];
            if (s == 0 || (s > 0 && s < g->nslots && g->slot_of[s] > 0 && g->slot_of[s] < g->nrows))
                continue;
            j = lower_bound(up, j, n, cur->nodes[i]);
            /* (repeats side by side dropped: `LazyDFA.ensure` takes each state once) */
            if (j < n && up[j] == cur->nodes[i] && (!nm || missing[nm - 1] != s))
                missing[nm++] = s;
        }
        if (nm) {
            *nmissing = nm;
            return WALK_MISSING;
        }
        Py_ssize_t j = 0;
        for (Py_ssize_t i = 0; i < cur->n; i++) {  /* each live node's children, in node order */
            int32_t node = cur->nodes[i];
            j = lower_bound(up, j, n, node);
            if (!cur->states[i] || j == n || up[j] != node)
                continue;  /* (dead, or no token goes on from it: its row may not be built) */
            const int32_t *row = g->table + (Py_ssize_t)g->slot_of[cur->states[i]] * 256;
            for (; j < n && up[j] == node; j++) {
                int32_t s = row[by[j]];
                if (s) {
                    if (nnext == next->cap && reserve(&next->nodes, &next->states, &next->cap, nnext + 1) < 0)
                        return WALK_NO_MEMORY;
                    next->nodes[nnext] = (int32_t)j;
                    next->states[nnext++] = s;
                }
            }
        }
        Py_ssize_t e = 0;
        for (Py_ssize_t i = 0; i < nnext; i++) {  /* the tokens ending on them */
            int32_t node = next->nodes[i];
            for (e = lower_bound(on, e, nends, node); e < nends && on[e] == node; e++) {
                int64_t id = who[e];
                if (id < 0 || id >= g->nbits)
                    return WALK_BAD_ID;
                g->bits[id >> 3] |= (unsigned char)(1u << (id & 7));
            }
        }
        next->n = nnext;
        Live swap = *cur;
        *cur = *next;
        *next = swap;
    }
    return WALK_DONE;
}

/* Views of the DFA's ``slots`` and ``rows`` arrays as read now (slots first: a slot set names a row of these rows
 * or of a later copy of them) into ``g``; ``views`` released by the caller. */
static int target_take(PyObject *slots_obj, PyObject *rows_obj, Py_buffer views[2], Target *g) {
    if (ss_view(slots_obj, &views[0], 4, 0, "slots") < 0)
        return -1;
    if (ss_view(rows_obj, &views[1], 4, 0, "rows") < 0) {
        PyBuffer_Release(&views[0]);
        return -1;
    }
    g->slot_of = views[0].buf;
    g->table = views[1].buf;
    g->nslots = views[0].len / 4;
    g->nrows = views[1].len / (4 * 256);
    return 0;
}

/* The exception of a walk's outcome (none for WALK_DONE and WALK_MISSING); -1 if one is set. */
static int walk_raise(int outcome) {
    if (outcome == WALK_NO_MEMORY)
        PyErr_NoMemory();
    else if (outcome == WALK_BAD_ID)
        PyErr_SetString(PyExc_ValueError, "found: a token id past its bits");
    else
        return 0;
    return -1;
}

/* A list of the ints ``a[0:n]``. */
static PyObject *int_list(const int32_t *a, Py_ssize_t n) {
    PyObject *list = PyList_New(n);
    for (Py_ssize_t i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromLong(a[i]);
        if (!v)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, i, v);
    }
    return list;
}

/* Call ``obj.name()`` and drop its result; -1 on an exception. */
static int call_method(PyObject *obj, const char *name) {
    PyObject *done = PyObject_CallMethod(obj, name, NULL);
    Py_XDECREF(done);
    return done ? 0 : -1;
}

/* first_mask(dfa, ensure, trie, base, exits, ends, width, found) -> bool.
 *
 * A state's first mask once its region is known, set in ``found`` (packed bits over token ids, little bit order,
 * zero or holding what `TokenIndex._from_loop` set): ``base`` (the shape's tokens that end in the region or on an
 * exit) ORed in; the tokens of ``trie`` that stay alive from the DFA states ``exits`` (a list, one per root); the
 * ids of ``ends`` (int32: the end tokens, in a final state; else empty). Returns whether a bit below ``width`` is
 * set. Changes ``found``; builds the rows it reaches (the table grows, the language does not).
 *
 * ``trie`` (`_Trie`: parents, bytes, ends, ids, node_starts, end_starts, int64 but bytes uint8) holds a region
 * shape's leaving tokens by byte position: level k's nodes are [node_starts[k], node_starts[k + 1]) of parents
 * and bytes, its tokens [end_starts[k], end_starts[k + 1]) of ends and ids, nodes numbered within their level
 * (level 0's parents: the exits, numbered from 0). Node i of a level reads ``bytes[i]`` from node ``parents[i]``
 * of the level before; a level's parents and ends are non-decreasing (nodes numbered by parent, then byte; ends
 * sorted), so a live node's children and tokens are found by bisection and a dead node's subtree is never read. A
 * token ending on a live node is allowed. The walk runs under ``dfa._lock`` (no row built, no array replaced while
 * it reads them without the GIL); where live nodes with children have no row built, it calls ``ensure(dfa,
 * states)`` on those states, without the lock, and goes on: the states `_walk_ids` ensures, in its order, so the
 * compiled and the Python walk number states alike. */
PyObject *ss_first_mask(PyObject *self, PyObject *args) {
    PyObject *dfa, *ensure, *trie_obj, *exits, *found_obj;
    Py_buffer base, ends, found;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OOOy*O!y*nO", &dfa, &ensure, &trie_obj, &base, &PyList_Type, &exits, &ends, &width,
                          &found_obj))
        return NULL;
    PyObject *result = NULL, *lock = NULL;
    Trie t = {0};
    Live cur = {0}, next = {0};
    int held = 0;
    if (ss_view(found_obj, &found, 1, 1, "found") < 0)
        goto release;
    held = 1;
    Py_ssize_t nexits = PyList_GET_SIZE(exits);
    if (base.len > found.len || ends.len % 4 || width < 0 || width > found.len * 8) {
        PyErr_SetString(PyExc_ValueError, "first_mask: base, ends or width do not fit found");
        goto release;
    }
    if (trie_take(trie_obj, &t, nexits) < 0 || !(lock = PyObject_GetAttrString(dfa, "_lock")))
        goto release;
    if (reserve(&cur.nodes, &cur.states, &cur.cap, nexits + 1) < 0) {
        PyErr_NoMemory();
        goto release;
    }
    for (Py_ssize_t i = 0; i < nexits; i++) {
        long s = PyLong_AsLong(PyList_GET_ITEM(exits, i));
        if (s == -1 && PyErr_Occurred())
            goto release;
        cur.nodes[i] = (int32_t)i;
        cur.states[i] = (int32_t)s;
    }
    cur.n = nexits;
    unsigned char *bits = found.buf;
    const unsigned char *own = base.buf;
    /* (lengths copied to locals whose address is never taken: else a byte store may alias them, and the loops
     * over the 19 KB of a 150k vocabulary's bits, re-reading them, would not vectorize) */
    const Py_ssize_t nbase = base.len, nbits = found.len * 8, whole = width / 8, part = width % 8;
    for (Py_ssize_t i = 0; i < nbase; i++)
        bits[i] |= own[i];
    Py_ssize_t at = 0;
    for (;;) {
        Py_buffer views[2];
        Target g = {.bits = bits, .nbits = nbits};
        Py_ssize_t nmissing = 0;
        int outcome = WALK_DONE;
        if (call_method(lock, "acquire") < 0)  /* no row built, no array replaced while the walk reads them */
            goto release;
        PyObject *slots = PyObject_GetAttrString(dfa, "slots"), *rows = slots ? PyObject_GetAttrString(dfa, "rows")
                                                                             : NULL;
        int viewed = rows && target_take(slots, rows, views, &g) == 0;
        Py_XDECREF(slots);
        Py_XDECREF(rows);
        if (viewed) {
            Py_BEGIN_ALLOW_THREADS
            outcome = walk_run(&t, &at, &cur, &next, &nmissing, &g);
            Py_END_ALLOW_THREADS
            PyBuffer_Release(&views[0]);
            PyBuffer_Release(&views[1]);
        }
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);  /* (released whatever happened) */
        int unlocked = call_method(lock, "release");
        if (type) {
            PyErr_Restore(type, value, trace);
            goto release;
        }
        if (unlocked < 0 || walk_raise(outcome) < 0)
            goto release;
        if (outcome == WALK_DONE)
            break;
        PyObject *missing = int_list(next.states, nmissing);
        PyObject *done = missing ? PyObject_CallFunctionObjArgs(ensure, dfa, missing, NULL) : NULL;
        Py_XDECREF(missing);
        if (!done)
            goto release;
        Py_DECREF(done);
    }
    const int32_t *end_ids = ends.buf;
    for (Py_ssize_t i = 0; i < ends.len / 4; i++) {
        int32_t id = end_ids[i];
        if (id < 0 || id >= nbits) {
            PyErr_SetString(PyExc_ValueError, "first_mask: an end token's id past found's bits");
            goto release;
        }
        bits[id >> 3] |= (unsigned char)(1u << (id & 7));
    }
    unsigned char any = 0;
    for (Py_ssize_t i = 0; i < whole; i++)  /* (no early exit: the loop vectorizes, and most masks are sparse) */
        any |= bits[i];
    if (part)
        any |= bits[whole] & ((1u << part) - 1);
    result = PyBool_FromLong(any != 0);
release:
    Py_XDECREF(lock);
    live_free(&cur);
    live_free(&next);
    trie_drop(&t);
    if (held)
        PyBuffer_Release(&found);
    PyBuffer_Release(&base);
    PyBuffer_Release(&ends);
    return result;
}
