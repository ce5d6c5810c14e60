"""The token index's walk (region shapes, then a trie of the tokens that leave them) against stepping every token's
bytes through the DFA, on random regexes and both tokenizer families."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automaton import index as index_module
from structspec.automaton.dfa import DEAD
from structspec.automaton.fsm import TokenFSM, clear_cache
from structspec.automaton.index import pack, vocab_bytes
from structspec.cache import cache_dir
from structspec.errors import UnspellableError

# Leaves: characters alone and in classes (multi-byte ones too), a JSON string's characters, digits, an escape.
LEAVES = ["a", "b", "é", "日", '"', ",", "[a-c]", "[^\"\\\\]", r"\d", "[0-9a-f]", "[é-ü]", r'\\["\\/bfnrt]', "."]


def _regexes() -> st.SearchStrategy[str]:
    def grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.lists(inner, min_size=2, max_size=4).map("".join),
            st.lists(inner, min_size=2, max_size=3).map(lambda parts: "(" + "|".join(parts) + ")"),
            st.tuples(inner, st.sampled_from(["*", "+", "?", "{1,3}", "{2}"])).map(lambda p: f"({p[0]}){p[1]}"),
        )
    return st.recursive(st.sampled_from(LEAVES), grow, max_leaves=8)


def _stepped(fsm: TokenFSM, state: int) -> set[int]:
    """The tokens whose bytes stay alive from ``state``, one token at a time (EOS aside)."""
    vocab, dfa = fsm.vocab, fsm.index.dfa
    return {i for i, data in enumerate(vocab.token_bytes)
            if data and i != vocab.eos_token_id and dfa.step(state, data) != DEAD}


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
@given(regex=_regexes(), extra=st.integers(-5, 40), picks=st.lists(st.integers(0, 10**6), max_size=12))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_each_visited_state_allows_exactly_the_tokens_whose_bytes_it_reads(
        kind: str, regex: str, extra: int, picks: list[int], request) -> None:
    # A closing "#" keeps every state short of the end, as a JSON document's closing brace does.
    vocab = request.getfixturevalue(kind).vocab
    width = len(vocab) + extra
    fsm = TokenFSM.from_regex(f"(?:{regex})#", vocab, logits_width=width)
    state = fsm.initial_state
    for pick in [0, *picks]:  # a random walk: each state's answer against the stepped one
        expected = _stepped(fsm, state)
        try:
            allowed = fsm.allowed_token_ids(state)
        except UnspellableError:
            assert not {i for i in expected if i < width}
            return
        assert set(allowed.tolist()) - set(fsm.eos_token_ids) == expected
        assert np.array_equal(fsm.packed_mask(state), pack(allowed, width))
        choices = sorted(expected)
        if not choices:
            return
        state = fsm.next_state(state, choices[pick % len(choices)])


def test_a_string_field_of_another_schema_walks_no_new_shape(byte_lm) -> None:
    # Every string field's characters make one region shape per tokenizer: its walk is shared across schemas.
    string = r'"([^"\\\x00-\x1f]|\\["\\/bfnrt])*"'
    shapes = vocab_bytes(byte_lm.vocab)._shapes
    for regex in (rf'\{{"name":{string}\}}', rf'\{{"city":{string},"zip":{string}\}}'):
        fsm = TokenFSM.from_regex(regex, byte_lm.vocab)
        prefix = regex.split(":")[0].replace("\\", "").encode() + b':"'
        inside = fsm.index.dfa.step(fsm.initial_state, prefix)
        before = len(shapes)
        fsm.allowed_token_ids(inside)
        walked = len(shapes) - before
        assert set(fsm.allowed_token_ids(inside).tolist()) == _stepped(fsm, inside)
        if regex.startswith(r'\{"city"'):
            assert walked == 0


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_the_counts_of_a_string_with_a_max_length_walk_one_shape_across_schemas(kind: str, request) -> None:
    # Each count of a string with a maxLength is a state of its own with no loop near it: its region is the counts
    # ahead, which relabel alike far from the string's end, so one walk of the vocabulary serves every such count
    # of every such string; each count's answer is still the stepped one.
    vocab = request.getfixturevalue(kind).vocab
    character = r'([^"\\\x00-\x1f]|\\["\\/bfnrt])'
    shapes = vocab_bytes(vocab)._shapes
    for regex, walked in ((rf'\{{"a":"{character}{{0,40}}"\}}', None), (rf'\{{"bb":"{character}{{2,50}}",', 0)):
        fsm = TokenFSM.from_regex(regex, vocab)
        state = fsm.index.dfa.step(fsm.initial_state, regex.split(":")[0].replace("\\", "").encode() + b':"ab')
        before = len(shapes)
        for text in ["", "c", "d", "é", "\\n", "日"]:
            state = fsm.index.dfa.step(state, text.encode())
            assert set(fsm.allowed_token_ids(state).tolist()) == _stepped(fsm, state)
        assert walked is None or len(shapes) - before == walked


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
@pytest.mark.parametrize("names", [["name"], ["name", "nick", "age"], ["é", "x"]])
def test_a_key_that_may_be_any_string_walks_only_the_tokens_that_start_as_a_property_name(
        kind: str, names: list[str], request, monkeypatch) -> None:
    # After '{"' in an object with free keys, each object's first key character is a region shape of its own (its
    # row is the string's but on its properties' first letters): only the tokens starting otherwise are walked,
    # the rest read off the string's answer; the answers are those of stepping every token.
    vocab = request.getfixturevalue(kind).vocab
    string = r'([^"\\\x00-\x1f]|\\["\\/bfnrt])*'
    regex = rf'\{{"({"|".join(names)}|{string})":1\}}'
    walked: list[int] = []
    walk = index_module._VocabBytes._walk_shape

    def spy(self, table, regions):
        walked.append(int((table[1] != 0).sum()))
        return walk(self, table, regions)

    monkeypatch.setattr(index_module._VocabBytes, "_walk_shape", spy)
    vocab_bytes(vocab).forget_shapes()
    clear_cache(disk=True)
    fsm = TokenFSM.from_regex(regex, vocab)
    key = fsm.index.dfa.step(fsm.initial_state, b'{"')
    assert set(fsm.allowed_token_ids(key).tolist()) == _stepped(fsm, key)
    assert walked[-1] <= 2 * len(names)  # the key's own walk: its properties' first bytes and the escape's
    for text in [*names, "zz", "n", "\\n", "é"]:  # on into the key: each state as stepping reads it
        state = fsm.index.dfa.step(key, text.encode())
        if state != DEAD:
            assert set(fsm.allowed_token_ids(state).tolist()) == _stepped(fsm, state)


def test_a_slow_shape_walk_is_read_back_from_disk_by_the_next_process_and_cleared(byte_lm, monkeypatch) -> None:
    monkeypatch.setattr(index_module, "SHAPE_DISK_SECONDS", 0.0)  # every walk is stored
    clear_cache(disk=True)
    vocab = byte_lm.vocab
    dfa = TokenFSM.from_regex('"[^"]*"x', vocab).index.dfa
    table, regions, _ = index_module._region(dfa, dfa.step(dfa.initial, b'"'))  # a string's characters
    fresh = index_module._VocabBytes(vocab)  # what a new process has: nothing in memory
    walked = fresh.shape(table, regions)
    stored = list(cache_dir("shapes").glob("*.shape"))
    assert len(stored) == 1

    def no_walk(*args):
        raise AssertionError("walked again")

    later = index_module._VocabBytes(vocab)
    monkeypatch.setattr(later, "_walk_shape", no_walk)
    read = later.shape(table, regions)
    assert np.array_equal(read.base, walked.base) and len(read.levels) == len(walked.levels)
    assert all(np.array_equal(a, b) for x, y in zip(read.levels, walked.levels) for a, b in zip(x, y))
    clear_cache(disk=True)
    assert not list(cache_dir("shapes").glob("*.shape"))


def test_a_first_visit_builds_without_the_cyclic_collector_and_restores_it(byte_lm, monkeypatch) -> None:
    # What a first visit builds (DFA states, NFA positions) is all kept: the collector's passes would free nothing.
    enabled = []
    region = index_module._region

    def spy(*args):
        enabled.append(gc.isenabled())
        return region(*args)

    monkeypatch.setattr(index_module, "_region", spy)
    clear_cache()
    fsm = TokenFSM.from_regex('"[^"]*"y', byte_lm.vocab)
    fsm.allowed_token_ids(fsm.initial_state)
    assert enabled == [False] and gc.isenabled()
