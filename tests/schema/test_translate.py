"""structspec's own schema → items translation against outlines-core's text translation of the same checked
schema (the cross-check), its linear size, its text for other engines, and its compile-cache key."""

from __future__ import annotations

import json
import pickle
import random
import re
import re._constants as C
from pathlib import Path

import numpy as np
import pytest
from outlines_core.json_schema import INTEGER, NUMBER, build_regex_from_schema

from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.nfa import ByteNFA
from structspec.automaton.parse import REPEATS, ParsedRegex, Stated, parse, write
from structspec.errors import SchemaError
from structspec.schema import constraint_of, to_regex
from structspec.schema.bounds import Digits
from structspec.schema.checker import check
from structspec.schema.emit import Rewrites
from structspec.schema.patterns import ecma_classes
from structspec.schema.recursion import unroll
from structspec.testing import in_layout

DATA = Path(__file__).parent.parent / "data"
ROWS = [json.loads(line) for name in ("jsonschemabench_sample.jsonl", "jsonschemabench_slow_sample.jsonl")
        for line in (DATA / name).open()]


def _outlines_text(rewrites: Rewrites, node: object) -> str:
    """The old path: outlines-core's text for the whole checked node, digit bounds and holes put in as text."""
    regex = ecma_classes(build_regex_from_schema(json.dumps(rewrites.standalone(node)), rewrites.whitespace))
    regex = regex.replace(NUMBER, rewrites.digits.number_regex())  # (an exponent's sign is optional: 1e5)
    if rewrites.digits != Digits(None, None):
        regex = regex.replace(INTEGER, rewrites.digits.integer_regex())
    for marker, hole in rewrites.holes.items():
        regex = regex.replace(f'"{marker}"', f"({write(hole)})")
    return regex


def _both(schema: dict, digits: Digits) -> tuple[ParsedRegex, str]:
    document, _ = unroll(schema, 3)
    rewrites = check(document, True, "", digits)
    return rewrites.regex(document.root, "", json.dumps(schema)), _outlines_text(rewrites, document.root)


def _accepts(dfa: LazyDFA, text: str) -> bool:
    state = dfa.step(dfa.initial, text.encode())
    return state != DEAD and dfa.is_final(state)


def _walks(dfa: LazyDFA, rng: random.Random, count: int) -> list[str]:
    """Texts the automaton accepts, by random walks over whole characters (ASCII bytes preferred)."""
    texts = []
    for _ in range(count * 4):
        state, data = dfa.initial, b""
        for _ in range(400):
            if dfa.is_final(state) and rng.random() < 0.15:
                break
            dfa.ensure(np.array([state]))
            live = [b for b in range(256) if dfa.table[state, b] != DEAD]
            if not live:
                break
            ascii_live = [b for b in live if 0x20 <= b < 0x7F]
            byte = rng.choice(ascii_live or live)
            data, state = data + bytes([byte]), int(dfa.table[state, byte])
        if dfa.is_final(state):
            try:
                texts.append(data.decode())
            except UnicodeDecodeError:
                continue
        if len(texts) == count:
            break
    return texts


def _compiles(schema: dict) -> bool:
    try:
        constraint_of(schema)
    except SchemaError:
        return False
    return True


COMPILED = [row for row in ROWS if _compiles(row["schema"])]


def test_most_sample_rows_compile() -> None:
    assert len(COMPILED) >= len(ROWS) - 2, [r["id"] for r in ROWS if r not in COMPILED]


@pytest.mark.slow
@pytest.mark.parametrize("row", COMPILED, ids=[r["id"] for r in COMPILED])
@pytest.mark.parametrize("digits", [Digits(), Digits(None, None)], ids=["digit-bounds", "no-bounds"])
def test_items_and_outlines_core_text_give_the_same_verdicts(row: dict, digits: Digits) -> None:
    schema = row["schema"]
    new, old = _both(schema, digits)
    dfa, rng = LazyDFA(ByteNFA(new)), random.Random(0)
    texts = [in_layout(t["data"], schema, schema) for t in row["tests"]]
    texts += _walks(dfa, rng, 30)
    texts += [t.replace(",", ",,", 1) for t in texts] + [t[:-1] for t in texts] + [t.replace(":", ":[", 1) for t in texts]
    for text in texts:
        assert _accepts(dfa, text) == (re.fullmatch(old, text) is not None), text
        assert (re.fullmatch(str(new), text) is not None) == (re.fullmatch(old, text) is not None), text


def _optional_object(k: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "integer", "minimum": 0} for i in range(k)}}


def _sublists(items: list) -> list[list | Stated]:
    """``items`` and its sub-lists (groups, alternatives, repeated bodies), each distinct list once; a `Stated`
    body is listed, not read."""
    seen: dict[int, list | Stated] = {}

    def visit(seq: list | Stated) -> None:
        if id(seq) in seen:
            return
        seen[id(seq)] = seq
        for op, arg in [] if type(seq) is Stated else seq:
            subs = [arg[3]] if op is C.SUBPATTERN else arg[1] if op is C.BRANCH else [arg[2]] if op in REPEATS else []
            for sub in subs:
                visit(sub)

    visit(items)
    return list(seen.values())


def _distinct_items(items: list) -> int:
    """Items in the distinct sub-lists of ``items`` (a shared sub-list counts once; a `Stated` body, not read,
    none)."""
    return sum(len(seq) for seq in _sublists(items) if type(seq) is not Stated)


@pytest.mark.parametrize("open_objects", [False, True], ids=["closed", "open"])
def test_optional_properties_cost_linear_states_and_positions(open_objects: bool) -> None:
    # the first present member is m_i: (m_0,)?…(m_{i-1},)? m_i, each prefix one flat list sharing its items
    # with the shorter ones, so the automaton builds each (m_j,)? once and calls no fragment inside another
    patterns = {k: constraint_of(_optional_object(k), open_objects=open_objects).pattern for k in (40, 80)}
    items = {k: _distinct_items(parse(p)) for k, p in patterns.items()}
    states, positions = {}, {}
    for k, p in patterns.items():
        nfa = ByteNFA(p)
        dfa = LazyDFA(nfa)
        for text in ['{"p0":1', '{"p3":1,"p9":', '{"p39":0}', '{"p39":0,"zz":[1]}']:  # positions: as walks reach them
            dfa.step(dfa.initial, text.encode())
        states[k], positions[k] = len(nfa), len(nfa._positions)
    assert states[80] < 2.5 * states[40], states
    assert positions[80] < 2.5 * positions[40], positions  # with prefixes nested as calls: 4x (O(k²) stacks)
    assert items[80] < 4.5 * items[40], items  # references to shared items: k²/2 in all
    if not open_objects:  # (open, the text's any-value members, one per alternative, outweigh it)
        assert len(str(patterns[80])) > 3 * len(str(patterns[40]))  # the text, for other engines, is quadratic


@pytest.mark.slow
def test_the_text_reads_back_as_the_same_language() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+\\d$"},
                                               "b": {"enum": ["x", 1, None, "q\"r"]},
                                               "c": {"type": "array", "items": {"type": "number"}, "maxItems": 2}},
              "required": ["a"]}
    constraint = constraint_of(schema)
    regex = constraint.regex
    dfa, from_text = LazyDFA(ByteNFA(constraint.pattern)), LazyDFA(ByteNFA(regex))  # the items; the text
    for text in ['{"a":"ab1"}', '{"a":"ab1","b":"q\\"r","c":[1.5,2]}', '{"a":"ab1","c":[1,2,3]}', '{"a":"Ab1"}',
                 '{"b":1}', '{"a":"z9","b":null}']:
        assert _accepts(dfa, text) == _accepts(from_text, text) == (re.fullmatch(regex, text) is not None), text


def test_pattern_properties_objects_keep_order_required_and_extras() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
              "patternProperties": {"^x": {"type": "null"}}, "required": ["b"], "additionalProperties": False}
    regex = constraint_of(schema).regex
    for text, ok in [('{"b":true}', True), ('{"a":1,"b":true}', True), ('{"a":1,"b":true,"x1":null}', True),
                     ('{"b":false,"x":null,"xy":null}', True), ('{"a":1}', False), ('{}', False),
                     ('{"x":null,"b":true}', False), ('{"b":true,"y":null}', False), ('{"b":true,}', False)]:
        assert (re.fullmatch(regex, text) is not None) == ok, text


def test_the_cache_key_names_the_schema_and_its_options() -> None:
    schema = _optional_object(3)
    first, again = constraint_of(schema).pattern, constraint_of(json.loads(json.dumps(schema))).pattern
    assert isinstance(first, ParsedRegex) and first.key == again.key
    assert constraint_of(schema, max_integer_digits=5).pattern.key != first.key
    assert constraint_of(schema, whitespace_pattern="[ ]?").pattern.key != first.key
    assert constraint_of(_optional_object(4)).pattern.key != first.key
    assert pickle.loads(pickle.dumps(first)) == str(first)  # it travels as its text


@pytest.mark.slow
def test_the_text_is_written_only_when_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # k optional properties, each a shared $ref: O(k) items, O(k²) text that compiling never needs
    schema = {"type": "object", "$defs": {"pair": {"type": "array", "items": {"type": "integer"}, "maxItems": 2}},
              "properties": {f"p{i}": {"$ref": "#/$defs/pair"} for i in range(60)}}
    calls = []

    def counted(items: list) -> str:
        calls.append(len(items))
        return write(items)

    monkeypatch.setattr("structspec.automaton.parse.write", counted)
    constraint = constraint_of(schema)
    dfa = LazyDFA(ByteNFA(constraint.pattern))
    assert _accepts(dfa, '{"p3":[1,2],"p59":[]}') and not _accepts(dfa, '{"p59":[],"p3":[1]}')
    assert calls == []
    text = constraint.regex
    assert len(calls) == 1 and constraint.regex is text and len(text) > 60 * 60  # written once, then kept
    assert re.fullmatch(text, '{"p3":[1,2],"p59":[]}') and not re.fullmatch(text, '{"p59":[],"p3":[1]}')


@pytest.mark.parametrize("row", COMPILED[:6], ids=[r["id"] for r in COMPILED[:6]])
def test_to_regex_writes_the_translated_items(row: dict) -> None:
    # the text as structspec wrote it when the regex was a str: `write` of the translated items, for each option
    for options, digits in (({}, Digits()), ({"max_integer_digits": None, "max_fraction_digits": None},
                                            Digits(None, None))):
        document, _ = unroll(row["schema"], 3)
        items = check(document, True, "", digits, open_objects=True).items(document.root, "")
        assert to_regex(row["schema"], **options) == write(items)


@pytest.mark.slow
@pytest.mark.parametrize("open_objects", [False, True], ids=["closed", "open"])
def test_nested_optional_members_keep_a_few_positions_per_level(open_objects: bool) -> None:
    # a member's value is entered from one place whether or not more members follow it (a fragment inside a
    # member is a call, so the member itself is built in place and shared), so each level of nesting adds a few
    # positions to a DFA state; a group per alternative entered it from two, doubling them per level
    node: dict = {"type": "integer"}
    for _ in range(30):
        node = {"type": "object", "properties": {"a": node, "b": {"type": "integer"}}}
    dfa = LazyDFA(ByteNFA(constraint_of(node, open_objects=open_objects).pattern))
    state = dfa.initial
    for level in range(30):
        state = dfa.step(state, b'{"a":')
        assert len(dfa._sets[state]) <= 4 * (level + 1), level


def test_a_name_other_than_the_listed_ones_is_made_when_a_walk_enters_it() -> None:
    # an open object's "any name but these" (a trie of the names) is one group whose facts are stated: translating
    # and compiling do not make its items, a walk into an unlisted member's name makes that object's only
    inner = {"type": "object", "properties": {f"x{i}": {"type": "integer"} for i in range(20)}}
    schema = {"type": "object", "properties": {"a": inner, "b": inner | {"required": ["x0"]}}}
    pattern = constraint_of(schema).pattern
    stated = [seq for seq in _sublists(pattern.items) if type(seq) is Stated]

    def made() -> list[frozenset[str]]:
        return [seq.key[1] for seq in stated if seq._items is not None]

    dfa = LazyDFA(ByteNFA(pattern))
    assert len(stated) == 3 and made() == []
    assert dfa.step(dfa.initial, b'{"zz":1,"q') != DEAD
    assert made() == [frozenset({"a", "b"})]
    assert dfa.step(dfa.initial, b'{"a":{"x0":1,"y":2') != DEAD  # an unlisted name, then...
    assert dfa.step(dfa.initial, b'{"a":{"x0":1,"x0"') == DEAD  # ...never a listed one again


def test_a_name_trie_travels_in_a_pickle_made_or_not() -> None:
    # the disk cache pickles an automaton with its parts not built yet: a `Stated` body goes as its recipe and
    # is made where a walk enters it
    schema = {"type": "object", "properties": {"alpha": {"type": "integer"}, "beta": {"type": "string"}}}
    pattern = constraint_of(schema).pattern
    texts = [b'{"alpha":1,"gamma":2}', b'{"alpha":1,"alpha":2}', b'{"alphb":true}', b'{"beta":"x","alp":null}']
    unmade = pickle.loads(pickle.dumps(LazyDFA(ByteNFA(pattern))))
    walked = LazyDFA(ByteNFA(pattern))
    assert [walked.step(walked.initial, t) != DEAD for t in texts] == [True, False, True, True]
    made = pickle.loads(pickle.dumps(walked))
    for dfa in (unmade, made):
        assert [dfa.step(dfa.initial, t) != DEAD for t in texts] == [True, False, True, True]
