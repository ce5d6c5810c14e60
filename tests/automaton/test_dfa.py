"""The lazy DFA's rows: built from equal-or-disjoint ranges without the general sweep (or in the compiled core), the
same table either way; what it keeps per state out of the cyclic collector's way."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import given, settings

from structspec.automaton import dfa as dfa_module
from structspec.automaton.dfa import LazyDFA
from structspec.automaton.nfa import ByteNFA
from tests.automaton.test_token_walk import _regexes


class _SweptDFA(LazyDFA):
    """Every row through the general sweep, as all rows were built before the partition's shortcut (in Python:
    the compiled core builds every row by one sweep)."""

    def _partition(self, moves: list[tuple[int, int, int]]) -> list[tuple[int, int, bytes]]:
        return self._sweep(moves)

    def ensure(self, states: np.ndarray) -> None:
        saved, dfa_module.CORE = dfa_module.CORE, None
        try:
            super().ensure(states)
        finally:
            dfa_module.CORE = saved


def _build_all(dfa: LazyDFA, limit: int = 400) -> None:
    d = 1
    while d < len(dfa) and d < limit:  # (states are numbered as first met: building in order reaches them all)
        dfa.ensure(np.array([d]))
        d += 1


@given(regex=_regexes())
@settings(max_examples=80, deadline=None)
def test_rows_of_equal_or_disjoint_ranges_are_the_swept_rows(regex: str) -> None:
    nfa = ByteNFA(f"(?:{regex})#")
    fast, swept = LazyDFA(nfa), _SweptDFA(nfa)
    _build_all(fast)
    _build_all(swept)
    assert fast._sets == swept._sets  # same states, numbered alike
    assert np.array_equal(fast.table[: len(fast)], swept.table[: len(swept)])


def test_rows_whose_ranges_overlap_unequally_are_swept() -> None:
    # [0-9] and 0 overlap without being equal (a number's first digit against a literal "0" key), as do [a-f] and a.
    dfa = LazyDFA(ByteNFA("(0x|[0-9]+|[a-f]z|a)#"))
    dfa.ensure(np.array([dfa.initial]))
    row = dfa.table[dfa.initial]
    assert row[ord("0")] not in (0, row[ord("1")])  # "0" may go on to x or stay a number: a state of its own
    assert row[ord("a")] not in (0, row[ord("b")])
    assert row[ord("1")] == row[ord("9")] and row[ord("b")] == row[ord("f")] and row[ord("g")] == 0
    assert dfa.step(dfa.initial, b"0x#") and dfa.step(dfa.initial, b"007#") and dfa.step(dfa.initial, b"a#")
    assert dfa.step(dfa.initial, b"az#") and not dfa.step(dfa.initial, b"bx#")


def test_what_a_dfa_keeps_per_state_leaves_the_cyclic_collector(monkeypatch: pytest.MonkeyPatch) -> None:
    # A DFA and its NFA keep a set of positions per state, a closure and the moves per position: hundreds of thousands
    # on a large schema, which every full collection would walk if they stayed tracked. (The Python loops' memos:
    # the compiled core keeps its own out of Python's objects.)
    monkeypatch.setattr(dfa_module, "CORE", None)
    nfa = ByteNFA('\\{"a":"([^"\\\\]|\\\\["\\\\/bfnrt])*","b":(0|[1-9][0-9]*)\\}')
    dfa = LazyDFA(nfa)
    _build_all(dfa)
    gc.collect()
    gc.collect()  # (a tuple of tuples leaves once its inner tuples have left, at the pass after theirs)
    kept = [*dfa._sets, *dfa._entered, *nfa._closures.values(), *nfa._moves.values()]
    assert len(kept) > 50 and not any(gc.is_tracked(x) for x in kept)


def test_only_built_rows_take_memory_and_a_state_not_built_reads_dead() -> None:
    letters = "abcdefghijklmnopqrstuvwxyz"
    dfa = LazyDFA(ByteNFA("(" + "|".join(f"{a}{b}{a}" for a in letters for b in letters) + ")#"))
    firsts = [dfa.step(dfa.initial, a.encode()) for a in letters]
    dfa.ensure(np.array(firsts))  # 27 rows built, whose targets are 700 states
    assert len(dfa) > 700 and dfa.built[: len(dfa)].sum() == 28
    assert dfa.rows.nbytes <= 64 * 256 * 4  # (a row per state would take 1,024 of them)
    unbuilt = int(dfa.table[firsts[0], ord("q")])
    assert not dfa.built[unbuilt] and not dfa.table[unbuilt].any()
    assert dfa.step(dfa.initial, b"aqa#") and not dfa.step(dfa.initial, b"aqb#")
