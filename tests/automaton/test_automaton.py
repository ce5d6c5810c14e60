"""The automaton stack (UTF-8 ranges, NFA, lazy DFA, token FSM), checked against outlines-core's `Index`."""

from __future__ import annotations

import random
import re
import sys
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from outlines_core import Index, Vocabulary

from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton import UnspellableError
from structspec.automaton import fsm as fsm_module
from structspec.automaton.fsm import _MEMORY_LIMIT, TokenFSM, clear_cache
from structspec.automaton.index import _region
from structspec.automaton import nfa as nfa_module
from structspec.automaton.nfa import ByteNFA
from structspec.automaton.utf8 import byte_sequences, normalize
from structspec.errors import RegexError
from structspec.schema import constraint_of
from structspec.vocab import TokenVocab

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


@pytest.mark.slow
@given(st.integers(0, 0x10FFFF), st.integers(0, 3000), st.data())
@settings(max_examples=200, deadline=None)
def test_utf8_sequences_match_exactly_the_encodings_of_the_range(lo: int, width: int, data) -> None:
    hi = min(lo + width, 0x10FFFF)
    sequences = byte_sequences(normalize(((lo, hi),)))  # surrogates are taken out first
    for cp in data.draw(st.lists(st.integers(max(0, lo - 5), min(hi + 5, 0x10FFFF)), max_size=30)):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        assert _matches(sequences, chr(cp).encode()) == (lo <= cp <= hi)
    # every byte string a sequence allows is a valid encoding of a code point in range
    for s in sequences:
        for pick in (min, max):
            text = bytes(pick(r) for r in s).decode()
            assert len(text) == 1 and lo <= ord(text) <= hi


@pytest.mark.slow
@pytest.mark.parametrize("regex", REGEXES)
@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_token_fsm_agrees_with_outlines_core(regex: str, kind: str, request) -> None:
    vocab = request.getfixturevalue(f"{'byte' if kind == 'byte_level' else 'sp'}_lm").vocab
    # A closing character follows, as in JSON: at the very end of a regex outlines-core
    # drops continuations past a match (see test_longer_alternatives_survive_...).
    ours, theirs = _random_walks(f"(?:{regex})#", vocab, walks=6)
    assert ours == theirs


@pytest.mark.slow
def test_token_fsm_agrees_with_outlines_core_on_schema_regexes(byte_lm) -> None:
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
    """(allowed, final) per visited state for our FSM and outlines-core's Index, along the same random token paths.

    Tokens that are not whole UTF-8 characters are left out of the comparison:
    after the first character outlines-core stops allowing them (a byte-level
    model can still spell a character in two tokens; we allow it).
    """
    whole = {i for i, b in enumerate(vocab.token_bytes) if b and _is_utf8(b)} | {vocab.eos_token_id}
    ours, theirs = TokenFSM.from_regex(regex, vocab), Index(regex, Vocabulary(vocab.eos_token_id, vocab.outlines_map()))
    seen_ours, seen_theirs, rng = [], [], random.Random(0)
    for _ in range(walks):
        a, b = ours.initial_state, theirs.get_initial_state()
        for _ in range(25):
            allowed_a = set(ours.allowed_token_ids(a).tolist()) & whole
            allowed_b = set(theirs.get_allowed_tokens(b)) & whole
            seen_ours.append((sorted(allowed_a), ours.is_final(a)))
            seen_theirs.append((sorted(allowed_b), theirs.is_final_state(b)))
            choices = sorted(allowed_b - {vocab.eos_token_id})
            if not choices or allowed_a != allowed_b:
                break
            token = rng.choice(choices)
            a, b = ours.next_state(a, token), theirs.get_next_state(b, token)
    return seen_ours, seen_theirs


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


def test_longer_alternatives_survive_at_the_end_of_a_regex() -> None:
    # outlines-core's Index accepts only "a" here; the language has "ab" too.
    dfa = LazyDFA(ByteNFA("(a|ab)"))
    after_a = dfa.step(dfa.initial, b"a")
    assert dfa.is_final(after_a) and dfa.is_final(dfa.step(after_a, b"b"))
    assert dfa.step(dfa.initial, b"abb") == DEAD


def test_eos_is_allowed_exactly_in_final_states_and_leads_nowhere(byte_lm) -> None:
    fsm = TokenFSM.from_regex("ab?", byte_lm.vocab)
    eos = byte_lm.vocab.eos_token_id
    start = fsm.initial_state
    assert eos not in fsm.allowed_token_ids(start)
    a = fsm.next_state(start, byte_lm.tokenizer.convert_tokens_to_ids("a"))
    assert eos in fsm.allowed_token_ids(a) and fsm.next_state(a, eos) is None and fsm.is_final(a)


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_a_one_token_walk_answers_as_a_longer_walk_does(kind: str, request: pytest.FixtureRequest) -> None:
    # (one token is a decode step's accept: it walks by next_state, a longer walk in the core where there is one)
    lm = request.getfixturevalue(kind)
    fsm = TokenFSM.from_regex(r'\{"k":"[a-z]{0,4}"\}', lm.vocab, len(lm.vocab) + 5)
    prefix = lm.tokenizer.encode('{"k":"ab', add_special_tokens=False)
    states = [fsm.initial_state] + fsm.walk(fsm.initial_state, prefix)
    for state in states:
        for token in range(-2, len(lm.vocab) + 5):
            assert fsm.walk(state, [token]) == fsm.walk(state, [token, -1]), (state, token)


def test_allowed_token_ids_are_one_sorted_read_only_array_per_state(sp_lm) -> None:
    fsm = TokenFSM.from_regex("(ab|b)?", sp_lm.vocab)  # final at the start: EOS (a low id here) is allowed
    allowed = fsm.allowed_token_ids(fsm.initial_state)
    assert sp_lm.vocab.eos_token_id in allowed and list(allowed) == sorted(allowed)
    assert not allowed.flags.writeable
    assert fsm.allowed_token_ids(fsm.initial_state) is allowed
    assert not fsm.is_complete(fsm.initial_state)
    after = fsm.walk(fsm.initial_state, [sp_lm.vocab.token_bytes.index(b"b")])
    assert len(after) == 1 and fsm.is_complete(after[0])


def test_states_are_built_only_when_reached() -> None:
    # 200 alternatives of 20 characters: an eager DFA would build thousands of states.
    words = ["".join(random.Random(i).choice("abcdefgh") for _ in range(20)) for i in range(200)]
    dfa = LazyDFA(ByteNFA("(" + "|".join(words) + ")"))
    assert len(dfa) == 2  # dead and initial
    dfa.step(dfa.initial, words[0][:3].encode())
    assert len(dfa) < 30


@pytest.mark.parametrize(
    ("regex", "message"),
    [("a(b", "missing ), unterminated subpattern at position 1"), ("a\\b", "word boundaries"), ("a(?=b)", "lookarounds"),
     ("(a)\\1", "backreferences"), ("(?i)ab", "inline flags")],
)
def test_unsupported_or_invalid_regexes_are_refused_by_name(regex: str, message: str) -> None:
    with pytest.raises(RegexError, match=re.escape(message)):
        ByteNFA(regex)


def _object_schema(k: int, depth: int) -> dict:
    leaf = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(k)}}
    return leaf if depth == 1 else {"type": "object", "properties": {f"o{i}": _object_schema(k, depth - 1) for i in range(k)}}


@pytest.mark.slow
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


def _same_language_on_walks(a: LazyDFA, b: LazyDFA, walks: int, length: int) -> None:
    """Random byte walks through ``a``: at every step ``b`` allows the same next bytes and agrees on finality."""
    rng = random.Random(0)
    for _ in range(walks):
        x, y = a.initial, b.initial
        for _ in range(length):
            a.ensure(np.array([x]))
            b.ensure(np.array([y]))
            live = np.flatnonzero(a.table[x] != DEAD)
            assert live.tolist() == np.flatnonzero(b.table[y] != DEAD).tolist()
            assert a.is_final(x) == b.is_final(y)
            if not len(live):
                break
            byte = int(rng.choice(live))
            x, y = int(a.table[x, byte]), int(b.table[y, byte])


@pytest.mark.slow
def test_a_large_group_needed_in_many_places_is_built_once_and_called(monkeypatch) -> None:
    # closed objects: an open one's any-value alternative (numbers bounded to parse finite) would dwarf the group
    item = {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 4} for i in range(10)},
            "required": ["f0", "f9"], "additionalProperties": False}
    schema = {"type": "object", "$defs": {"item": item}, "required": [f"p{i}" for i in range(0, 30, 3)],
              "properties": {f"p{i}": {"$ref": "#/$defs/item"} for i in range(30)}, "additionalProperties": False}
    # A large group that can never finish, in three places: never built, like any part matching no string.
    dead = r"([a-z]{70})[^\s\S]"
    sizes = []
    for regex in (constraint_of(schema).regex, rf"(?:{dead}|a)b(?:{dead}|c)d(?:{dead}|e)"):
        called = ByteNFA(regex)
        lazy = len(called)
        monkeypatch.setattr(nfa_module, "FRAGMENT_MIN", 10**9)
        inlined = ByteNFA(regex)  # (no fragment: built whole)
        monkeypatch.undo()
        assert not inlined.calls
        _same_language_on_walks(LazyDFA(called), LazyDFA(inlined), walks=150, length=400)
        sizes.append((lazy, len(called.build_all()), len(inlined)))
    assert 3 * sizes[0][0] < sizes[0][1]  # compiling builds the outer object (its keys and calls) only
    assert 5 * sizes[0][1] < sizes[0][2]  # the item's states once, not once per property
    assert max(sizes[1][1:]) < 20  # the dead group's 70 states: built nowhere
    twice = ByteNFA(r"(x[a-z]{70}y)-(x[a-z]{70}y)").build_all()
    assert len(twice) < 90  # needed twice: built once, as a fragment that both places call
    assert sorted(Counter(call[0] for call in twice.calls.values()).values()) == [2]


@pytest.mark.slow
@pytest.mark.parametrize("regex", [
    r'"([^"\\]|\\["\\nt]){0,300}"', r"a{3,400}b", r"(ab|c){90,}d", r"((ab){2,20}c){1,30}", r"(é|x[0-9]){100}y?",
    r"(a{0,70}[^\s\S]|b){1,200}c", r"((x?){3}y){40,60}",
])
def test_large_counted_repeats_are_counters_with_the_language_of_copies(regex: str, monkeypatch) -> None:
    counted = ByteNFA(regex)
    monkeypatch.setattr(nfa_module, "COUNTER_MIN", 10**9)
    copied = ByteNFA(regex).build_all()  # (fragments are built lazily: all of them while copies are asked for)
    monkeypatch.undo()
    counters = [call for call in counted.build_all().calls.values() if call[2:] != (1, 1)]
    assert counters and all(call[2:] == (1, 1) for call in copied.calls.values())
    assert len(counted) < len(copied)
    _same_language_on_walks(LazyDFA(counted), LazyDFA(copied), walks=60, length=900)
    rng, a, b = random.Random(1), LazyDFA(counted), LazyDFA(copied)
    for _ in range(300):  # near the bounds, where walks rarely stop
        text = "".join(rng.choice("abcxyé0\"\\nt") for _ in range(rng.choice([5, 60, 120, 250, 305])))
        assert a.is_final(a.step(a.initial, text.encode())) == b.is_final(b.step(b.initial, text.encode()))


@pytest.mark.slow
def test_a_string_with_a_huge_max_length_costs_one_body_and_counts_exactly() -> None:
    regex = constraint_of({"type": "string", "maxLength": 5000}).regex
    nfa = ByteNFA(regex)
    assert len(nfa) < 200  # copies: 5,000 bodies of a dozen states
    dfa = LazyDFA(nfa)
    for n, accepted in ((0, True), (4999, True), (5000, True), (5001, False)):
        assert dfa.is_final(dfa.step(dfa.initial, ('"' + "é" * n + '"').encode())) is accepted, n
    assert dfa.step(dfa.initial, b'"' + b"a" * 5001) == DEAD


def test_the_compile_cache_is_bounded_and_cleared_by_its_owner(byte_lm, monkeypatch) -> None:
    monkeypatch.setattr(fsm_module, "DISK_MIN_SECONDS", 0.0)  # every automaton goes to disk
    vocab = byte_lm.vocab
    assert TokenFSM.from_regex("clear-[0-9]", vocab).info.source in ("compiled", "disk")
    assert TokenFSM.from_regex("clear-[0-9]", vocab).info.source == "memory"
    clear_cache()
    assert TokenFSM.from_regex("clear-[0-9]", vocab).info.source == "disk"
    clear_cache(disk=True)
    assert TokenFSM.from_regex("clear-[0-9]", vocab).info.source == "compiled"
    for i in range(_MEMORY_LIMIT):  # the first one is now the least recently used
        TokenFSM.from_regex(f"bound-{i}", vocab)
    assert TokenFSM.from_regex("clear-[0-9]", vocab).info.source == "disk"
    assert TokenFSM.from_regex(f"bound-{_MEMORY_LIMIT - 1}", vocab).info.source == "memory"


def _observe(fsm: TokenFSM, tokens: list[int]) -> list[tuple[list[int], bool, list[int]]]:
    """(allowed ids, final, packed mask) at each state along ``tokens``: answers, not state numbers."""
    bitmask = fsm.allocate_token_bitmask(len(tokens) + 1)
    states = [fsm.initial_state] + fsm.walk(fsm.initial_state, tokens)
    out = []
    for row, state in enumerate(states):
        fsm.fill_next_token_bitmask(bitmask, row, state)
        out.append((fsm.allowed_token_ids(state).tolist(), fsm.is_final(state), bitmask[row].tolist()))
    return out


@pytest.mark.slow
def test_threads_sharing_an_fsm_get_the_answers_of_one_thread(byte_lm, monkeypatch) -> None:
    monkeypatch.setattr(fsm_module, "DISK_MIN_SECONDS", 0.0)  # (read back from disk below)
    # The lazy DFA and the mask caches are built during reads; interleave those builds across threads.
    regex = constraint_of({"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6}, "n": {"type": "integer"}, "ok": {"type": "boolean"}}}}).regex
    clear_cache()
    reference = TokenFSM.from_regex(regex, byte_lm.vocab)
    paths = []
    for seed in range(6):
        rng, state, path = random.Random(seed), reference.initial_state, []
        while len(path) < 30 and not reference.is_complete(state):
            token = rng.choice([t for t in reference.allowed_token_ids(state).tolist() if t != reference.eos_token_id])
            path.append(token)
            state = reference.next_state(state, token)
        paths.append(path)
    expected = [_observe(reference, path) for path in paths]
    clear_cache()
    shared = TokenFSM.from_regex(regex, byte_lm.vocab)  # read back from disk: nothing built yet
    assert shared.info.source == "disk" and shared.index is not reference.index
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(len(paths)) as pool:
            observed = list(pool.map(lambda path: _observe(shared, path), paths))
    finally:
        sys.setswitchinterval(interval)
    assert observed == expected


# --- bad input: empty languages at compile time, unspellable states when first reached ----------------------

@pytest.mark.parametrize("regex", [r"[^\s\S]", r"a*[^\s\S]", r"(a|b)c[^\s\S]d", "\ud800", r"((x?){2000}){2000}"])
def test_a_regex_matching_nothing_or_too_large_is_a_regex_error(regex: str) -> None:
    with pytest.raises(RegexError, match="matches no string|automaton states"):
        ByteNFA(regex)


@pytest.mark.parametrize(("regex", "left", "kept"), [
    (r"(a[^\s\S]|b)c", b"a", b"bc"), (r"(?:([a-z]{70})[^\s\S]|a)b(?:x{20}[^\s\S]y|c)*d", b"ab" + b"x" * 20, b"abccd"),
    ("(é\ud800|x)+(\ud800{30}|[0-9]{2,300})", "é".encode(), b"xx123"),
])
def test_parts_matching_no_string_are_never_built_so_every_state_can_still_finish(
        regex: str, left: bytes, kept: bytes) -> None:
    dfa, rng = LazyDFA(ByteNFA(regex)), random.Random(0)
    assert dfa.step(dfa.initial, left) == DEAD and dfa.is_final(dfa.step(dfa.initial, kept))
    for _ in range(200):
        state = dfa.initial
        for _ in range(60):
            live = dfa.next_bytes(state)
            assert live or dfa.is_final(state)  # no dead end: a walk can always go on or stop
            if not live or (dfa.is_final(state) and rng.random() < 0.1):
                break
            state = int(dfa.table[state, rng.choice(live)])


def _toy_vocab(*tokens: bytes) -> TokenVocab:
    return TokenVocab((*tokens, None), len(tokens), "toy:" + ",".join(t.hex() for t in tokens))


def test_a_state_the_vocabulary_cannot_leave_names_the_characters_needed() -> None:
    fsm = TokenFSM.from_regex("ab*(z|é)", _toy_vocab(b"a", b"b", b"ab", "é".encode()[:1]))
    after_a = fsm.next_state(fsm.initial_state, 0)
    assert sorted(fsm.allowed_token_ids(after_a).tolist()) == [1, 3]  # b, and the first byte of é
    mid = fsm.next_state(after_a, 3)
    for read in (fsm.allowed_token_ids, fsm.is_complete,
                 lambda s: fsm.fill_next_token_bitmask(fsm.allocate_token_bitmask(1), 0, s)):
        with pytest.raises(UnspellableError, match=r"\\xa9") as caught:
            read(mid)
        assert caught.value.characters == ["\\xa9"]
    fsm = TokenFSM.from_regex("a[xyz]", _toy_vocab(b"a", b"b"))
    with pytest.raises(UnspellableError, match="'x', 'y', 'z'"):
        fsm.allowed_token_ids(fsm.next_state(fsm.initial_state, 0))


def test_a_state_the_vocabulary_cannot_leave_is_walked_once_however_it_is_read(monkeypatch) -> None:
    fsm = TokenFSM.from_regex("ab*(q|é)", _toy_vocab(b"a", b"b", b"ab", "é".encode()[:1]))  # (its own index)
    after_a = fsm.next_state(fsm.initial_state, 0)
    mid = fsm.next_state(after_a, 3)  # after é's first byte: the vocabulary has no token for the second
    walked, walk = [], fsm.index._compute_bytes
    monkeypatch.setattr(fsm.index, "_compute_bytes", lambda state: walked.append(state) or walk(state))
    verdicts = [fsm.unspellable(state) for state in (after_a, mid, after_a, mid, mid)]
    assert verdicts[0] is verdicts[2] is None
    assert isinstance(verdicts[1], UnspellableError) and verdicts[1] is verdicts[3] is verdicts[4]
    assert [fsm.spellable(after_a), fsm.spellable(mid)] == [True, False]
    depths = []
    for read in (fsm.allowed_token_ids, fsm.packed_mask, fsm.is_complete, fsm.allowed_token_ids):
        with pytest.raises(UnspellableError) as caught:
            read(mid)
        assert caught.value is verdicts[1]
        depths.append(len(traceback.extract_tb(caught.tb)))
    assert depths[0] == depths[3]  # the kept error's old traceback does not pile up under the new one
    assert walked == [after_a, mid]  # each state's vocabulary walk once, however often and however it is read


def test_a_final_state_with_only_eos_is_not_unspellable() -> None:
    fsm = TokenFSM.from_regex("a", _toy_vocab(b"a", b"b"))
    end = fsm.next_state(fsm.initial_state, 0)
    assert fsm.is_complete(end) and fsm.allowed_token_ids(end).tolist() == [fsm.eos_token_id]


def test_tokens_past_the_logits_width_do_not_count_as_allowed() -> None:
    fsm = TokenFSM.from_regex("b", _toy_vocab(b"a", b"b"), logits_width=1)
    with pytest.raises(UnspellableError, match="'b'"):
        fsm.allowed_token_ids(fsm.initial_state)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_each_state_allows_exactly_the_tokens_whose_bytes_it_reads(kind: str, request) -> None:
    # A state alone (a brace, a quote) and a state in a region of several (a string's characters, with the states
    # of its multi-byte characters): both against stepping each token's bytes.
    vocab = request.getfixturevalue(kind).vocab
    counts = set()
    for regex in REGEXES:
        fsm = TokenFSM.from_regex(f"(?:{regex})#", vocab)
        dfa, seen, todo = fsm.index.dfa, set(), [fsm.initial_state]
        while todo and len(seen) < 8:  # the first states in breadth-first order
            state = todo.pop(0)
            if state in seen:
                continue
            seen.add(state)
            allowed = set(fsm.allowed_token_ids(state).tolist()) - set(fsm.index.eos_token_ids)
            stepped = {i for i, data in enumerate(vocab.token_bytes)
                       if data and i != vocab.eos_token_id and dfa.step(state, data) != DEAD}
            assert allowed == stepped, (regex, state)
            counts.add(_region(dfa, state)[1] > 1)
            todo += [int(dfa.table[state, byte]) for byte in dfa.next_bytes(state)]
    assert counts == {True, False}  # both kinds of region were checked
