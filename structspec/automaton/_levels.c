/* walk_levels: a region shape's leaving tokens walked trie level by level over the built DFA rows, only below
 * live nodes, the GIL released over the loops (the caller holds the DFA's lock). Part of structspec.automaton._core. */
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

/* walk_levels(trie, first, nodes, states, slots, rows, found) -> None or (level, nodes, states, missing).
 *
 * ``trie`` (`_Trie`: parents, bytes, ends, ids, node_starts, end_starts, int64 but bytes uint8) holds a region
 * shape's leaving tokens by byte position: level k's nodes are [node_starts[k], node_starts[k + 1]) of parents
 * and bytes, its tokens [end_starts[k], end_starts[k + 1]) of ends and ids, nodes numbered within their level.
 * Walked level by level from ``first`` over live nodes only: ``nodes`` (int32, ascending) are the live nodes of
 * the level before (``first`` 0: the exits, numbered from 0) and ``states`` (int32) their DFA states. Node i of
 * a level reads ``bytes[i]`` from node ``parents[i]`` of the level before; a level's parents and ends are
 * non-decreasing (nodes numbered by parent, then byte; ends sorted), so a live node's children and tokens are
 * found by bisection and a dead node's subtree is never read. A token ending on a live node is allowed: its bit
 * (little bit order) is set in ``found``. Stops when no node is live or the levels end (None), or where live
 * nodes with children have no row built: (that level, its live ``nodes`` and ``states`` as int32 bytes, the
 * states to build), to be called again from there once they are. */
PyObject *ss_walk_levels(PyObject *self, PyObject *args) {
    PyObject *trie, *objs[6], *slots_obj, *rows_obj, *found_obj;
    Py_buffer b[6], start_nodes, start, slots, rows, found;
    static const Py_ssize_t sizes[6] = {8, 1, 8, 8, 8, 8};
    static const char *names[6] = {"parents", "bytes", "ends", "ids", "node_starts", "end_starts"};
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "Ony*y*OOO", &trie, &first, &start_nodes, &start, &slots_obj, &rows_obj,
                          &found_obj))
        return NULL;
    PyObject *result = NULL;
    int taken = 0, held = 0;
    if (!PyTuple_Check(trie) || PyTuple_GET_SIZE(trie) != 6) {
        PyErr_SetString(PyExc_TypeError, "trie: (parents, bytes, ends, ids, node_starts, end_starts)");
        goto release;
    }
    for (; taken < 6; taken++) {
        objs[taken] = PyTuple_GET_ITEM(trie, taken);
        if (ss_view(objs[taken], &b[taken], sizes[taken], 0, names[taken]) < 0)
            goto release;
    }
    if (start_nodes.len != start.len || start.len % 4) {
        PyErr_SetString(PyExc_ValueError, "nodes and states: int32, as many of each");
        goto release;
    }
    const int64_t *parents = b[0].buf, *ends = b[2].buf, *ids = b[3].buf, *node_starts = b[4].buf;
    const int64_t *end_starts = b[5].buf;
    const unsigned char *bytes = b[1].buf;
    Py_ssize_t count = b[4].len / 8 - 1;
    if (count < 0 || b[5].len != b[4].len || b[1].len * 8 != b[0].len || b[3].len != b[2].len ||
        !cuts(node_starts, count, b[1].len) || !cuts(end_starts, count, b[3].len / 8)) {
        PyErr_SetString(PyExc_ValueError, "trie: its levels do not cut its arrays");
        goto release;
    }
    if (first < 0 || first > count) {
        PyErr_SetString(PyExc_ValueError, "first: not a level");
        goto release;
    }
    Py_ssize_t ncur = start.len / 4, cap_cur = 0, cap_next = 0;
    const int32_t *given = start_nodes.buf;
    /* the nodes of the level before the first: the roots given (the exits), or that level's */
    Py_ssize_t before = ncur ? given[ncur - 1] + 1 : 0;
    if (first > 0 && node_starts[first] - node_starts[first - 1] > before)
        before = node_starts[first] - node_starts[first - 1];
    for (Py_ssize_t k = first; k < count; k++) {
        Py_ssize_t n = node_starts[k + 1] - node_starts[k];
        if (!holds_nodes(parents + node_starts[k], n, k > first ? node_starts[k] - node_starts[k - 1] : before) ||
            !holds_nodes(ends + end_starts[k], end_starts[k + 1] - end_starts[k], n)) {
            PyErr_SetString(PyExc_ValueError, "trie: a node's parent or a token's end is not a node");
            goto release;
        }
    }
    if (ss_view(slots_obj, &slots, 4, 0, "slots") < 0)
        goto release;
    if (ss_view(rows_obj, &rows, 4, 0, "rows") < 0) {
        PyBuffer_Release(&slots);
        goto release;
    }
    if (ss_view(found_obj, &found, 1, 1, "found") < 0) {
        PyBuffer_Release(&rows);
        PyBuffer_Release(&slots);
        goto release;
    }
    held = 1;
    /* (sized by the live nodes, not by the levels: a walk reads few of a large trie's nodes) */
    int32_t *cur_nodes = NULL, *cur = NULL, *next_nodes = NULL, *next = NULL, *missing = NULL;
    if (reserve(&cur_nodes, &cur, &cap_cur, ncur + 1) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(cur_nodes, start_nodes.buf, ncur * 4);
    memcpy(cur, start.buf, ncur * 4);
    Py_ssize_t nmissing = 0, at = first;
    int outcome = WALK_DONE;
    {
        const int32_t *slot_of = slots.buf, *table = rows.buf;
        unsigned char *bits = found.buf;
        Py_ssize_t nslots = slots.len / 4, nrows = rows.len / (4 * 256), nbits = found.len * 8;
        Py_BEGIN_ALLOW_THREADS
        for (at = first; at < count && ncur; at++) {
            const int64_t *up = parents + node_starts[at], *on = ends + end_starts[at], *who = ids + end_starts[at];
            const unsigned char *by = bytes + node_starts[at];
            Py_ssize_t n = node_starts[at + 1] - node_starts[at], nends = end_starts[at + 1] - end_starts[at];
            Py_ssize_t nnext = 0;
            if (reserve(&next_nodes, &next, &cap_next, ncur + 1) < 0) {
                outcome = WALK_NO_MEMORY;
                break;
            }
            missing = next;  /* (free until the children are found, and not needed once states are missing) */
            /* the rows of the live nodes with children here (those the Python walk ensures: states numbered alike) */
            for (Py_ssize_t i = 0, j = 0; i < ncur; i++) {
                int32_t s = cur[i];
                if (s == 0 || (s > 0 && s < nslots && slot_of[s] > 0 && slot_of[s] < nrows))
                    continue;
                j = lower_bound(up, j, n, cur_nodes[i]);
                /* (repeats side by side dropped: `LazyDFA.ensure` takes each state once) */
                if (j < n && up[j] == cur_nodes[i] && (!nmissing || missing[nmissing - 1] != s))
                    missing[nmissing++] = s;
            }
            if (nmissing) {
                outcome = WALK_MISSING;
                break;
            }
            Py_ssize_t j = 0;
            for (Py_ssize_t i = 0; i < ncur; i++) {  /* each live node's children, in node order */
                int32_t node = cur_nodes[i];
                j = lower_bound(up, j, n, node);
                if (!cur[i] || j == n || up[j] != node)
                    continue;  /* (dead, or no token goes on from it: its row may not be built) */
                const int32_t *row = table + (Py_ssize_t)slot_of[cur[i]] * 256;
                for (; j < n && up[j] == node; j++) {
                    int32_t t = row[by[j]];
                    if (t) {
                        if (nnext == cap_next && reserve(&next_nodes, &next, &cap_next, nnext + 1) < 0) {
                            outcome = WALK_NO_MEMORY;
                            break;
                        }
                        next_nodes[nnext] = (int32_t)j;
                        next[nnext++] = t;
                    }
                }
            }
            if (outcome != WALK_DONE)
                break;
            Py_ssize_t e = 0;
            for (Py_ssize_t k = 0; k < nnext && outcome == WALK_DONE; k++) {  /* the tokens ending on them */
                int32_t node = next_nodes[k];
                for (e = lower_bound(on, e, nends, node); e < nends && on[e] == node; e++) {
                    int64_t id = who[e];
                    if (id < 0 || id >= nbits) {
                        outcome = WALK_BAD_ID;
                        break;
                    }
                    bits[id >> 3] |= (unsigned char)(1u << (id & 7));
                }
            }
            if (outcome != WALK_DONE)
                break;
            int32_t *swap = cur;
            cur = next;
            next = swap;
            swap = cur_nodes;
            cur_nodes = next_nodes;
            next_nodes = swap;
            Py_ssize_t cap = cap_cur;
            cap_cur = cap_next;
            cap_next = cap;
            ncur = nnext;
        }
        Py_END_ALLOW_THREADS
    }
    if (outcome == WALK_NO_MEMORY) {
        PyErr_NoMemory();
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
                result = Py_BuildValue("ny#y#N", at, (const char *)cur_nodes, ncur * 4, (const char *)cur,
                                       ncur * 4, list);
            else
                Py_DECREF(list);
        }
    }
done:
    PyMem_RawFree(cur_nodes);
    PyMem_RawFree(cur);
    PyMem_RawFree(next_nodes);
    PyMem_RawFree(next);
release:
    if (held) {
        PyBuffer_Release(&found);
        PyBuffer_Release(&rows);
        PyBuffer_Release(&slots);
    }
    for (int i = 0; i < taken; i++)
        PyBuffer_Release(&b[i]);
    PyBuffer_Release(&start_nodes);
    PyBuffer_Release(&start);
    return result;
}
