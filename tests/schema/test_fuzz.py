"""Fuzzing: hostile regexes, schemas, patterns and prompts end in a valid result or a `StructspecError`,
within a time limit, and never in another exception, a hang or a MemoryError.

Each case compiles (and, where it compiles, decodes a few tokens on a tiny random
model) under `signal.alarm`; hypothesis runs derandomized with no per-example
deadline, so the run is the same on a loaded machine. About 1,100 cases in all.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import structspec
from structspec import Regex
from structspec.automaton import fsm as fsm_module
from structspec.errors import RegexError, SchemaError, StructspecError
from structspec.schema import to_regex, validator

# A watchdog per test: a hang fails the run instead of stalling CI (thread method: hypothesis's own
# deadlines and any SIGALRM a test sets stay untouched).
pytestmark = pytest.mark.timeout(900, method="thread")

SCALE = int(os.environ.get("STRUCTSPEC_FUZZ_SCALE", "1"))  # a longer run: STRUCTSPEC_FUZZ_SCALE=10
SECONDS = 90  # per case: a guard against hangs, not a timing (a 300-level case takes 20-30 s on a busy 2-core CPU)
FUZZ = settings(derandomize=True, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


class Hang(Exception):
    """A case ran past `SECONDS` (not a StructspecError, so the test fails)."""


@contextmanager
def time_limit(seconds: int = SECONDS) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Hang(f"a case ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def outcome(run: Callable[[], Any]) -> Any:
    """What ``run`` returns, or the `StructspecError` it raises; anything else fails the test."""
    with time_limit():
        try:
            return run()
        except StructspecError as e:
            assert str(e), "an error must say what went wrong"
            return e


def decode_checked(lm: structspec.LM, spec: Any, prompt: str = "Out:", tokens: int = 6) -> Any:
    """Compile ``spec`` and decode a few tokens; a complete output is checked, a partial one must be a
    prefix the FSM accepts token by token."""
    compiled = structspec.compile(spec, lm)
    result = structspec.generate_result(lm, spec, prompt, max_new_tokens=tokens)
    fsm = compiled.fsm
    states = fsm.walk(fsm.initial_state, result.token_ids)
    assert len(states) == len(result.token_ids), result.text
    if result.complete:
        assert fsm.is_final(states[-1]) if states else fsm.is_final(fsm.initial_state)
        if isinstance(spec, Regex):
            assert result.value == result.text
        else:
            validator(spec).validate(json.loads(result.text))
    else:
        assert result.stop_reason == "max_new_tokens", result.stop_reason
    return result


def compile_and_walk(lm: structspec.LM, regex: str) -> None:
    """Compile ``regex`` and follow the smallest allowed token a few times: masks on every state reached."""
    fsm = structspec.compile(Regex(regex), lm).fsm
    state = fsm.initial_state
    for _ in range(4):
        allowed = [t for t in fsm.allowed_token_ids(state).tolist() if t != fsm.eos_token_id]
        masks = fsm.allocate_token_bitmask(1)
        fsm.fill_next_token_bitmask(masks, 0, state)
        if not allowed:
            assert fsm.is_final(state)
            return
        state = fsm.next_state(state, allowed[0])
        assert state is not None


# --- regexes: random text, and text drawn from regex syntax and hostile Unicode -----------------------------

HOSTILE = "\ud800\udfff\uffff\ufeff\u0301\u0308\u200d\U0010ffff\x00\n\"\\é𝔘"
SYNTAX = st.text(alphabet=st.sampled_from(list("ab()[]{}|*+?^$\\.-,09dswDSWxu:=!<>#") + list(HOSTILE)),
                 max_size=24)


@pytest.mark.slow
@settings(FUZZ, max_examples=300 * SCALE)
@given(regex=st.one_of(st.text(max_size=24), SYNTAX))
def test_random_regexes(byte_lm: structspec.LM, regex: str) -> None:
    outcome(lambda: compile_and_walk(byte_lm, regex))


@pytest.mark.slow
@settings(FUZZ, max_examples=150 * SCALE)
@given(data=st.binary(max_size=32))
def test_random_bytes_as_regexes(sp_lm: structspec.LM, data: bytes) -> None:
    outcome(lambda: compile_and_walk(sp_lm, data.decode("latin-1")))


@pytest.mark.slow
@settings(FUZZ, max_examples=100 * SCALE)
@given(regex=SYNTAX)
def test_random_regexes_decode(byte_lm: structspec.LM, regex: str) -> None:
    outcome(lambda: decode_checked(byte_lm, Regex(regex)))


# --- schemas: deep nesting, hostile patterns and enums ----------------------------------------------------

def nested(kinds: list[int], leaf: dict) -> dict:
    """``leaf`` wrapped once per entry of ``kinds``: closed object's property, array items, anyOf, allOf, closed
    object's optional property, open object's property; $ref-free."""
    node = leaf
    for k in kinds:
        node = [
            {"type": "object", "properties": {"a": node}, "required": ["a"], "additionalProperties": False},
            {"type": "array", "items": node, "minItems": 1, "maxItems": 1},
            {"anyOf": [node, {"type": "null"}]},
            {"allOf": [node]},
            {"type": "object", "properties": {"a": node, "b": {"type": "integer"}}, "additionalProperties": False},
            {"type": "object", "properties": {"a": node}, "required": ["a"]},
        ][k]
    return node


LEAVES = st.sampled_from([{"type": "integer"}, {"type": "number"}, {"type": "string", "maxLength": 3},
                          {"enum": [1, "x", None]}, {}, {"type": "boolean"}])


@pytest.mark.slow
@settings(FUZZ, max_examples=60 * SCALE)
@given(kinds=st.lists(st.integers(0, 5), min_size=50, max_size=70), leaf=LEAVES)
def test_deeply_nested_schemas(byte_lm: structspec.LM, kinds: list[int], leaf: dict) -> None:
    outcome(lambda: decode_checked(byte_lm, nested(kinds, leaf), tokens=8))


@pytest.mark.slow
@pytest.mark.parametrize("kind", range(5))
def test_nesting_past_the_recursion_limit(byte_lm: structspec.LM, kind: int) -> None:
    """100 levels of each kind decode to a valid value; deeper ones, to 1,000 levels, decode or end in a
    `StructspecError` (never a RecursionError), as does writing their regex text, and 1,000 levels end in a
    `SchemaError` at the deepest pointer."""
    leaf = {"type": "integer"}
    assert decode_checked(byte_lm, nested([kind] * 100, leaf), tokens=1200).complete
    for depth in (100, 150, 200, 300):
        outcome(lambda: decode_checked(byte_lm, nested([kind] * depth, leaf), tokens=1200))
        outcome(lambda: to_regex(nested([kind] * depth, leaf)))  # (the text for other engines)
    error = outcome(lambda: structspec.compile(nested([kind] * 1000, leaf), byte_lm))
    assert isinstance(error, SchemaError) and error.pointer.count("/") >= 999 and "nests" in error.reason, error


def test_a_schema_that_holds_itself_is_a_schema_error(byte_lm: structspec.LM) -> None:
    node: dict = {"type": "object"}
    node["properties"] = {"a": node}
    values: list = []
    values.append(values)
    for schema in (node, {"enum": [values]}):
        error = outcome(lambda: structspec.compile(schema, byte_lm))
        assert isinstance(error, SchemaError) and "holds itself" in error.reason, error


@pytest.mark.slow
@pytest.mark.parametrize("depth", [100, 150, 200, 300, 1000])
def test_regex_nesting_past_the_recursion_limit(byte_lm: structspec.LM, depth: int, monkeypatch) -> None:
    """Nested optional groups compile and mask (past what pickling reaches, without a disk-cache entry) or end
    in a `RegexError` naming the nesting; plain nested groups likewise."""
    monkeypatch.setattr(fsm_module, "DISK_MIN_SECONDS", 0.0)  # (each is pickled for the disk cache, if it can be)
    for regex in ("(a" * depth + "b" + ")?" * depth, "(" * depth + "b" + ")" * depth):
        result = outcome(lambda: compile_and_walk(byte_lm, regex))
        assert result is None or isinstance(result, RegexError) and "nests" in result.reason, result
    if depth <= 200:  # (150 and 200 are too deep to pickle: compiled without a cache entry)
        assert outcome(lambda: compile_and_walk(byte_lm, "(a" * depth + "b" + ")?" * depth)) is None


@pytest.mark.slow
@settings(FUZZ, max_examples=250 * SCALE)
@given(pattern=st.one_of(SYNTAX, st.text(alphabet=st.sampled_from(list("[]^-\\az" + HOSTILE)), max_size=12)),
       lengths=st.sampled_from([{}, {"minLength": 1}, {"maxLength": 2}, {"minLength": 3, "maxLength": 3}]))
def test_hostile_patterns(byte_lm: structspec.LM, pattern: str, lengths: dict) -> None:
    schema = {"type": "object", "properties": {"p": {"type": "string", "pattern": pattern} | lengths},
              "required": ["p"]}
    outcome(lambda: decode_checked(byte_lm, schema, tokens=4))


@pytest.mark.slow
@settings(FUZZ, max_examples=150 * SCALE)
@given(values=st.lists(st.one_of(st.text(max_size=6), st.integers(-10**30, 10**30), st.floats(allow_nan=False),
                                 st.booleans(), st.none()), min_size=0, max_size=30))
def test_hostile_enums(sp_lm: structspec.LM, values: list) -> None:
    outcome(lambda: decode_checked(sp_lm, {"enum": values}, tokens=4))


@pytest.mark.slow
def test_huge_enum_compiles_and_decodes(byte_lm: structspec.LM) -> None:
    values = [f"value-{i}" for i in range(10_000)]
    result = outcome(lambda: decode_checked(byte_lm, {"enum": values}, tokens=12))
    assert not isinstance(result, StructspecError), result


@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": 100_000},
    {"type": "string", "minLength": 100_000},
    {"type": "array", "items": {"type": "string", "maxLength": 100}, "maxItems": 100_000},
    {"type": "string", "pattern": "^[a-z]{100000}$"},
])
def test_huge_counts_end_in_a_result_or_an_error(byte_lm: structspec.LM, schema: dict) -> None:
    outcome(lambda: decode_checked(byte_lm, schema, tokens=4))


# --- prompts that hold special-token text -------------------------------------------------------------------

SPECIAL = st.sampled_from(["<|endoftext|>", "<s>", "</s>", "<eos>", "<bos>", "<unk>", "<|im_start|>", "<pad>",
                           "\x00", "\ufffd"])  # (a lone surrogate: see test_a_prompt_with_a_lone_surrogate)


@pytest.mark.slow
@settings(FUZZ, max_examples=120 * SCALE)
@given(parts=st.lists(st.one_of(SPECIAL, st.text(max_size=5)), max_size=8), family=st.booleans())
def test_prompts_with_special_token_text(byte_lm: structspec.LM, sp_lm: structspec.LM, parts: list[str],
                                         family: bool) -> None:
    lm = byte_lm if family else sp_lm
    outcome(lambda: decode_checked(lm, Regex(r"[a-z]{1,4}"), prompt="".join(parts), tokens=5))


@pytest.mark.parametrize("family", ["byte", "sp"])
def test_a_prompt_with_a_lone_surrogate(byte_lm: structspec.LM, sp_lm: structspec.LM, family: str) -> None:
    lm = byte_lm if family == "byte" else sp_lm
    error = outcome(lambda: decode_checked(lm, Regex("[a-z]{1,4}"), prompt="Out:\ud800", tokens=3))
    assert isinstance(error, structspec.PromptError) and "surrogate" in str(error)


def test_an_empty_language_fails_at_compile_naming_the_keyword(byte_lm: structspec.LM) -> None:
    error = outcome(lambda: structspec.compile({"type": "string", "pattern": "^[^\\s\\S]$"}, byte_lm))
    assert isinstance(error, structspec.SchemaError) and error.keyword == "pattern" and error.pointer == "/"
    error = outcome(lambda: structspec.compile(Regex("a*[^\\s\\S]"), byte_lm))
    assert isinstance(error, structspec.RegexError) and re.search("matches no string", str(error))
