"""The lazy byte automaton and its token index, checked against outlines-core's `Index`."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from outlines_core import Index, Vocabulary

from structspec.automaton.index import DEAD, ByteNFA, LazyDFA, TokenIndex, _byte_sequences, _normalize
from structspec.errors import RegexError
from structspec.schema.translate import constraint_of

REGEXES = [
    r'\{"name":"([^"\\\x00-\x1F\x7F-\x9F]|\\["\\/bfnrt])*","age":(0|[1-9][0-9]*)\}',
    r"[a-z]{2,5}@(x|yz)\.com",
    r"(true|false|null)",
    r'"[\u00e9\u4e00-\u9fff]+"',
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?",
    r"(ab|a)*b{0,3}c?",
    r".{1,3}x",
    r"[^a-z]{2}\s\w",
]


def _matches(sequences: list[list[tuple[int, int]]], data: bytes) -> bool:
    return any(len(s) == len(data) and all(lo <= b <= hi for (lo, hi), b in zip(s, data)) for s in sequences)


@given(st.integers(0, 0x10FFFF), st.integers(0, 3000), st.data())
@settings(max_examples=200, deadline=None)
def test_utf8_sequences_match_exactly_the_encodings_of_the_range(lo: int, width: int, data) -> None:
    hi = min(lo + width, 0x10FFFF)
    sequences = _byte_sequences(_normalize(((lo, hi),)))  # surrogates are taken out first
    for cp in data.draw(st.lists(st.integers(max(0, lo - 5), min(hi + 5, 0x10FFFF)), max_size=30)):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        assert _matches(sequences, chr(cp).encode()) == (lo <= cp <= hi)
    # every byte string a sequence allows is a valid encoding of a code point in range
    for s in sequences:
        for pick in (min, max):
            text = bytes(pick(r) for r in s).decode()
            assert len(text) == 1 and lo <= ord(text) <= hi


@pytest.mark.parametrize("regex", REGEXES)
@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_token_index_agrees_with_outlines_core(regex: str, kind: str, request) -> None:
    vocab = request.getfixturevalue(f"{'byte' if kind == 'byte_level' else 'sp'}_lm").vocab
    # A closing character follows, as in JSON: at the very end of a regex outlines-core
    # drops continuations past a match (see test_longer_alternatives_survive_...).
    ours, theirs = _random_walks(f"(?:{regex})#", vocab, walks=6)
    assert ours == theirs


def test_token_index_agrees_with_outlines_core_on_schema_regexes(byte_lm) -> None:
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "tags": {"type": "array", "items": {"enum": ["red", "green"]}},
            "when": {"type": "string", "format": "date"},
            "note": {"anyOf": [{"type": "string", "maxLength": 4}, {"type": "null"}]},
        },
        "required": ["id", "tags"],
    }
    ours, theirs = _random_walks(constraint_of(schema).regex, byte_lm.vocab, walks=10)
    assert ours == theirs


def _random_walks(regex: str, vocab, walks: int) -> tuple[list, list]:
    """(allowed, final) per visited state for both indexes, along the same random token paths.

    Tokens that are not whole UTF-8 characters are left out of the comparison:
    after the first character outlines-core stops allowing them (a byte-level
    model can still spell a character in two tokens; we allow it).
    """
    whole = {i for i, b in enumerate(vocab.token_bytes) if b and _is_utf8(b)} | {vocab.eos_token_id}
    ours, theirs = TokenIndex.from_regex(regex, vocab), Index(regex, Vocabulary(vocab.eos_token_id, vocab.outlines_map()))
    seen_ours, seen_theirs, rng = [], [], random.Random(0)
    for _ in range(walks):
        a, b = ours.get_initial_state(), theirs.get_initial_state()
        for _ in range(25):
            allowed_a, allowed_b = set(ours.get_allowed_tokens(a)) & whole, set(theirs.get_allowed_tokens(b)) & whole
            seen_ours.append((sorted(allowed_a), ours.is_final_state(a)))
            seen_theirs.append((sorted(allowed_b), theirs.is_final_state(b)))
            choices = sorted(allowed_b - {vocab.eos_token_id})
            if not choices or allowed_a != allowed_b:
                break
            token = rng.choice(choices)
            a, b = ours.get_next_state(a, token), theirs.get_next_state(b, token)
    return seen_ours, seen_theirs


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_longer_alternatives_survive_at_the_end_of_a_regex(byte_lm) -> None:
    # outlines-core's Index accepts only "a" here; the language has "ab" too.
    index = TokenIndex.from_regex("(a|ab)", byte_lm.vocab)
    dfa = index.dfa
    after_a = dfa.step(dfa.initial, b"a")
    assert dfa.is_final(after_a) and dfa.is_final(dfa.step(after_a, b"b"))
    assert dfa.step(dfa.initial, b"abb") == DEAD


def test_eos_is_allowed_exactly_in_final_states_and_leads_nowhere(byte_lm) -> None:
    index = TokenIndex.from_regex("ab?", byte_lm.vocab)
    eos = byte_lm.vocab.eos_token_id
    start = index.get_initial_state()
    assert eos not in index.get_allowed_tokens(start)
    a = index.get_next_state(start, byte_lm.tokenizer.convert_tokens_to_ids("a"))
    assert eos in index.get_allowed_tokens(a) and index.get_next_state(a, eos) is None


def test_states_are_built_only_when_reached() -> None:
    # 200 alternatives of 20 characters: an eager DFA would build thousands of states.
    words = ["".join(random.Random(i).choice("abcdefgh") for _ in range(20)) for i in range(200)]
    dfa = LazyDFA(ByteNFA("(" + "|".join(words) + ")"))
    assert len(dfa) == 2  # dead and initial
    dfa.step(dfa.initial, words[0][:3].encode())
    assert len(dfa) < 30


@pytest.mark.parametrize(
    ("regex", "message"),
    [("a(b", "missing ), unterminated subpattern at position 1"), ("^ab$", "at (anchors"), ("a(?=b)", "assert"),
     ("(a)\\1", "groupref"), ("(?i)ab", "inline flags")],
)
def test_unsupported_or_invalid_regexes_are_refused_by_name(regex: str, message: str) -> None:
    with pytest.raises(RegexError, match=re.escape(message)):
        ByteNFA(regex)


def _object_schema(k: int, depth: int) -> dict:
    leaf = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(k)}}
    return leaf if depth == 1 else {"type": "object", "properties": {f"o{i}": _object_schema(k, depth - 1) for i in range(k)}}


def test_repeated_groups_are_shared_and_the_language_kept() -> None:
    # outlines-core spells k optional properties in O(k²) text; hash-consing makes the NFA O(k).
    sizes = {k: len(ByteNFA(constraint_of(_object_schema(k, 1)).regex)) for k in (16, 32)}
    assert sizes[32] < 2.5 * sizes[16]
    schema = {"anyOf": [_object_schema(4, 2), {"type": "array", "items": _object_schema(3, 1)}]}
    regex = constraint_of(schema).regex
    dfa, rng = LazyDFA(ByteNFA(regex)), random.Random(0)

    def sample(node: dict) -> str:
        if node.get("type") == "integer":
            return str(rng.randint(-5, 50))
        keys = [k for k in node["properties"] if rng.random() < 0.5]
        return "{" + ",".join(f'"{k}":{sample(node["properties"][k])}' for k in keys) + "}"

    texts = [sample(_object_schema(4, 2)) for _ in range(100)]
    texts += ["[" + ",".join(sample(_object_schema(3, 1)) for _ in range(rng.randint(0, 3))) + "]" for _ in range(50)]
    mutated = [t.replace(",", ",,", 1) for t in texts] + [t[:-1] for t in texts] + [t.replace("p1", "p9") for t in texts]
    for text in texts + mutated:
        accepted = dfa.is_final(dfa.step(dfa.initial, text.encode()))
        assert accepted == bool(re.fullmatch(regex, text)), text
