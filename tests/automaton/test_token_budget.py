"""Token budgets (`Text.max_tokens`, `Reasoning.max_thinking_tokens`): the count is of tokens, not characters;
a spent budget allows only the rest of the end marker (a special one alone, so fast-forward writes it), the end
of the output, or the rest of a half-written character; every mode stays token-identical to plain masked."""

from __future__ import annotations

import re
from typing import Literal

import pytest
import torch
from pydantic import BaseModel

import structspec
from structspec import OptionError, Reasoning, Regex, Sequence, Special, Tag, Text, Triggered
from structspec.automaton.fsm import TokenFSM, apply_token_bitmask_inplace
from structspec.decoding.fastforward import Forcer
from structspec.integrations.matcher import Matcher

TOOL_CALL, END_CALL = 151657, 151658


class Answer(BaseModel):
    verdict: Literal["yes", "no"]


def walk(fsm: TokenFSM, pieces: list[bytes | int]) -> int | None:
    """The state after ``pieces`` (a token id, or bytes spelled by the one token that spells them), or None."""
    state: int | None = fsm.initial_state
    for piece in pieces:
        token = piece if isinstance(piece, int) else fsm.vocab.ids_by_bytes[piece]
        state = fsm.next_state(state, token)
        if state is None:
            return None
    return state


def accepts(fsm: TokenFSM, pieces: list[bytes | int]) -> bool:
    state = walk(fsm, pieces)
    return state is not None and fsm.is_final(state)


def one_byte_each(text: str) -> list[bytes]:
    return [bytes([b]) for b in text.encode()]


@pytest.mark.parametrize("pieces, expected", [
    (one_byte_each("abc</think>ok"), True),  # three thinking tokens
    (one_byte_each("abcd</think>ok"), False),  # a fourth
    ([b"on", b"er", b"in", *one_byte_each("</think>ok")], True),  # tokens, not characters: 6 characters in 3
    (one_byte_each("ab<") + one_byte_each("/think>ok"), True),  # the third token began the marker: its rest
    (one_byte_each("ab<") + one_byte_each("x</think>ok"), False),  # ... and nothing else
    (one_byte_each("</think>ok"), True),
    (one_byte_each("<think>abc</think>ok"), False),  # the begin marker is no part of this spec
])
def test_the_thinking_budget_counts_tokens(byte_lm, pieces, expected) -> None:
    fsm = structspec.compile(Reasoning(Regex("ok"), separator="", max_thinking_tokens=3), byte_lm).fsm
    assert all(p in fsm.vocab.ids_by_bytes for p in pieces if isinstance(p, bytes))
    assert accepts(fsm, pieces) == expected


def test_the_count_starts_after_the_begin_marker(byte_lm) -> None:
    fsm = structspec.compile(Reasoning(Regex("ok"), begin="<think>", separator="", max_thinking_tokens=2),
                             byte_lm).fsm
    assert accepts(fsm, [*one_byte_each("<think>ab"), *one_byte_each("</think>ok")])
    assert not accepts(fsm, one_byte_each("<think>abc</think>ok"))
    spent = walk(fsm, one_byte_each("<think>ab"))
    assert fsm.next_bytes(spent) == [ord("<")]
    assert {bytes(fsm.vocab.token_bytes[t]) for t in fsm.allowed_token_ids(spent)} <= {
        b"</think>"[:n] for n in range(1, 9)} | {b"</think>ok"}


@pytest.mark.parametrize("family, begin, straddle", [
    ("byte_lm", "<think> ", b" the"),  # this vocabulary's " the" completes the marker and thinks "the"
    pytest.param("qwen_lm", "<think>\n", b"\n\n", marks=pytest.mark.slow),  # Qwen's "\n\n": one thinking "\n"
])
def test_a_budget_of_no_tokens_holds_where_a_token_completes_the_begin_marker(family, begin, straddle,
                                                                              request) -> None:
    lm = request.getfixturevalue(family)
    fsm = structspec.compile(Reasoning(Regex("ok"), begin=begin, separator="", max_thinking_tokens=0), lm).fsm
    opened = walk(fsm, one_byte_each(begin[:-1]))
    straddling = fsm.vocab.ids_by_bytes[straddle]
    assert opened is not None and fsm.next_state(opened, straddling) is None
    assert straddling not in fsm.allowed_token_ids(opened)
    rest = begin[-1].encode()
    for token in map(bytes, map(fsm.vocab.token_bytes.__getitem__, fsm.allowed_token_ids(opened))):
        thinking = token[len(rest):]  # what a token writes past the marker: only the way to the end marker
        assert token.startswith(rest) and (b"</think>".startswith(thinking) or thinking.startswith(b"</think>"))
    assert accepts(fsm, one_byte_each(begin + "</think>ok"))  # the marker, no thinking, the end marker
    assert not accepts(fsm, one_byte_each(begin + "a</think>ok"))


def test_a_later_compile_keeps_the_states_and_masks_decoding_reached(byte_lm) -> None:
    spec = Reasoning(Regex("ok"), separator="", max_thinking_tokens=2)
    first = structspec.compile(spec, byte_lm).fsm
    spent = walk(first, one_byte_each("ab"))
    allowed = first.allowed_token_ids(spent)
    again = structspec.compile(spec, byte_lm).fsm
    assert again is not first and again.knows(spent)  # numbered already: no walk of its own needed
    assert again.allowed_token_ids(spent) is allowed  # the spent state's ids, computed once
    other = structspec.compile(Reasoning(Regex("ok"), separator="", max_thinking_tokens=13), byte_lm).fsm
    assert spent > other.initial_state and not other.knows(spent)  # another budget: states of its own


def test_a_spent_budget_without_a_stop_allows_only_the_end(byte_lm) -> None:
    fsm = structspec.compile(Text(max_tokens=2), byte_lm).fsm
    spent = walk(fsm, [b"on", b"c"])
    assert list(fsm.allowed_token_ids(spent)) == list(fsm.eos_token_ids) and fsm.is_complete(spent)
    assert fsm.allowed_token_ids(walk(fsm, [b"on"])).size > 100  # free text before


def test_a_half_written_character_is_finished_before_the_marker(byte_lm) -> None:
    fsm = structspec.compile(Text(stop=("!",), max_tokens=1), byte_lm).fsm
    spent = walk(fsm, [b"\xe2"])  # the first byte of a three-byte character
    allowed = [fsm.vocab.token_bytes[t] for t in fsm.allowed_token_ids(spent)]
    assert allowed and all(0x80 <= b < 0xC0 for token in allowed for b in token)
    finished = walk(fsm, [b"\xe2", b"\x80", b"\x94"])  # an em dash
    assert fsm.next_bytes(finished) == [ord("!")]
    assert accepts(fsm, [b"\xe2", b"\x80", b"\x94", b"!"])


def test_a_special_marker_is_forced_once_the_budget_is_spent(qwen_lm) -> None:
    spec = Sequence(Tag(Special("<tool_call>"), Text(max_tokens=2), Special("</tool_call>")), Regex("!"))
    compiled = structspec.compile(spec, qwen_lm)
    fsm = compiled.fsm
    spent = walk(fsm, [TOOL_CALL, b"hello", b" world"])
    assert list(fsm.allowed_token_ids(spent)) == [END_CALL]
    forced = Forcer(fsm, qwen_lm.tokenizer).force(spent)
    assert forced is not None and forced.token_ids[0] == END_CALL  # no model call for it
    assert fsm.allowed_token_ids(walk(fsm, [TOOL_CALL, b"hello"])).size > 1000
    assert walk(fsm, [TOOL_CALL, b"hello", b" world", b"!"]) is None


def test_budgeted_text_anywhere_but_the_opening_is_refused_before_any_model() -> None:
    with pytest.raises(OptionError, match="max_tokens must be an int >= 0"):
        Text(max_tokens=-1)
    with pytest.raises(OptionError, match="max_thinking_tokens must be an int >= 0"):
        Reasoning(Answer, max_thinking_tokens=True)
    budgeted = Text(stop=("!",), max_tokens=2)
    for build in (lambda: Sequence(Regex("x"), budgeted), lambda: Sequence(Regex("x"), Tag("<", budgeted, ">")),
                  lambda: Triggered((Tag("<a>", budgeted, "</a>"),)), lambda: Reasoning(budgeted),
                  lambda: Reasoning(Sequence(budgeted, Regex("x")))):
        with pytest.raises(OptionError, match=re.escape("Text(max_tokens=2) does not open the output")):
            build()
    with pytest.raises(OptionError, match="no stop opens a Sequence with more parts"):
        Sequence(Text(max_tokens=2), Regex("x"))
    Sequence(Tag("<a>", Text(max_tokens=2), "</a>"), Regex("x"))  # a Tag's content that opens the output: fine


PROMPTS = ['Reply {"verdict":"yes"} after thinking.', "Is 7 prime? Think first.", "Think, then answer no."]


@pytest.mark.parametrize("family", ["byte_lm", "qwen_lm"])
@pytest.mark.parametrize("mode", [dict(fast_forward="exact", draft=None), dict(fast_forward="exact"),
                                  dict(draft="lookahead")])
def test_accelerated_and_batched_modes_are_token_identical(family, mode, request) -> None:
    lm = request.getfixturevalue(family)
    spec = Reasoning(Answer, begin="<think>", max_thinking_tokens=6)
    plain = [structspec.generate_result(lm, spec, p, fast_forward="off", draft=None, max_new_tokens=60)
             for p in PROMPTS]
    fast = [structspec.generate_result(lm, spec, p, max_new_tokens=60, **mode) for p in PROMPTS]
    batch = structspec.generate_batch(lm, spec, PROMPTS, max_new_tokens=60, batch_size=3, **mode)
    counts = []
    for p, f, b in zip(plain, fast, batch, strict=True):
        assert p.complete, p.text
        assert f.token_ids == p.token_ids == b.token_ids
        # the tokens that end after "<think>" and start before "</think>": the budget, and at most the rest of a
        # character its last token half wrote
        bounds = [len(lm.vocab.spell(p.token_ids[:i])) for i in range(len(p.token_ids) + 1)]
        marker = len("<think>") + len(p.thinking.encode())
        assert p.text.encode()[:marker] == b"<think>" + p.thinking.encode()
        assert p.text.encode()[marker:].startswith(b"</think>")
        counts.append(sum(end > len("<think>") and start < marker for start, end in zip(bounds, bounds[1:])))
    assert max(counts) <= 6 + 3 and max(counts) >= 6, counts  # the budget bound, and bound somewhere


def test_the_matcher_and_the_logits_processor_keep_the_budget(byte_lm) -> None:
    spec = Reasoning(Regex("ok"), separator="", max_thinking_tokens=2)
    matcher = Matcher(spec, byte_lm)
    assert matcher.accept_tokens([byte_lm.vocab.ids_by_bytes[b] for b in (b"a", b"b")])
    assert not matcher.accept_tokens([byte_lm.vocab.ids_by_bytes[b"c"]])
    bitmask = matcher.fsm.allocate_token_bitmask(1)
    matcher.fill_next_token_bitmask(bitmask)
    logits = torch.zeros(1, matcher.fsm.logits_width)
    apply_token_bitmask_inplace(logits, bitmask)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed and all(b"</think>ok".startswith(byte_lm.vocab.token_bytes[t]) or
                           byte_lm.vocab.token_bytes[t].startswith(b"</think>") for t in allowed)


def test_a_thinking_budget_before_tool_calls(qwen_lm) -> None:
    def get_weather(city: str) -> str:
        """The weather in a city now."""

    spec = Reasoning(structspec.ToolCalls([get_weather], choice="required"), begin="<think>",
                     max_thinking_tokens=4)
    plain = structspec.generate_result(qwen_lm, spec, "Weather in Paris?", fast_forward="off", draft=None,
                                       max_new_tokens=80)
    assert plain.complete and [c.name for c in plain.value.calls] == ["get_weather"]
    thought = qwen_lm.tokenizer.encode(plain.thinking, add_special_tokens=False)
    assert len(thought) <= 4 + 3  # re-encoded: the budget, and a character's rest at most
    for mode in (dict(), dict(draft="lookahead")):
        assert structspec.generate_result(qwen_lm, spec, "Weather in Paris?", max_new_tokens=80,
                                          **mode).token_ids == plain.token_ids
    (batched, _) = structspec.generate_batch(qwen_lm, [spec, structspec.ToolCalls([get_weather])],
                                             ["Weather in Paris?", "Hi"], max_new_tokens=80)
    assert batched.token_ids == plain.token_ids


def test_one_bitmask_filled_state_after_state_gets_the_budgeted_masks(byte_lm) -> None:
    # (a bitmask filled before is written without its checks: by the budgeted FSM's own masks, not its regex's)
    fsm = structspec.compile(Reasoning(Regex("ok"), separator="", max_thinking_tokens=2), byte_lm).fsm
    bitmask, state = fsm.allocate_token_bitmask(1), fsm.initial_state
    for piece in one_byte_each("ab</think>o"):
        for _ in range(2):  # the state's mask computed, then read again
            fsm.fill_next_token_bitmask(bitmask, 0, state)
            assert torch.equal(bitmask[0], torch.from_numpy(fsm.packed_mask(state).copy()))
        state = fsm.next_state(state, fsm.vocab.ids_by_bytes[piece])
        assert state is not None
