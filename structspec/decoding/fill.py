"""A batch's masks on several threads: the masks its outputs meet for the first time computed in parallel (then
every row is copied in the caller's thread: `structspec.decoding.cursor.fill_bitmasks`).

A state's first mask walks the vocabulary (docs/concepts/token-index.md); later reads copy its cached row. A step
of a batch whose outputs each stand in a new state (a server's requests, each with its own schema or tool set)
computes one walk per output: `compute_masks` spreads them over a small pool of threads. Each FSM guards its
caches with its own locks, so the answers are the ones a single thread gives; the compiled core releases the GIL
while it builds DFA rows and walks tokens, which is what runs in parallel (the Python parts of a walk still take
turns on the GIL). A batch whose masks are all cached is copied in the caller's thread alone: a handoff to the
pool costs more than the copies.

Typical use, one step of a batch of outputs (any FSMs of one logits width)::

    bitmask = cursors[0].fsm.allocate_token_bitmask(len(cursors))
    fill_bitmasks(cursors, bitmask)          # structspec.decoding; threads: mask_threads()
    apply_token_bitmask_inplace(logits, bitmask)
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from structspec.automaton.fsm import TokenFSM
from structspec.checks import as_int
from structspec.errors import OptionError

MAX_THREADS = 8
"""The most threads `mask_threads` gives by default (vLLM's own fill pool stops at 8 too): past a few, the
parts of a walk that hold the GIL bound the gain."""

_POOL_THREADS = max(MAX_THREADS, os.cpu_count() or 1)  # (a pool starts its threads as work first needs them)
_pool: ThreadPoolExecutor | None = None  # started by the first call that needs it
_pool_lock = threading.Lock()


def mask_threads() -> int:
    """The threads a batch's masks fill on by default: the CPUs this process may run on (its affinity), at most
    `MAX_THREADS`. Changes nothing."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS))


def compute_masks(rows: Sequence[tuple[TokenFSM, int]], threads: int | None = None) -> None:
    """Compute the masks of the ``rows`` (an FSM and one of its states each) not computed yet, on up to
    ``threads`` threads (default `mask_threads`; 1: none computed here, the reads that follow compute them), so
    that reads after it copy cached rows. Each distinct (FSM, state) is computed once. Raises nothing of a
    state's own: an error (`UnspellableError`) is kept by the FSM, or met again, by the read that follows, which
    raises it where it belongs. Fills the FSMs' caches; `OptionError` unless ``threads`` is an int ≥ 1."""
    count = None if threads is None else _check_threads(threads)
    todo = list(dict.fromkeys((fsm, state) for fsm, state in rows if not fsm.mask_ready(state)))
    if len(todo) > 1:
        count = count or mask_threads()
        if count > 1:
            _each(todo, _compute, min(count, len(todo)))


def _check_threads(threads: object) -> int:
    count = as_int(threads)
    if count is None or count < 1:
        raise OptionError(f"threads must be an int ≥ 1, got {threads!r}: pass 1 to fill in the caller's thread, "
                          "or leave it out for the CPUs this process may use")
    return count


def _compute(row: tuple[TokenFSM, int]) -> None:
    fsm, state = row
    try:
        fsm.packed_mask(state)
    except Exception:  # (the read that follows raises it, from the FSM's cache or computed again)
        pass


def _each(items: list[Any], work: Callable[[Any], None], threads: int) -> None:
    """``work`` on every item, on up to ``threads`` threads: the caller's and the pool's, each taking the next item
    as it finishes one (first visits differ in cost by orders of magnitude)."""
    todo = iter(items)  # (shared: a list iterator hands each item to one thread)

    def run() -> None:
        for item in todo:
            work(item)

    helpers = [submit(run) for _ in range(min(threads, _POOL_THREADS + 1) - 1)]
    run()
    for helper in helpers:
        if not helper.cancel():  # (one not started finds nothing left: dropped, not waited for)
            helper.result()


def submit(work: Callable[..., Any], *args: Any) -> Future[Any]:
    """``work(*args)`` run on the masks' thread pool (started by the first call). Changes nothing the caller
    holds."""
    global _pool
    if _pool is None:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(_POOL_THREADS, thread_name_prefix="structspec-masks")
    return _pool.submit(work, *args)


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool = None  # a forked child has the executor but not its threads: it would wait forever
    _pool_lock = threading.Lock()  # nor the thread that may have held the lock


os.register_at_fork(after_in_child=_forget_pool)
