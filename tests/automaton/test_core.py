"""The compiled core (`structspec.automaton._core`) against the Python automaton it replaces, the reference: two
automata of one regex, one run on each, give the same states and NFA positions (numbered alike), the same rows,
masks, forced text and end states, state by state, on random regexes, random schemas and token walks, on the JSONSchemaBench
sample's schemas, and on one automaton built in turns by both."""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automaton import dfa as dfa_module
from structspec.automaton import index as index_module
from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.fsm import CompileInfo, TokenFSM
from structspec.automaton.index import TokenIndex
from structspec.automaton.nfa import ByteNFA
from structspec.decoding.fastforward import Forcer
from structspec.errors import UnspellableError
from structspec.schema import constraint_of
from structspec.vocab import TokenVocab
from tests.automaton.test_token_walk import _regexes  # random regexes over characters, classes, escapes

core = pytest.importorskip("structspec.automaton._core", reason="the compiled core is not built here")

INFO = CompileInfo(0.0, "compiled")
SAMPLE = Path(__file__).parent.parent / "data" / "jsonschemabench_sample.jsonl"


class Pair:
    """Two automata of one regex over one vocabulary: ``python`` always read with the Python loops, ``compiled``
    with the core. Each read runs on both; `same` checks that they answered alike."""

    def __init__(self, pattern: Any, vocab: TokenVocab, width: int, tokenizer: Any = None) -> None:
        self.python, self.compiled = (TokenIndex(LazyDFA(ByteNFA(pattern)), vocab, width, (vocab.eos_token_id,))
                                      for _ in range(2))
        self.vocab, self.tokenizer = vocab, tokenizer

    def both(self, read: Callable[[TokenIndex], Any]) -> tuple[Any, Any]:
        """``read`` of each index, each under its own loops (an `UnspellableError` is the answer, by type)."""
        answers = []
        for index, loops in ((self.python, None), (self.compiled, core)):
            saved, dfa_module.CORE = dfa_module.CORE, loops
            try:
                answers.append(read(index))
            except UnspellableError as error:
                answers.append(("unspellable", str(error)))
            finally:
                dfa_module.CORE = saved
        return answers[0], answers[1]

    def visit(self, state: int) -> bool:
        """Check ``state``'s answers alike on both; whether it can be left by a text token."""
        ids, compiled_ids = self.both(lambda index: index.allowed_token_ids(state))
        assert _same(ids, compiled_ids), f"state {state}: allowed tokens differ"
        masks = self.both(lambda index: index.packed_mask(state))
        assert _same(*masks), f"state {state}: packed masks differ"
        live = self.both(lambda index: index.dfa.next_bytes(state))
        assert live[0] == live[1], f"state {state}: next bytes differ"
        if self.tokenizer is not None:  # the forced tokens and text a decode appends from here without the model
            forced = self.both(lambda index: _forced(Forcer(TokenFSM(index.dfa.nfa.start, index, INFO),
                                                            self.tokenizer), state))
            assert forced[0] == forced[1], f"state {state}: forced text differs"
        return not isinstance(ids, tuple) and len(ids) > 0

    def step(self, state: int, token: int) -> int:
        """The state after ``token`` on both (they must agree, DEAD included)."""
        data = self.vocab.token_bytes[token] or b""
        nexts = self.both(lambda index: index.dfa.step(state, data))
        assert nexts[0] == nexts[1], f"state {state}, token {token}: next states differ"
        return nexts[0]

    def walk(self, state: int, tokens: list[int]) -> list[int]:
        """`TokenFSM.walk` of ``tokens`` from ``state`` on both (they must agree, where they stop included)."""
        walks = self.both(lambda index: TokenFSM(index.dfa.nfa.start, index, INFO).walk(state, tokens))
        assert walks[0] == walks[1], f"state {state}, tokens {tokens}: walks differ"
        return walks[0]

    def tables_same(self) -> None:
        """Both DFAs have built the same states, by number, and the same rows."""
        python, compiled = self.python.dfa, self.compiled.dfa
        assert python._sets == compiled._sets
        assert python.nfa._positions == compiled.nfa._positions and python.nfa._stacks == compiled.nfa._stacks
        assert np.array_equal(python.built[: len(python)], compiled.built[: len(compiled)])
        built = np.flatnonzero(python.built[: len(python)])
        assert np.array_equal(python.table[built], compiled.table[built])


def _forced(forcer: Forcer, state: int) -> tuple[Any, tuple[bytes, int]]:
    """The tokens forced from ``state`` (and the states after each) and the forced bytes (and the state after)."""
    tokens = forcer.force(state)
    return (tokens and (tokens.token_ids, tokens.states)), forcer.forced_bytes(state)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    return a == b


def _random_walk(pair: Pair, picks: list[int]) -> None:
    """From the initial state, each state's answers on both, then a token chosen by ``picks`` (allowed ones
    mostly, some of any kind, to step into death too)."""
    state = pair.python.dfa.initial
    for pick in [0, *picks]:
        if not pair.visit(state):
            break
        allowed = pair.python.allowed_token_ids(state)
        text = [t for t in allowed.tolist() if pair.vocab.token_bytes[t]]
        if not text:  # (only an end token: the match is complete)
            break
        token = text[pick % len(text)] if pick % 5 else pick % len(pair.vocab)
        nxt = pair.step(state, token)
        if nxt == DEAD:
            continue  # (a token not allowed: stay, as a sampler rejecting a draft does)
        state = nxt
    # Token sequences through `TokenFSM.walk`: the text tokens met, then any ids (EOS, none, out of range too)
    met = [t for t in pair.python.allowed_token_ids(pair.python.dfa.initial).tolist()][:8]
    size = len(pair.vocab)
    for tokens in (met, [p % size for p in picks], [p % (size + 3) - 1 for p in picks], [pair.vocab.eos_token_id]):
        pair.walk(pair.python.dfa.initial, tokens)
    pair.tables_same()


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
@given(regex=_regexes(), extra=st.integers(-5, 40), picks=st.lists(st.integers(0, 10**6), max_size=12))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_regexes_and_walks_answer_alike_compiled_and_in_python(
        kind: str, regex: str, extra: int, picks: list[int], request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(kind)
    _random_walk(Pair(f"(?:{regex})#", lm.vocab, len(lm.vocab) + extra, lm.tokenizer), picks)


# Random JSON Schemas: nested objects, optional members, arrays, enums, bounded strings long enough to be counted
# (the NFA's fragments and counters, which the core's closures enter and leave), shared definitions.
_LEAF_SCHEMAS = st.one_of(
    st.sampled_from([{"type": "integer"}, {"type": "number"}, {"type": "boolean"}, {"type": "null"},
                     {"type": "string"}, {"enum": ["a", "bc", 3, None]}, {"type": "string", "format": "date"},
                     {"$ref": "#/$defs/point"}]),
    st.integers(0, 400).map(lambda n: {"type": "string", "maxLength": n}),
    st.integers(1, 30).map(lambda n: {"type": "string", "pattern": f"^[a-f0-9]{{{n}}}$"}),
)


def _schemas() -> st.SearchStrategy[dict]:
    def grow(inner: st.SearchStrategy[dict]) -> st.SearchStrategy[dict]:
        members = st.dictionaries(st.sampled_from(["a", "b", "id", "name", "x1"]), inner, min_size=1, max_size=4)
        return st.one_of(
            members.map(lambda m: {"type": "object", "properties": m, "required": sorted(m)[: len(m) // 2]}),
            st.tuples(inner, st.integers(0, 3), st.sampled_from([None, 5, 300])).map(
                lambda a: {"type": "array", "items": a[0], "minItems": a[1]} | ({} if a[2] is None else
                                                                                 {"maxItems": a[2]})),
            st.lists(inner, min_size=2, max_size=3).map(lambda alternatives: {"anyOf": alternatives}),
        )
    point = {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
             "required": ["x", "y"]}
    return st.recursive(_LEAF_SCHEMAS, grow, max_leaves=6).map(lambda s: {**s, "$defs": {"point": point}})


@given(schema=_schemas(), picks=st.lists(st.integers(0, 10**6), max_size=16))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_schemas_and_walks_answer_alike_compiled_and_in_python(schema: dict, picks: list[int],
                                                                      byte_lm) -> None:
    vocab = byte_lm.vocab
    _random_walk(Pair(constraint_of(json.dumps(schema)).pattern, vocab, len(vocab), byte_lm.tokenizer), picks)


COUNTED = [r'(ab|cd){300,400}x', r'("[a-z]{0,300}",){2,9}\]', r'\[(\{"k":"[^"]{0,500}"\},?){1,40}\]',
           r'((0|[1-9][0-9]{0,300})(\.[0-9]+)?,){0,99}#']


@pytest.mark.parametrize("pattern", COUNTED)
@given(order=st.lists(st.booleans(), min_size=1, max_size=40))
@settings(max_examples=15, deadline=None)
def test_rows_built_in_turns_by_the_core_and_python_are_python_alone(pattern: str, order: list[bool]) -> None:
    # One automaton built in turns by the core and by the Python loops (each goes on where the other stopped, the
    # second after a pickle round trip, as the disk cache stores it), against one built by Python alone.
    python, mixed = LazyDFA(ByteNFA(pattern)), LazyDFA(ByteNFA(pattern))
    for k, in_core in enumerate(order):
        if k == len(order) // 2:
            mixed = pickle.loads(pickle.dumps(mixed))
        for dfa, loops in ((python, None), (mixed, core if in_core else None)):
            saved, dfa_module.CORE = dfa_module.CORE, loops
            try:
                states = np.arange(1 + 7 * k, min(len(dfa), 1 + 7 * (k + 1)))
                dfa.ensure(states if len(states) else np.array([dfa.initial]))
            finally:
                dfa_module.CORE = saved
    assert python._sets == mixed._sets and python.nfa._positions == mixed.nfa._positions
    assert np.array_equal(python.built[: len(python)], mixed.built[: len(mixed)])
    built = np.flatnonzero(python.built[: len(python)])
    assert np.array_equal(python.table[built], mixed.table[built])


def test_one_nfa_shared_by_a_compiled_and_a_python_dfa_numbers_its_positions_once() -> None:
    nfa = ByteNFA(COUNTED[2])
    compiled, python = LazyDFA(nfa), LazyDFA(nfa)
    alone = LazyDFA(ByteNFA(COUNTED[2]))
    for k in range(1, 60):
        for dfa, loops in ((compiled, core), (python, None), (alone, None)):
            saved, dfa_module.CORE = dfa_module.CORE, loops
            try:
                dfa.ensure(np.array([min(k, len(dfa) - 1)]))
            finally:
                dfa_module.CORE = saved
    assert compiled._sets == python._sets == alone._sets
    assert nfa._positions == alone.nfa._positions


@given(data=st.binary(max_size=12), start=st.integers(0, 40))
@settings(max_examples=200, deadline=None)
def test_step_reads_any_bytes_from_any_state_alike(data: bytes, start: int) -> None:
    # Bytes no token holds, from states met but not built: the core stops before each missing row, Python builds it.
    pattern = r'\{"a":(\d+|"[^"\\]*")(,"b":\[(true|false)\])?\}'
    python, compiled = LazyDFA(ByteNFA(pattern)), LazyDFA(ByteNFA(pattern))
    for dfa, loops in ((python, None), (compiled, core)):
        saved, dfa_module.CORE = dfa_module.CORE, loops
        try:
            for prefix in (b'{"a":', b'{"a":"x', b'{"a":1,"b":[t'):
                dfa.step(dfa.initial, prefix)
            state = start % len(dfa)
            dfa.reached = dfa.step(state, data)
        finally:
            dfa_module.CORE = saved
    assert python.reached == compiled.reached
    assert python._sets == compiled._sets
    assert np.array_equal(python.built[: len(python)], compiled.built[: len(compiled)])


def _sample_patterns() -> Iterator[Any]:
    for line in SAMPLE.read_text().splitlines():
        row = json.loads(line)
        yield pytest.param(constraint_of(json.dumps(row["schema"])).pattern, [t["data"] for t in row["tests"]],
                           id=row["id"])


@pytest.mark.parametrize("pattern,instances", list(_sample_patterns()))
def test_jsonschemabench_sample_answers_alike_over_qwen(pattern: Any, instances: list[Any], qwen_lm) -> None:
    # Qwen2.5's 151k vocabulary: each state along each test instance's tokens (valid or not) and a breadth-first
    # sweep of the states its answers lead to.
    tokenizer, vocab = qwen_lm.tokenizer, qwen_lm.vocab
    pair = Pair(pattern, vocab, len(vocab) + 271, tokenizer)  # (Qwen2.5's logits are wider than its vocabulary)
    for instance in instances:
        state = pair.python.dfa.initial
        tokens = tokenizer.encode(json.dumps(instance, separators=(",", ":")), add_special_tokens=False)
        pair.walk(state, [*tokens, vocab.eos_token_id])
        for token in tokens:
            pair.visit(state)
            state = pair.step(state, token)
            if state == DEAD:
                break
    seen, todo = {pair.python.dfa.initial}, [pair.python.dfa.initial]
    while todo and len(seen) < 150:
        state = todo.pop(0)
        if not pair.visit(state):
            continue
        for token in pair.python.allowed_token_ids(state).tolist()[:: 97]:  # a spread of each state's tokens
            if pair.vocab.token_bytes[token]:
                nxt = pair.step(state, token)
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    pair.tables_same()


def test_threads_sharing_one_automaton_get_what_one_thread_would(byte_lm) -> None:
    # The core walks with the GIL released, under the DFA's lock: four threads reading the states of one
    # automaton at once, against the Python loops alone.
    vocab = byte_lm.vocab
    pattern = r'\{"name":"[^"\\]{0,30}","tags":\[("[a-z]+"(,"[a-z]+")*)?\],"n":-?\d{1,6}\}'
    text = byte_lm.tokenizer.encode('{"name":"Ada","tags":["x","yz"],"n":-42}', add_special_tokens=False)
    pair = Pair(pattern, vocab, len(vocab))
    state, states = pair.python.dfa.initial, []
    for token in text:  # the states first, then their answers: a state's answer does not depend on the order
        states.append(state)
        state = pair.python.dfa.step(state, vocab.token_bytes[token])
    expected = {s: pair.python.allowed_token_ids(s) for s in states}
    compiled, errors = pair.compiled, []

    def read(order: list[int]) -> None:
        try:
            for s in order:
                assert np.array_equal(compiled.allowed_token_ids(s), expected[s])
        except BaseException as error:  # (re-raised below, in the test's own thread)
            errors.append(error)

    saved, dfa_module.CORE = dfa_module.CORE, core
    try:  # (states numbered alike: the compiled automaton walks the same tokens first, on its own)
        state = compiled.dfa.initial
        for token in text:
            state = compiled.dfa.step(state, vocab.token_bytes[token])
        threads = [threading.Thread(target=read, args=(states[k:] + states[:k],)) for k in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        dfa_module.CORE = saved
    assert not errors, errors[0]


def test_pure_python_is_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, loaded in (("1", None), ("yes", None), ("0", core), ("", core)):
        monkeypatch.setenv("STRUCTSPEC_PURE_PYTHON", value)
        assert dfa_module._load_core() is loaded, value


def test_core_refuses_arrays_it_cannot_read() -> None:
    rows, slots = np.zeros((2, 256), dtype=np.int32), np.array([0, 1], dtype=np.int32)
    with pytest.raises(TypeError, match="slots"):
        core.step(slots.astype(np.int64), rows, 1, b"a", 0)
    trie = (np.array([5]), np.array([97], dtype=np.uint8), np.array([0]), np.array([3]), np.array([0, 1]),
            np.array([0, 1]))  # one level: a node whose parent is not a root
    ab, bits, none = LazyDFA(ByteNFA("ab")), np.zeros(4, dtype=np.uint8), np.zeros(0, dtype=np.int32)
    with pytest.raises(ValueError, match="not a node"):
        core.first_mask(ab, index_module._ensure, trie, bits[:1], [ab.initial], none, 32, bits)
    with pytest.raises(ValueError, match="past found's bits"):
        empty = (*(np.zeros(0, dtype=t) for t in (np.int64, np.uint8, np.int64, np.int64)), np.array([0]),
                 np.array([0]))
        core.first_mask(ab, index_module._ensure, empty, bits[:1], [1], np.array([40], dtype=np.int32), 32, bits)
    with pytest.raises(IndexError, match="not a DFA state"):
        core.unbuilt(np.array([5]), np.ones(2, dtype=bool))
    dfa = LazyDFA(ByteNFA("ab"))
    with pytest.raises(TypeError, match="rows"):
        core.Builder(dfa.nfa, dfa._sets, dfa._ids).build_rows(np.array([1]), dfa.rows.astype(np.int64), dfa.slots,
                                                              dfa.built, 1)
