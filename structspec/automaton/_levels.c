/* walk_levels: a region shape's leaving tokens walked trie level by level over the built DFA rows, only below
 * live nodes, the GIL released over the loops (the caller holds the DFA's lock). Part of structspec.automaton._core. */
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

/* The first index from ``lo`` of a level's ``a`` (non-decreasing, as a trie's parents and ends are) not below
 * ``v``. */
static Py_ssize_t lower_bound(const Py_buffer *a, Py_ssize_t lo, Py_ssize_t n, int64_t v) {
    while (lo < n) {
        Py_ssize_t mid = lo + (n - lo) / 2;
        if (at_index(a, mid) < v)
            lo = mid + 1;
        else
            n = mid;
    }
    return lo;
}

/* Whether a level's ``a`` (n items) holds only nodes below ``nodes``, checked at its ends (it is non-decreasing). */
static int holds_nodes(const Py_buffer *a, Py_ssize_t n, Py_ssize_t nodes) {
    return !n || (at_index(a, 0) >= 0 && at_index(a, n - 1) < nodes);
}

/* walk_levels(levels, first, nodes, states, slots, rows, found) -> None or (level, nodes, states, missing).
 *
 * The trie of a region shape's leaving tokens, level by level from ``first``, over its live nodes only: ``nodes``
 * (int32, ascending) are the live nodes of the level before (``first`` 0: the exits, numbered from 0) and
 * ``states`` (int32) their DFA states. Node i of a level reads ``bytes[i]`` from node ``parents[i]`` of the
 * level before; a level's ``parents`` and ``ends`` are non-decreasing (the trie numbers its nodes by parent, then
 * byte; `_VocabBytes._trie` sorts the ends), so a live node's children and tokens are found by bisection and a
 * dead node's subtree is never read. The token ``ids[k]`` ending on node ``ends[k]`` is allowed when that node is
 * live: its bit (little bit order) is set in ``found``. Stops when no node is live or the levels end (None), or
 * where live nodes' states have no row built: (that level, its live ``nodes`` and ``states`` as int32 bytes, the
 * states to build), to be called again from there once they are. */
PyObject *ss_walk_levels(PyObject *self, PyObject *args) {
    PyObject *levels_obj, *slots_obj, *rows_obj, *found_obj;
    Py_buffer start_nodes, start, slots, rows, found;
    Py_ssize_t first;
    if (!PyArg_ParseTuple(args, "Ony*y*OOO", &levels_obj, &first, &start_nodes, &start, &slots_obj, &rows_obj,
                          &found_obj))
        return NULL;
    PyObject *seq = NULL, *result = NULL;
    Level *levels = NULL;
    Py_ssize_t total = 0, count = 0;
    int held = 0;
    if (start_nodes.len != start.len || start.len % 4) {
        PyErr_SetString(PyExc_ValueError, "nodes and states: int32, as many of each");
        goto release;
    }
    seq = PySequence_Fast(levels_obj, "levels must be a sequence");
    if (!seq)
        goto release;
    total = PySequence_Fast_GET_SIZE(seq);
    if (first < 0 || first > total) {
        PyErr_SetString(PyExc_ValueError, "first: not a level");
        goto release;
    }
    levels = take_levels(seq, first, total, &count);
    if (!levels)
        goto release;
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

    Py_ssize_t ncur = start.len / 4, cap_cur = 0, cap_next = 0;
    const int32_t *given = start_nodes.buf;
    /* the nodes of the level before the first: the roots given (the exits), or that level's */
    Py_ssize_t before = ncur ? given[ncur - 1] + 1 : 0;
    if (first > 0) {
        PyObject *level = PySequence_Fast_GET_ITEM(seq, first - 1);
        Py_ssize_t len = PyTuple_Check(level) && PyTuple_GET_SIZE(level) == 4
                         ? PyObject_Length(PyTuple_GET_ITEM(level, 1)) : -1;
        if (len < 0) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_TypeError, "levels: each level must be a 4-tuple (parents, bytes, ends, ids)");
            goto release;
        }
        before = len > before ? len : before;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t n = levels[i].bytes.len, nends = levels[i].ends.len / levels[i].ends.itemsize;
        if (!holds_nodes(&levels[i].parents, n, i ? levels[i - 1].bytes.len : before) ||
            !holds_nodes(&levels[i].ends, nends, n)) {
            PyErr_SetString(PyExc_ValueError, "levels: a node's parent or a token's end is not a node");
            goto release;
        }
    }
    /* (sized by the live nodes, not by the levels: a walk reads few of a large trie's nodes) */
    int32_t *cur_nodes = NULL, *cur = NULL, *next_nodes = NULL, *next = NULL, *missing = NULL;
    if (reserve(&cur_nodes, &cur, &cap_cur, ncur + 1) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(cur_nodes, start_nodes.buf, ncur * 4);
    memcpy(cur, start.buf, ncur * 4);
    Py_ssize_t nmissing = 0, at = 0;
    int outcome = WALK_DONE;
    {
        const int32_t *slot_of = slots.buf, *table = rows.buf;
        unsigned char *bits = found.buf;
        Py_ssize_t nslots = slots.len / 4, nrows = rows.len / (4 * 256), nbits = found.len * 8;
        Py_BEGIN_ALLOW_THREADS
        for (at = 0; at < count && ncur; at++) {
            const Level *l = &levels[at];
            const unsigned char *bytes = l->bytes.buf;
            Py_ssize_t n = l->bytes.len, nends = l->ends.len / l->ends.itemsize, nnext = 0;
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
                j = lower_bound(&l->parents, j, n, cur_nodes[i]);
                /* (repeats side by side dropped: `LazyDFA.ensure` takes each state once) */
                if (j < n && at_index(&l->parents, j) == cur_nodes[i] && (!nmissing || missing[nmissing - 1] != s))
                    missing[nmissing++] = s;
            }
            if (nmissing) {
                outcome = WALK_MISSING;
                break;
            }
            Py_ssize_t j = 0;
            for (Py_ssize_t i = 0; i < ncur; i++) {  /* each live node's children, in node order */
                int32_t node = cur_nodes[i];
                j = lower_bound(&l->parents, j, n, node);
                if (!cur[i] || j == n || at_index(&l->parents, j) != node)
                    continue;  /* (dead, or no token goes on from it: its row may not be built) */
                const int32_t *row = table + (Py_ssize_t)slot_of[cur[i]] * 256;
                for (; j < n && at_index(&l->parents, j) == node; j++) {
                    int32_t t = row[bytes[j]];
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
                for (e = lower_bound(&l->ends, e, nends, node); e < nends && at_index(&l->ends, e) == node; e++) {
                    int64_t id = at_index(&l->ids, e);
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
                result = Py_BuildValue("ny#y#N", first + at, (const char *)cur_nodes, ncur * 4, (const char *)cur,
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
    if (levels)
        release_levels(levels, count);
    Py_XDECREF(seq);
    PyBuffer_Release(&start_nodes);
    PyBuffer_Release(&start);
    return result;
}
