/* walk_shape: every token of a vocabulary walked through one region shape, and the tokens that leave the region
 * laid out as a trie by byte position, the GIL released over both (`_VocabBytes._walk_shape` in index.py; its
 * numpy loops are the reference). Part of structspec.automaton._core. */
#include "_core.h"

/* A growable array of int32, allocated without the GIL. */
typedef struct {
    int32_t *a;
    Py_ssize_t n, cap;
} Buf;

static int buf_push(Buf *v, int32_t x) {
    if (v->n == v->cap) {
        Py_ssize_t cap = v->cap ? 2 * v->cap : 256;
        int32_t *a = PyMem_RawRealloc(v->a, cap * sizeof(int32_t));
        if (!a)
            return -1;
        v->a = a;
        v->cap = cap;
    }
    v->a[v->n++] = x;
    return 0;
}

/* One byte position of the trie: node i reads bytes[i] from node parents[i] of the level before (level 0: the
 * exits); the tokens of rows `rows` end on nodes `ends`. */
typedef struct {
    Buf parents, ends, rows;
    unsigned char *bytes;
} Layer;

/* The tokens still in the trie at one level: the row, its next byte's position, its node in the level before. */
typedef struct {
    int32_t *row, *pos, *node;
} Items;

static void items_free(Items *t) {
    PyMem_RawFree(t->row);
    PyMem_RawFree(t->pos);
    PyMem_RawFree(t->node);
}

static int items_alloc(Items *t, Py_ssize_t n) {
    t->row = PyMem_RawMalloc((n + 1) * sizeof(int32_t));
    t->pos = PyMem_RawMalloc((n + 1) * sizeof(int32_t));
    t->node = PyMem_RawMalloc((n + 1) * sizeof(int32_t));
    return t->row && t->pos && t->node ? 0 : -1;
}

/* Items ``from`` in the order of ``key`` (a stable counting sort over keys 0..nkeys-1), into ``to``. */
static void sort_items(const Items *from, Items *to, Py_ssize_t n, const int32_t *key, Py_ssize_t nkeys,
                       Py_ssize_t *count) {
    memset(count, 0, (nkeys + 1) * sizeof(Py_ssize_t));
    for (Py_ssize_t i = 0; i < n; i++)
        count[key[i] + 1]++;
    for (Py_ssize_t k = 0; k < nkeys; k++)
        count[k + 1] += count[k];
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = count[key[i]]++;
        to->row[j] = from->row[i];
        to->pos[j] = from->pos[i];
        to->node[j] = from->node[i];
    }
}

typedef struct {
    const int32_t *table;
    const unsigned char *data;
    const int64_t *starts, *ends, *ids, *by_first, *first_starts;
    Py_ssize_t nrows, ntext, ndata, size;
    int32_t regions, nexits;
    unsigned char *base;
    Layer *levels;
    Py_ssize_t nlevels;
} Walk;

enum { OK, NO_MEMORY, BAD_VOCAB };

/* The walk through the region, then the trie level by level; no Python object touched. */
static int walk(Walk *w) {
    Items cur = {0}, next = {0};
    Py_ssize_t nleft = 0, widest = w->nexits > 256 ? w->nexits : 256, *count = NULL;
    int32_t *key = NULL;
    int outcome = NO_MEMORY;
    if (items_alloc(&cur, w->ntext) < 0 || items_alloc(&next, w->ntext) < 0 ||
        !(key = PyMem_RawMalloc((w->ntext + 1) * sizeof(int32_t))))
        goto done;
    /* The region: from code 1, each token until it ends (inside or on an exit: allowed), dies or leaves by an
     * exit (then it goes on in the trie, rooted at that exit). Only the tokens whose first byte lives. */
    for (int b = 0; b < 256; b++) {
        if (!w->table[256 + b])
            continue;
        for (int64_t j = w->first_starts[b]; j < w->first_starts[b + 1]; j++) {
            int64_t r = w->by_first[j];
            if (r < 0 || r >= w->ntext || w->starts[r] < 0 || w->ends[r] > w->ndata || w->ids[r] < 0 ||
                w->ids[r] >= w->size) {
                outcome = BAD_VOCAB;
                goto done;
            }
            int32_t code = 1;
            for (int64_t at = w->starts[r], end = w->ends[r]; at < end;) {
                code = w->table[(Py_ssize_t)code * 256 + w->data[at++]];
                if (!code)
                    break;
                if (at == end) {
                    w->base[w->ids[r] >> 3] |= (unsigned char)(1u << (w->ids[r] & 7));
                    break;
                }
                if (code > w->regions) {
                    cur.row[nleft] = (int32_t)r;
                    cur.pos[nleft] = (int32_t)at;
                    cur.node[nleft++] = code - w->regions - 1;
                    break;
                }
            }
        }
    }
    /* The trie: per level, the tokens sorted by (node, byte) — by byte, then stably by node — so that the nodes
     * are numbered as numpy's unique numbers their keys; the tokens that go on keep that order. */
    Py_ssize_t nnodes = w->nexits;
    while (nleft) {
        if (!count || nnodes > widest) {  /* (counts per key: 256 bytes, or the nodes of the level before) */
            widest = nnodes > widest ? nnodes : widest;
            PyMem_RawFree(count);
            count = PyMem_RawMalloc((widest + 2) * sizeof(Py_ssize_t));
            if (!count)
                goto done;
        }
        Layer *grown = PyMem_RawRealloc(w->levels, (w->nlevels + 1) * sizeof(Layer));
        if (!grown)
            goto done;
        w->levels = grown;
        Layer *l = &w->levels[w->nlevels++];
        memset(l, 0, sizeof(Layer));
        l->bytes = PyMem_RawMalloc(nleft + 1);
        if (!l->bytes)
            goto done;
        for (Py_ssize_t i = 0; i < nleft; i++)
            key[i] = w->data[cur.pos[i]];
        sort_items(&cur, &next, nleft, key, 256, count);
        for (Py_ssize_t i = 0; i < nleft; i++)
            key[i] = next.node[i];
        sort_items(&next, &cur, nleft, key, nnodes, count);
        Py_ssize_t kept = 0, made = 0;
        int32_t last_node = -1, last_byte = -1;
        for (Py_ssize_t i = 0; i < nleft; i++) {
            int32_t node = cur.node[i], byte = w->data[cur.pos[i]];
            if (node != last_node || byte != last_byte) {
                if (buf_push(&l->parents, node) < 0)
                    goto done;
                l->bytes[made++] = (unsigned char)byte;
                last_node = node;
                last_byte = byte;
            }
            int32_t row = cur.row[i], pos = cur.pos[i] + 1;
            if (pos == w->ends[row]) {
                if (buf_push(&l->ends, (int32_t)(made - 1)) < 0 || buf_push(&l->rows, row) < 0)
                    goto done;
            } else {
                next.row[kept] = row;
                next.pos[kept] = pos;
                next.node[kept++] = (int32_t)(made - 1);
            }
        }
        Items swap = cur;
        cur = next;
        next = swap;
        nleft = kept;
        nnodes = made;
    }
    outcome = OK;
done:
    items_free(&cur);
    items_free(&next);
    PyMem_RawFree(key);
    PyMem_RawFree(count);
    return outcome;
}

/* The trie's levels laid end to end, as `_Trie` holds them: (parents, bytes, ends, ids, node_starts, end_starts),
 * the bytes of int64 arrays (bytes: uint8). */
static PyObject *flat_trie(const Layer *levels, Py_ssize_t count, const int64_t *ids) {
    Py_ssize_t nodes = 0, tokens = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        nodes += levels[k].parents.n;
        tokens += levels[k].ends.n;
    }
    PyObject *parts[6] = {PyBytes_FromStringAndSize(NULL, nodes * 8), PyBytes_FromStringAndSize(NULL, nodes),
                          PyBytes_FromStringAndSize(NULL, tokens * 8), PyBytes_FromStringAndSize(NULL, tokens * 8),
                          PyBytes_FromStringAndSize(NULL, (count + 1) * 8),
                          PyBytes_FromStringAndSize(NULL, (count + 1) * 8)};
    for (int i = 0; i < 6; i++)
        if (!parts[i]) {
            for (int k = 0; k < 6; k++)
                Py_XDECREF(parts[k]);
            return NULL;
        }
    int64_t *up = (int64_t *)PyBytes_AS_STRING(parts[0]), *on = (int64_t *)PyBytes_AS_STRING(parts[2]);
    int64_t *who = (int64_t *)PyBytes_AS_STRING(parts[3]), *node_starts = (int64_t *)PyBytes_AS_STRING(parts[4]);
    int64_t *end_starts = (int64_t *)PyBytes_AS_STRING(parts[5]);
    unsigned char *by = (unsigned char *)PyBytes_AS_STRING(parts[1]);
    node_starts[0] = end_starts[0] = 0;
    for (Py_ssize_t k = 0; k < count; k++) {
        const Layer *l = &levels[k];
        for (Py_ssize_t i = 0; i < l->parents.n; i++)
            up[node_starts[k] + i] = l->parents.a[i];
        memcpy(by + node_starts[k], l->bytes, l->parents.n);
        for (Py_ssize_t i = 0; i < l->ends.n; i++) {
            on[end_starts[k] + i] = l->ends.a[i];
            who[end_starts[k] + i] = ids[l->rows.a[i]];
        }
        node_starts[k + 1] = node_starts[k] + l->parents.n;
        end_starts[k + 1] = end_starts[k] + l->ends.n;
    }
    return Py_BuildValue("NNNNNN", parts[0], parts[1], parts[2], parts[3], parts[4], parts[5]);
}

/* walk_shape(table, regions, data, starts, ends, ids, by_first, first_starts, size) -> (base, trie).
 *
 * ``table`` (int32, 256 per row) is a canonical region (`_region`: code 0 dead, 1..``regions`` the region's
 * states, above: exits); the vocabulary's text tokens are rows r of ``data[starts[r]:ends[r]]`` with ids
 * ``ids[r]``, ``by_first`` the rows ordered by first byte, those of byte b from ``first_starts[b]`` (int64,
 * 257 of them). Every token is walked from code 1 until it ends, dies or leaves. ``base``: bits over ``size``
 * ids (little bit order), the tokens that end inside or exactly on an exit; ``trie``: the others as a trie
 * rooted at the exits, its levels (one per byte position) laid end to end as `_Trie` holds them, as the bytes of
 * int64 (bytes: uint8) arrays; nodes numbered by (parent, byte) within a level, each level's ends ascending. */
PyObject *ss_walk_shape(PyObject *self, PyObject *args) {
    PyObject *objs[7];
    Py_buffer b[7];
    static const Py_ssize_t sizes[7] = {4, 1, 8, 8, 8, 8, 8};
    static const char *names[7] = {"table", "data", "starts", "ends", "ids", "by_first", "first_starts"};
    int regions;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "OiOOOOOOn", &objs[0], &regions, &objs[1], &objs[2], &objs[3], &objs[4], &objs[5],
                          &objs[6], &size))
        return NULL;
    int taken = 0;
    for (; taken < 7; taken++)
        if (ss_view(objs[taken], &b[taken], sizes[taken], 0, names[taken]) < 0)
            break;
    PyObject *result = NULL;
    Walk w = {0};
    if (taken < 7)
        goto done;
    w.table = b[0].buf;
    w.data = b[1].buf;
    w.starts = b[2].buf;
    w.ends = b[3].buf;
    w.ids = b[4].buf;
    w.by_first = b[5].buf;
    w.first_starts = b[6].buf;
    w.nrows = b[0].len / (4 * 256);
    w.ndata = b[1].len;
    w.ntext = b[2].len / 8;
    w.size = size;
    w.regions = regions;
    int valid = b[0].len % (4 * 256) == 0 && regions >= 1 && regions < w.nrows && b[3].len == b[2].len &&
                b[4].len == b[2].len && b[5].len == b[2].len && b[6].len == 257 * 8 && size >= 0 &&
                w.ndata < INT32_MAX && w.ntext < INT32_MAX;
    int32_t most = 0;
    for (Py_ssize_t i = 0; valid && i < w.nrows * 256; i++) {
        valid = w.table[i] >= 0;
        most = w.table[i] > most ? w.table[i] : most;
    }
    for (int k = 0; valid && k < 257; k++)
        valid = w.first_starts[k] >= 0 && w.first_starts[k] <= w.ntext &&
                (!k || w.first_starts[k] >= w.first_starts[k - 1]);
    if (!valid) {
        PyErr_SetString(PyExc_ValueError, "walk_shape: a table, vocabulary or size it cannot read");
        goto done;
    }
    w.nexits = most > regions ? most - regions : 0;
    w.base = PyMem_RawCalloc((size + 7) / 8 + 1, 1);
    if (!w.base) {
        PyErr_NoMemory();
        goto done;
    }
    int outcome;
    Py_BEGIN_ALLOW_THREADS
    outcome = walk(&w);
    Py_END_ALLOW_THREADS
    if (outcome == NO_MEMORY) {
        PyErr_NoMemory();
        goto done;
    }
    if (outcome == BAD_VOCAB) {
        PyErr_SetString(PyExc_ValueError, "walk_shape: a token's row, bytes or id is out of range");
        goto done;
    }
    PyObject *trie = flat_trie(w.levels, w.nlevels, w.ids);
    if (trie)
        result = Py_BuildValue("y#N", (const char *)w.base, (size + 7) / 8, trie);
done:
    for (Py_ssize_t i = 0; i < w.nlevels; i++) {
        PyMem_RawFree(w.levels[i].parents.a);
        PyMem_RawFree(w.levels[i].ends.a);
        PyMem_RawFree(w.levels[i].rows.a);
        PyMem_RawFree(w.levels[i].bytes);
    }
    PyMem_RawFree(w.levels);
    PyMem_RawFree(w.base);
    for (int i = 0; i < taken; i++)
        PyBuffer_Release(&b[i]);
    return result;
}
