/* The compiled core's shared pieces (structspec/automaton/_core.c and the files it names). */
#ifndef STRUCTSPEC_CORE_H
#define STRUCTSPEC_CORE_H
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A C-contiguous view of `obj` whose items are `itemsize` bytes (-1: 4 or 8, an int32 or int64 array); -1 and
 * an exception naming `name` if it is not one. */
int ss_view(PyObject *obj, Py_buffer *buf, Py_ssize_t itemsize, int writable, const char *name);

/* first_mask(dfa, ensure, trie, base, exits, ends, width, found): _levels.c */
PyObject *ss_first_mask(PyObject *self, PyObject *args);

/* equivalent(table, regions): _classes.c */
PyObject *ss_equivalent(PyObject *self, PyObject *args);

/* walk_shape(table, regions, data, starts, ends, ids, by_first, first_starts, size): _walk.c */
PyObject *ss_walk_shape(PyObject *self, PyObject *args);

/* region(dfa, state, ensure, depth, limit): _region.c */
PyObject *ss_region(PyObject *self, PyObject *args);

/* The `Builder` type (the DFA's rows built from the NFA) and `unbuilt`, its lock-free check: _subset.c */
extern PyTypeObject ss_builder_type;
PyObject *ss_unbuilt(PyObject *self, PyObject *args);

#endif
