/* region: a state's region over a `LazyDFA`'s built rows, as a canonical table (`_region` in index.py; its Python
 * loops are the reference, and this asks the DFA to build the rows it reads exactly as they do, so both number
 * states alike). Part of structspec.automaton._core. */
#include "_core.h"

/* The DFA's rows as read now (``slots`` read before ``rows``: a slot set names a row of these rows or of a later
 * copy of them), and how to have more built: ``ensure(dfa, states)`` (`LazyDFA.ensure` of a list). */
typedef struct {
    PyObject *dfa, *ensure;
    Py_buffer slots, rows;
    int held;
    const int32_t *slot_of, *table;
    Py_ssize_t nslots, nrows;
} Rows;

static void rows_drop(Rows *r) {
    if (r->held) {
        PyBuffer_Release(&r->slots);
        PyBuffer_Release(&r->rows);
        r->held = 0;
    }
}

static int rows_take(Rows *r) {
    PyObject *slots = PyObject_GetAttrString(r->dfa, "slots");
    if (!slots)
        return -1;
    PyObject *rows = PyObject_GetAttrString(r->dfa, "rows");
    int failed = !rows || ss_view(slots, &r->slots, 4, 0, "slots") < 0;
    if (!failed && ss_view(rows, &r->rows, 4, 0, "rows") < 0) {
        PyBuffer_Release(&r->slots);
        failed = 1;
    }
    Py_DECREF(slots);
    Py_XDECREF(rows);
    if (failed)
        return -1;
    r->held = 1;
    r->slot_of = r->slots.buf;
    r->table = r->rows.buf;
    r->nslots = r->slots.len / 4;
    r->nrows = r->rows.len / (4 * 256);
    return 0;
}

static int is_built(const Rows *r, int32_t d) {
    return d == 0 || (d > 0 && d < r->nslots && r->slot_of[d] > 0 && r->slot_of[d] < r->nrows);
}

/* Row ``d`` (a state not built reads the dead row, as `LazyDFA.table` does). */
static const int32_t *row_of(const Rows *r, int32_t d) {
    return r->table + (is_built(r, d) ? (Py_ssize_t)r->slot_of[d] * 256 : 0);
}

/* `LazyDFA.ensure` of ``states`` where one of them is not built (else the call would build nothing). */
static int need(Rows *r, const int32_t *states, Py_ssize_t n) {
    Py_ssize_t i = 0;
    while (i < n && is_built(r, states[i]))
        i++;
    if (i == n)
        return 0;
    PyObject *list = PyList_New(n);
    for (Py_ssize_t k = 0; list && k < n; k++) {
        PyObject *v = PyLong_FromLong(states[k]);
        if (!v)
            Py_CLEAR(list);
        else
            PyList_SET_ITEM(list, k, v);
    }
    if (!list)
        return -1;
    rows_drop(r);  /* (building may replace the arrays) */
    PyObject *done = PyObject_CallFunctionObjArgs(r->ensure, r->dfa, list, NULL);
    Py_DECREF(list);
    if (!done || rows_take(r) < 0) {
        Py_XDECREF(done);
        return -1;
    }
    Py_DECREF(done);
    for (i = 0; i < n; i++)
        if (!is_built(r, states[i])) {
            PyErr_SetString(PyExc_RuntimeError, "region: ensure left a state's row unbuilt");
            return -1;
        }
    return 0;
}

/* A set of states (open addressing, -1 empty) with a value per state. */
typedef struct {
    int32_t *key, *value;
    size_t mask, used;
} Set;

static int set_init(Set *s, size_t size) {
    s->key = PyMem_Malloc(size * sizeof(int32_t));
    s->value = PyMem_Malloc(size * sizeof(int32_t));
    s->mask = size - 1;
    s->used = 0;
    if (!s->key || !s->value) {
        PyErr_NoMemory();
        return -1;
    }
    memset(s->key, 0xff, size * sizeof(int32_t));
    return 0;
}

static void set_free(Set *s) {
    PyMem_Free(s->key);
    PyMem_Free(s->value);
}

static size_t set_find(const Set *s, int32_t d) {
    size_t i = ((uint32_t)d * 2654435761u) & s->mask;
    while (s->key[i] >= 0 && s->key[i] != d)
        i = (i + 1) & s->mask;
    return i;
}

static int set_has(const Set *s, int32_t d) {
    return s->key[set_find(s, d)] == d;
}

/* Add ``d`` with ``value`` if it is not in; 1 if added, 0 if it was in, -1 on no memory. */
static int set_add(Set *s, int32_t d, int32_t value) {
    if (s->key[set_find(s, d)] == d)
        return 0;
    if ((s->used + 1) * 2 > s->mask + 1) {
        Set bigger;
        if (set_init(&bigger, 2 * (s->mask + 1)) < 0)
            return -1;
        for (size_t i = 0; i <= s->mask; i++)
            if (s->key[i] >= 0) {
                size_t j = set_find(&bigger, s->key[i]);
                bigger.key[j] = s->key[i];
                bigger.value[j] = s->value[i];
                bigger.used++;
            }
        set_free(s);
        *s = bigger;
    }
    size_t i = set_find(s, d);
    s->key[i] = d;
    s->value[i] = value;
    s->used++;
    return 1;
}

/* Room for ``need`` items in ``*a`` (``*cap`` held), doubling; -1 and MemoryError if there is no memory. (Sized
 * as needed, not for the worst case: a region of one state needs a few KB, and large blocks freed on every call
 * would be given back to the system and faulted in again on the next.) */
static int room(int32_t **a, Py_ssize_t *cap, Py_ssize_t need) {
    if (need <= *cap)
        return 0;
    Py_ssize_t size = *cap ? *cap : 1024;
    while (size < need)
        size *= 2;
    int32_t *more = PyMem_Realloc(*a, size * sizeof(int32_t));
    if (!more) {
        PyErr_NoMemory();
        return -1;
    }
    *a = more;
    *cap = size;
    return 0;
}

static int row_has(const int32_t *row, int32_t d) {
    for (int b = 0; b < 256; b++)
        if (row[b] == d)
            return 1;
    return 0;
}

/* How many bytes ``row`` allows. */
static int width(const int32_t *row) {
    int n = 0;
    for (int b = 0; b < 256; b++)
        n += row[b] != 0;
    return n;
}

/* Append to ``out`` the distinct states of ``row`` in the order of the first byte leading to each (as
 * `LazyDFA.successors`); ``out`` has room for 256 more. */
static Py_ssize_t successors(const int32_t *row, int32_t *out) {
    Py_ssize_t n = 0;
    for (int b = 0; b < 256; b++) {
        if (b && row[b] == row[b - 1])  /* (runs of one state are the common case) */
            continue;
        Py_ssize_t k = n - 1;
        while (k >= 0 && out[k] != row[b])
            k--;
        if (k < 0)
            out[n++] = row[b];
    }
    return n;
}

/* region(dfa, state, ensure, depth, limit, wide, count_depth, count_limit) -> (table, regions, exits): `_region`
 * of ``state`` with the search around loops bounded by ``depth`` bytes and ``limit`` explored states, and a
 * counted character's (a state with no loop near it allowing ``wide`` bytes or more) by ``count_depth`` bytes
 * and ``count_limit`` states; ``table`` as the bytes of an int32 array of (1 + regions) rows of 256. Builds the
 * rows it reads, calling ``ensure(dfa, states)`` with the states `_region` ensures, in its order (the table
 * grows, the language does not). */
PyObject *ss_region(PyObject *self, PyObject *args) {
    Rows r = {0};
    int32_t state;
    int depth, limit, wide, count_depth, count_limit;
    if (!PyArg_ParseTuple(args, "OiOiiiii", &r.dfa, &state, &r.ensure, &depth, &limit, &wide, &count_depth,
                          &count_limit))
        return NULL;
    if (state <= 0 || limit < 1 || count_limit < 1) {
        PyErr_SetString(PyExc_ValueError, "region: not a live state, or no room to search");
        return NULL;
    }
    Set members = {0}, explored = {0}, codes = {0}, seen = {0};
    int32_t *order = NULL, *frontier = NULL, *nexts = NULL, *exits = NULL;
    Py_ssize_t norder = 0, nexits = 0, order_cap = 0, frontier_cap = 0, nexts_cap = 0, exits_cap = 0;
    PyObject *result = NULL;
    if (rows_take(&r) < 0 || set_init(&members, 256) < 0 || set_init(&explored, 128) < 0 ||
        set_init(&codes, 256) < 0 || set_init(&seen, 256) < 0 || room(&order, &order_cap, 256) < 0 ||
        room(&frontier, &frontier_cap, 256) < 0 || room(&nexts, &nexts_cap, 256) < 0 ||
        room(&exits, &exits_cap, 256) < 0)
        goto done;
    if (need(&r, &state, 1) < 0)
        goto done;
    /* `after`: the live states a byte away; a loop at the state or at one of them makes a region of more */
    Py_ssize_t nafter = 0, n = successors(row_of(&r, state), nexts);
    for (Py_ssize_t k = 0; k < n; k++)
        if (nexts[k])
            frontier[nafter++] = nexts[k];
    if (nafter && need(&r, frontier, nafter) < 0)
        goto done;
    if (set_add(&members, state, 0) < 0)
        goto done;
    int looped = row_has(row_of(&r, state), state);
    for (Py_ssize_t k = 0; k < nafter; k++)
        if (row_has(row_of(&r, frontier[k]), frontier[k])) {
            looped = 1;
            if (set_add(&members, frontier[k], 0) < 0)
                goto done;
        }
    if (looped) {
        /* breadth first from the state, up to `depth` bytes and `limit` states: the rows around the loops */
        Py_ssize_t nfront = 1;
        frontier[0] = state;
        for (int level = 0; nfront && level < depth && (Py_ssize_t)explored.used < limit; level++) {
            Py_ssize_t kept = 0;
            seen.used = 0;
            memset(seen.key, 0xff, (seen.mask + 1) * sizeof(int32_t));
            for (Py_ssize_t k = 0; k < nfront && kept < limit - (Py_ssize_t)explored.used; k++) {
                int32_t d = frontier[k];
                int added = d && !set_has(&explored, d) ? set_add(&seen, d, 0) : 0;
                if (added < 0)
                    goto done;
                if (added)
                    nexts[kept++] = d;
            }
            if (kept && need(&r, nexts, kept) < 0)
                goto done;
            for (Py_ssize_t k = 0; k < kept; k++)
                if (set_add(&explored, nexts[k], 0) < 0)
                    goto done;
            if (room(&frontier, &frontier_cap, 256 * kept) < 0 || room(&nexts, &nexts_cap, 256 * kept) < 0)
                goto done;
            nfront = 0;
            for (Py_ssize_t k = 0; k < kept; k++)
                nfront += successors(row_of(&r, nexts[k]), frontier + nfront);
        }
        /* the explored states that lead back to the region, until none is added (over each row's distinct
         * states: a row is mostly runs of one state, so a few lookups, not 256) */
        for (int grew = 1; grew;) {
            grew = 0;
            for (size_t i = 0; i <= explored.mask; i++) {
                int32_t d = explored.key[i], succ[256];
                if (d < 0 || set_has(&members, d))
                    continue;
                Py_ssize_t n = successors(row_of(&r, d), succ);
                for (Py_ssize_t k = 0; k < n; k++)
                    if (set_has(&members, succ[k])) {
                        if (set_add(&members, d, 0) < 0)
                            goto done;
                        grew = 1;
                        break;
                    }
            }
        }
    } else if (width(row_of(&r, state)) >= wide) {
        /* a counted character: breadth first, the wide states up to `count_depth` bytes on (the counts ahead and
         * the states inside multi-byte characters), up to `count_limit` states */
        Py_ssize_t nfront = 1;
        frontier[0] = state;
        for (int level = 0; nfront && level < count_depth && (Py_ssize_t)members.used < count_limit; level++) {
            Py_ssize_t nfound = 0;
            seen.used = 0;
            memset(seen.key, 0xff, (seen.mask + 1) * sizeof(int32_t));
            for (Py_ssize_t k = 0; k < nfront; k++) {
                Py_ssize_t n = successors(row_of(&r, frontier[k]), order);  /* (`order`: free until the codes) */
                if (room(&nexts, &nexts_cap, nfound + n) < 0)
                    goto done;
                for (Py_ssize_t i = 0; i < n; i++) {
                    int32_t s = order[i];
                    int added = s && !set_has(&members, s) ? set_add(&seen, s, 0) : 0;
                    if (added < 0)
                        goto done;
                    if (added)
                        nexts[nfound++] = s;
                }
            }
            if (!nfound || need(&r, nexts, nfound) < 0 || room(&frontier, &frontier_cap, nfound) < 0)
                break;
            nfront = 0;
            for (Py_ssize_t k = 0; k < nfound && (Py_ssize_t)members.used < count_limit; k++)
                if (width(row_of(&r, nexts[k])) >= wide) {
                    if (set_add(&members, nexts[k], 0) < 0)
                        goto done;
                    frontier[nfront++] = nexts[k];
                }
        }
        if (PyErr_Occurred())
            goto done;
    }
    /* codes: dead 0, the members 1, 2, ... breadth first from the state by byte, then the exits as first met */
    if (set_add(&codes, 0, 0) < 0 || set_add(&codes, state, 1) < 0 ||
        room(&order, &order_cap, (Py_ssize_t)members.used + 1) < 0)
        goto done;
    order[norder++] = state;
    int32_t succ[256];  /* (a row's distinct states in the order of their first byte: the same codes as by byte) */
    for (Py_ssize_t k = 0; k < norder; k++) {
        Py_ssize_t n = successors(row_of(&r, order[k]), succ);
        for (Py_ssize_t i = 0; i < n; i++) {
            int32_t s = succ[i];
            if (set_has(&members, s) && !set_has(&codes, s)) {
                if (set_add(&codes, s, (int32_t)norder + 1) < 0)
                    goto done;
                order[norder++] = s;
            }
        }
    }
    for (Py_ssize_t k = 0; k < norder; k++) {
        Py_ssize_t n = successors(row_of(&r, order[k]), succ);
        for (Py_ssize_t i = 0; i < n; i++) {
            int added = set_add(&codes, succ[i], (int32_t)(norder + 1 + nexits));
            if (added < 0)
                goto done;
            if (added) {
                if (room(&exits, &exits_cap, nexits + 1) < 0)
                    goto done;
                exits[nexits++] = succ[i];
            }
        }
    }
    PyObject *table = PyBytes_FromStringAndSize(NULL, (norder + 1) * 256 * 4);
    PyObject *found = table ? PyList_New(nexits) : NULL;
    if (!found) {
        Py_XDECREF(table);
        goto done;
    }
    int32_t *out = (int32_t *)PyBytes_AS_STRING(table);
    memset(out, 0, 256 * 4);
    for (Py_ssize_t k = 0; k < norder; k++) {
        const int32_t *row = row_of(&r, order[k]);
        int32_t *coded = out + (k + 1) * 256;
        for (int b = 0; b < 256; b++)  /* (runs of one state: looked up once) */
            coded[b] = b && row[b] == row[b - 1] ? coded[b - 1] : codes.value[set_find(&codes, row[b])];
    }
    for (Py_ssize_t k = 0; k < nexits; k++) {
        PyObject *v = PyLong_FromLong(exits[k]);
        if (!v) {
            Py_DECREF(table);
            Py_DECREF(found);
            goto done;
        }
        PyList_SET_ITEM(found, k, v);
    }
    result = Py_BuildValue("NnN", table, norder, found);
done:
    rows_drop(&r);
    set_free(&members);
    set_free(&explored);
    set_free(&codes);
    set_free(&seen);
    PyMem_Free(order);
    PyMem_Free(frontier);
    PyMem_Free(nexts);
    PyMem_Free(exits);
    return result;
}
