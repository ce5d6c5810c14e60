/* equivalent: the classes of a canonical region's states, refined until stable (`_equivalent` in index.py; its
 * Python loop is the reference), which `TokenIndex._from_loop` compares to walk fewer tokens. Part of
 * structspec.automaton._core. */
#include "_core.h"

/* The hash of region code ``i``'s signature under ``kinds``: its class and its row's codes' classes. */
static uint64_t signature_hash(const int64_t *kinds, const int32_t *row, Py_ssize_t i) {
    uint64_t h = 1469598103934665603u ^ (uint64_t)kinds[i];
    for (int b = 0; b < 256; b++)
        h = (h ^ (uint64_t)kinds[row[b]]) * 1099511628211u;
    return h;
}

static int same_signature(const int64_t *kinds, const int32_t *table, Py_ssize_t i, Py_ssize_t j) {
    if (kinds[i] != kinds[j])
        return 0;
    const int32_t *a = table + i * 256, *b = table + j * 256;
    for (int k = 0; k < 256; k++)
        if (kinds[a[k]] != kinds[b[k]])
            return 0;
    return 1;
}

/* equivalent(table, regions) -> bytes: `_equivalent` (index.py, the reference) of a canonical region ``table``
 * (int32, 1 + ``regions`` rows of 256 codes): per code, as int64, its class, refined from "all region states
 * alike" until no class splits; classes are numbered past every code, in the order first met, as there. */
PyObject *ss_equivalent(PyObject *self, PyObject *args) {
    PyObject *table_obj;
    Py_ssize_t regions;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "On", &table_obj, &regions))
        return NULL;
    if (ss_view(table_obj, &view, 4, 0, "table") < 0)
        return NULL;
    const int32_t *table = view.buf;
    Py_ssize_t cells = view.len / 4, size = regions;
    if (regions < 1 || cells != (regions + 1) * 256) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "equivalent: the table is not 1 + regions rows of 256 codes");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < cells; k++) {
        if (table[k] < 0) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "equivalent: a negative code");
            return NULL;
        }
        if (table[k] > size)
            size = table[k];
    }
    size += 1;  /* codes 0..size-1; classes numbered from size on */
    PyObject *result = PyBytes_FromStringAndSize(NULL, size * 8);
    size_t slots = 4;
    while (slots < 2 * (size_t)regions)
        slots *= 2;
    int64_t *found = PyMem_Malloc(regions * sizeof(int64_t));
    Py_ssize_t *first = PyMem_Malloc(slots * sizeof(Py_ssize_t));  /* a class's first code, by hash slot (-1 none) */
    uint64_t *hashes = PyMem_Malloc(slots * sizeof(uint64_t));
    if (!result || !found || !first || !hashes) {
        Py_XDECREF(result);
        result = PyErr_NoMemory();
        goto done;
    }
    int64_t *kinds = (int64_t *)PyBytes_AS_STRING(result);
    for (Py_ssize_t k = 0; k < size; k++)
        kinds[k] = k <= regions && k ? size : k;
    for (Py_ssize_t count = 1;;) {
        Py_ssize_t classes = 0;
        for (size_t s = 0; s < slots; s++)
            first[s] = -1;
        for (Py_ssize_t i = 1; i <= regions; i++) {
            uint64_t h = signature_hash(kinds, table + i * 256, i);
            size_t s = (size_t)h & (slots - 1);
            while (first[s] >= 0 && !(hashes[s] == h && same_signature(kinds, table, first[s], i)))
                s = (s + 1) & (slots - 1);
            if (first[s] < 0) {
                first[s] = i;
                hashes[s] = h;
                found[i - 1] = size + classes++;
            } else {
                found[i - 1] = found[first[s] - 1];
            }
        }
        memcpy(kinds + 1, found, regions * sizeof(int64_t));
        if (classes == count)
            break;
        count = classes;
    }
done:
    PyMem_Free(found);
    PyMem_Free(first);
    PyMem_Free(hashes);
    PyBuffer_Release(&view);
    return result;
}
