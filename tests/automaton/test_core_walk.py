"""The compiled walk of the vocabulary (`_region.c`: a state's region; `_classes.c`: its states' classes; `_walk.c`: a
region shape's walk and its leaving tokens' trie; `_levels.c`: a first mask, the trie walked over live nodes) against
the Python one, the reference: the same regions, classes, shapes and masks, state by state, each side walking its
own region shapes, on random regexes and schemas with random token walks, the JSONSchemaBench sample over SmolLM2's
and Qwen2.5's vocabularies, and the tiny tokenizers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automaton import dfa as dfa_module
from structspec.automaton import index as index_module
from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.index import _Shape, _VocabBytes
from structspec.automaton.nfa import ByteNFA
from structspec.schema import constraint_of
from structspec.vocab import TokenVocab
from tests.automaton.test_core import Pair, _random_walk, _sample_patterns, _schemas
from tests.automaton.test_token_walk import _regexes

core = pytest.importorskip("structspec.automaton._core", reason="the compiled core is not built here")


def _counted() -> st.SearchStrategy[str]:
    """Regexes with a counted wide character (a string's ``maxLength``, a pattern's count), between literals, at
    most a few (their counts are states of their own)."""
    characters = st.sampled_from([r'[^"\\\x00-\x1f]', ".", r"[^,]", r'([^"\\]|\\["\\/bfnrt])', r"[\x00-\xff]",
                                  "[a-zé日]", r"[\s\S]"])
    counts = st.tuples(st.integers(0, 3), st.integers(1, 40)).map(lambda c: f"{{{c[0]},{c[0] + c[1]}}}")
    counted = st.tuples(characters, counts).map("".join)
    return st.lists(st.one_of(counted, st.sampled_from(['"', "a", ",", "[0-9]"])), min_size=1, max_size=4).map(
        lambda parts: '"' + "".join(parts) + '"#')


@contextmanager
def _loops(loops: ModuleType | None) -> Iterator[None]:
    saved, dfa_module.CORE = dfa_module.CORE, loops
    try:
        yield
    finally:
        dfa_module.CORE = saved


def _own_shapes(pair: Pair) -> Pair:
    """``pair`` with each side walking its own region shapes, in memory only (no disk: the other side may have
    stored one), so that the compiled walk of a shape is compared with the Python one, not read from it."""
    for index in (pair.python, pair.compiled):
        vocab = index._vocab_bytes = _VocabBytes(pair.vocab)
        vocab._read_or_walk = vocab._walk_shape  # type: ignore[method-assign]
    return pair


def _same_shape(python: _Shape, compiled: _Shape) -> None:
    """Equal walks: the same bits, and per level the same nodes (numbered alike) and the same tokens on each."""
    assert np.array_equal(python.base, compiled.base)
    assert len(python.levels) == len(compiled.levels)
    for a, b in zip(python.levels, compiled.levels):
        assert np.array_equal(a.parents, b.parents) and np.array_equal(a.bytes, b.bytes)
        for level in (a, b):  # (ascending: the compiled walk of the levels bisects them)
            assert np.all(np.diff(level.parents) >= 0) and np.all(np.diff(level.ends) >= 0)
        assert sorted(zip(a.ends.tolist(), a.ids.tolist())) == sorted(zip(b.ends.tolist(), b.ids.tolist()))


def _same_region_and_walk(python: LazyDFA, compiled: LazyDFA, state: int, walks: _VocabBytes) -> None:
    """``state``'s region search and its shape's vocabulary walk, with the Python loops on ``python`` and the core
    on ``compiled``: the same table, regions and exits, and equal walks."""
    with _loops(None):
        table, regions, exits = index_module._region(python, state)
        expected = walks._walk_shape(table, regions)
    with _loops(core):
        found = index_module._region(compiled, state)
        shape = walks._walk_shape(found[0], found[1])
    assert np.array_equal(table, found[0]) and (regions, exits) == found[1:], f"state {state}: regions differ"
    _same_shape(expected, shape)
    with _loops(core):  # the region states' classes (`_from_loop` reads them), numbered alike
        classes = index_module._equivalent(table, regions)
    assert np.array_equal(classes, index_module._equivalent_in_python(table, regions)), f"state {state}"


def _states(regex: str, vocab: TokenVocab, picks: list[int]) -> tuple[LazyDFA, LazyDFA, list[int]]:
    """Two automata of ``regex`` (one read with the Python loops, one with the core) and the states of a random
    token walk on both (numbered alike)."""
    python, compiled = LazyDFA(ByteNFA(regex)), LazyDFA(ByteNFA(regex))
    state, states = python.initial, [python.initial]
    texts = [b for b in vocab.token_bytes if b]
    for pick in picks:
        data = texts[pick % len(texts)]
        with _loops(None):
            nxt = python.step(state, data)
        with _loops(core):
            assert compiled.step(state, data) == nxt
        if nxt != DEAD:
            state = nxt
            states.append(state)
    return python, compiled, states


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
@given(regex=_regexes(), picks=st.lists(st.integers(0, 10**6), max_size=10))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_regions_and_shape_walks_alike_compiled_and_in_python(kind: str, regex: str, picks: list[int],
                                                              request: pytest.FixtureRequest) -> None:
    vocab = request.getfixturevalue(kind).vocab
    python, compiled, states = _states(f"(?:{regex})#", vocab, picks)
    walks = _VocabBytes(vocab)
    for state in states:
        _same_region_and_walk(python, compiled, state, walks)
        assert python._sets == compiled._sets, "the region searches built other rows"


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
@given(regex=_counted(), picks=st.lists(st.integers(0, 10**6), max_size=16))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_counted_characters_regions_and_masks_alike_compiled_and_in_python(kind: str, regex: str, picks: list[int],
                                                                          request: pytest.FixtureRequest) -> None:
    # A counted character's region takes the wide states ahead (each count a state of its own): the same tables,
    # exits and rows built on both sides, and the same masks and forced text along random walks.
    lm = request.getfixturevalue(kind)
    python, compiled, states = _states(regex, lm.vocab, picks)
    walks = _VocabBytes(lm.vocab)
    for state in states:
        _same_region_and_walk(python, compiled, state, walks)
        assert python._sets == compiled._sets, "the region searches built other rows"
    _random_walk(_own_shapes(Pair(regex, lm.vocab, len(lm.vocab), lm.tokenizer)), picks)


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
@given(regex=_regexes(), extra=st.integers(-5, 40), picks=st.lists(st.integers(0, 10**6), max_size=12))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_regexes_mask_alike_each_side_walking_its_own_shapes(
        kind: str, regex: str, extra: int, picks: list[int], request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(kind)
    _random_walk(_own_shapes(Pair(f"(?:{regex})#", lm.vocab, len(lm.vocab) + extra, lm.tokenizer)), picks)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
@given(schema=_schemas(), picks=st.lists(st.integers(0, 10**6), max_size=16))
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_schemas_mask_alike_each_side_walking_its_own_shapes(kind: str, schema: dict, picks: list[int],
                                                                    request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(kind)
    pattern = constraint_of(json.dumps(schema)).pattern
    _random_walk(_own_shapes(Pair(pattern, lm.vocab, len(lm.vocab), lm.tokenizer)), picks)


@pytest.mark.parametrize("pattern,instances", list(_sample_patterns()))
def test_jsonschemabench_sample_masks_alike_over_smollm2(pattern: Any, instances: list[Any], smollm2) -> None:
    # SmolLM2's shipped 49k vocabulary, each side walking its own shapes: the states along each instance's tokens
    # and a breadth-first sweep from the start.
    pair = _own_shapes(Pair(pattern, smollm2.vocab, smollm2.logits_width, smollm2.tokenizer))
    for instance in instances:
        state = pair.python.dfa.initial
        for token in smollm2.tokenizer.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False):
            pair.visit(state)
            state = pair.step(state, token)
            if state == DEAD:
                break
    seen, todo = {pair.python.dfa.initial}, [pair.python.dfa.initial]
    while todo and len(seen) < 60:
        state = todo.pop(0)
        if pair.visit(state):
            for token in pair.python.allowed_token_ids(state).tolist()[:: 211]:
                nxt = pair.step(state, token) if pair.vocab.token_bytes[token] else DEAD
                if nxt != DEAD and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    pair.tables_same()


@pytest.mark.slow
@pytest.mark.parametrize("regex,prefix", [(r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"#', b'"'),
                                          (r'\{"([^"\\]|\\.)*":[0-9]{1,3}\}#', b'{"'), (r'[a-z]{0,40}#', b"ab"),
                                          (r'"([^"\\\x00-\x1f]|\\["\\/bfnrt]){0,60}"#', b'"ab')])
def test_the_whole_qwen_vocabulary_walks_alike_through_a_region_shape(regex: str, prefix: bytes, qwen_lm) -> None:
    # 151k tokens through a string's region, a free key's, a counted run's and a counted string character's (each
    # walked anew on each side).
    python, compiled, _ = _states(regex, qwen_lm.vocab, [])
    with _loops(None):
        state = python.step(python.initial, prefix)
    with _loops(core):
        assert compiled.step(compiled.initial, prefix) == state != DEAD
    _same_region_and_walk(python, compiled, state, _VocabBytes(qwen_lm.vocab))


def test_the_compiled_walks_refuse_what_they_cannot_read(byte_lm) -> None:
    walks = _VocabBytes(byte_lm.vocab)
    args = (walks.data, walks.starts, walks.ends, walks.ids, walks.by_first, walks.first_starts, walks.size)
    table = np.zeros((2, 256), dtype=np.int32)
    with pytest.raises(ValueError, match="walk_shape"):
        core.walk_shape(table, 2, *args)  # more region states than rows
    table[1, 0] = -1
    with pytest.raises(ValueError, match="walk_shape"):
        core.walk_shape(table, 1, *args)  # a negative code
    with pytest.raises(TypeError, match="table"):
        core.walk_shape(table.astype(np.int64), 1, *args)
    dfa = LazyDFA(ByteNFA("ab"))
    with pytest.raises(ValueError, match="region"):
        core.region(dfa, DEAD, index_module._ensure, 6, 32, 64, 12, 96)

    def lazy(dfa: LazyDFA, states: list[int]) -> None:
        pass  # builds nothing

    with pytest.raises(RuntimeError, match="unbuilt"):
        core.region(dfa, dfa.initial, lazy, 6, 32, 64, 12, 96)
