"""Structural specs (free text, tags, sequences, triggered tags) as languages, and special-token markers on
Qwen2.5's real tokenizer: a special token is spelled only by its own id, only where a spec places it."""

from __future__ import annotations

import itertools
import re

import pytest

import structspec
from structspec import MarkerError, OptionError, Sequence, Special, Tag, Text, Triggered
from structspec.schema.stops import avoiding, until

TOOL_CALL, END_CALL = 151657, 151658  # Qwen2.5's <tool_call> and </tool_call>
IM_START = 151644


def accepts(compiled: structspec.Compiled, pieces: list[str | int]) -> bool:
    """Whether ``pieces`` (text, or a token id) walk the FSM to a final state: text byte by byte, ids as tokens."""
    fsm, state = compiled.fsm, compiled.fsm.initial_state
    for piece in pieces:
        if isinstance(piece, int):
            state = fsm.next_state(state, piece)
        else:
            state = fsm.index.dfa.step(state, piece.encode())
            state = None if state == 0 else state
        if state is None:
            return False
    return fsm.is_final(state)


def check_table(lm: structspec.LM, spec: object, table: list[tuple[list[str | int] | str, bool]]) -> None:
    compiled = structspec.compile(spec, lm)
    for pieces, expected in table:
        pieces = [pieces] if isinstance(pieces, str) else pieces
        assert accepts(compiled, pieces) == expected, (spec, pieces)


@pytest.mark.parametrize("stops, avoid", [(("ab",), ()), (("aa",), ("b",)), (("aab", "b"), ()),
                                          (("abab", "ba"), ("aa",)), (("</think>",), ())])
def test_until_and_avoiding_match_their_definitions_on_every_short_text(stops, avoid) -> None:
    alphabet = sorted(set("".join(stops + avoid)))[:3] + ["x"]
    first_stop, no_word = re.compile(until(stops, avoid)), re.compile(avoiding(stops + avoid))
    for n in range(7):
        for text in map("".join, itertools.product(alphabet, repeat=n)):
            holds = any(w in text for w in stops + avoid)
            assert bool(no_word.fullmatch(text)) == (not holds), text
            end = min((text.find(w) + len(w) for w in stops if w in text), default=None)
            clean = not any(w in text for w in avoid)
            assert bool(first_stop.fullmatch(text)) == (end == len(text) and clean), text


def test_text_with_stop_strings(byte_lm) -> None:
    check_table(byte_lm, Text(stop=("</think>",)), [
        ("I think so</think>", True), ("</think>", True), ("a</thin", False), ("no stop", False),
        ("a</think>b", False), ("a</think></think>", False), ("<</think>", True), ("</thi</think>", True),
    ])
    check_table(byte_lm, Text(), [("", True), ("anything\nat all", True)])
    check_table(byte_lm, Text(avoid=("END",)), [("the en", True), ("the END", False), ("EN D", True)])


def test_text_with_a_character_budget(byte_lm) -> None:
    check_table(byte_lm, Text(stop=("</think>",), max_chars=5), [
        ("abcde</think>", True), ("abcdef</think>", False), ("</think>", True), ("a<b</think>", False),
    ])
    check_table(byte_lm, Text(max_chars=3), [("", True), ("abc", True), ("abcd", False)])


def test_tag_sequence_and_triggered_tags(byte_lm) -> None:
    tag = Tag("<a>", structspec.Regex("[0-9]+"), "</a>")
    check_table(byte_lm, tag, [("<a>12</a>", True), ("<a></a>", False), ("<a>1x</a>", False)])
    check_table(byte_lm, Sequence(Tag("<t>", Text(), "</t>"), structspec.Regex("ok|no")), [
        ("<t>hm</t>ok", True), ("<t></t>no", True), ("<t>hm</t>", False), ("ok", False),
    ])
    check_table(byte_lm, Triggered((tag,)), [
        ("plain text", True), ("x <a>1</a> y <a>22</a>", True), ("x <a>y</a>", False), ("x <a>1", False),
        ("<a>1</a>", True), ("", True),
    ])
    check_table(byte_lm, Triggered((tag,), at_least=1, text=False, separator="\n"), [
        ("<a>1</a>", True), ("<a>1</a>\n<a>2</a>", True), ("<a>1</a>\n", True), ("<a>1</a><a>2</a>", False),
        ("x<a>1</a>", False), ("", False), ("<a>1</a>\n\n", False), ("\n<a>1</a>", False),
    ])
    check_table(byte_lm, Triggered((tag,), at_least=1, at_most=1), [
        ("hi <a>1</a> bye", True), ("hi", False), ("<a>1</a><a>2</a>", False),
    ])


def test_special_markers_on_qwen_are_spelled_by_their_id_alone(qwen_lm) -> None:
    spec = Tag(Special("<tool_call>"), structspec.Regex("[a-z]+"), Special(END_CALL))
    compiled = structspec.compile(spec, qwen_lm)
    assert compiled.constraint.special_tokens == ((TOOL_CALL, "<tool_call>"), (END_CALL, "</tool_call>"))
    check_table(qwen_lm, spec, [
        ([TOOL_CALL, "abc", END_CALL], True), ([TOOL_CALL, "abc", "</tool_call>"], False),
        (["<tool_call>", "abc", END_CALL], False), ([IM_START, "abc", END_CALL], False),
    ])
    fsm = compiled.fsm
    assert list(fsm.allowed_token_ids(fsm.initial_state)) == [TOOL_CALL]  # forced: fast-forward writes it
    inside = fsm.next_state(fsm.next_state(fsm.initial_state, TOOL_CALL), qwen_lm.tokenizer.convert_tokens_to_ids("abc"))
    allowed = set(fsm.allowed_token_ids(inside).tolist())
    assert END_CALL in allowed and TOOL_CALL not in allowed and IM_START not in allowed
    assert compiled.fsm.vocab.decode([TOOL_CALL, qwen_lm.tokenizer.convert_tokens_to_ids("abc"), END_CALL]) \
        == "<tool_call>abc</tool_call>"


def test_no_special_token_inside_free_text_or_json(qwen_lm) -> None:
    spec = Triggered((Tag(Special(TOOL_CALL), {"type": "string"}, Special(END_CALL)),))
    fsm = structspec.compile(spec, qwen_lm).fsm
    text_state = fsm.index.dfa.step(fsm.initial_state, b"Let me check.")
    free = set(fsm.allowed_token_ids(text_state).tolist())
    specials = {i for i, b in enumerate(qwen_lm.vocab.token_bytes) if b is None}
    assert free & specials <= {qwen_lm.vocab.eos_token_id}
    assert TOOL_CALL in free and END_CALL not in free
    in_string = fsm.index.dfa.step(fsm.next_state(text_state, TOOL_CALL), b'"ab')
    assert not set(fsm.allowed_token_ids(in_string).tolist()) & ({TOOL_CALL, END_CALL} | specials)


def test_free_text_costs_one_cached_mask_row(byte_lm) -> None:
    """Inside free text every ordinary token leads back to the same state: one mask, computed once."""
    fsm = structspec.compile(Triggered((Tag("<a>", structspec.Regex("[0-9]"), "</a>"),)), byte_lm).fsm
    state = fsm.index.dfa.step(fsm.initial_state, b"Hello")
    for word in ["there", " world", ",", "\n"]:
        assert fsm.index.dfa.step(state, word.encode()) == state


@pytest.mark.parametrize("make, error, words", [
    (lambda: Tag(Special("<think>"), Text(), Special("</think>")), MarkerError, "no token '<think>'"),
    (lambda: Tag(Special(10**7), Text(), "x"), MarkerError, "no token id"),
    (lambda: Tag(Special(151645), Text(), "x"), MarkerError, "end token"),
    (lambda: Text(stop=()), OptionError, "names no stop"),
    (lambda: Text(stop=("",)), OptionError, "empty"),
    (lambda: Sequence(), OptionError, "no parts"),
])
def test_bad_markers_fail_at_compile_time(qwen_lm, make, error, words) -> None:
    with pytest.raises(error, match=re.escape(words)):
        structspec.compile(make(), qwen_lm)


def test_a_text_marker_the_vocabulary_cannot_spell() -> None:
    from structspec.schema.structural import Writer
    from structspec.vocab import TokenVocab

    vocab = TokenVocab((b"a", b"b", b"<", None), 3, "toy")  # spells a, b and < only
    writer = Writer(vocab, dict, structspec.schema.constraint_of, str)
    assert writer.marker("<ab") == re.escape("<ab")
    with pytest.raises(MarkerError, match="cannot spell the marker '<c>'"):
        writer.marker("<c>")
