"""Cheaper verify rows: the LM head runs only on the allowed ids of a state that allows few, not at all on a
state that allows one, and decoding is the same as with full, masked rows."""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel
from typing import Literal

import structspec
from structspec.decoding import masks
from structspec.decoding.masks import restrict
from tests.numerics import assert_logits_close, logprobs_approx


class Order(BaseModel):
    item: Literal["apple", "pear", "plum"]
    count: int
    note: str


PROMPT = 'Order: {"item": "pear", "count": 12, "note": "ripe pear"}. Again: '


def test_head_computes_allowed_ids_only_and_nothing_for_a_single_id(byte_lm: structspec.LM) -> None:
    hidden = torch.randn(3, byte_lm.model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    hidden = hidden.to(byte_lm.device)
    few = torch.tensor([5, 17, 40])
    full = byte_lm.head(hidden)
    logits = byte_lm.head(hidden, [None, few, torch.tensor([9])])
    assert_logits_close(logits[0], full[0])  # one row's product against three rows': rounding only
    assert_logits_close(logits[1, few], full[1, few])
    assert logits[1].isfinite().sum() == 3
    assert logits[2, 9] == 0 and logits[2].isfinite().sum() == 1


def test_restrict_keeps_full_rows_where_most_tokens_are_allowed(byte_lm: structspec.LM) -> None:
    fsm = structspec.compile(structspec.Regex(r'[0-9]{2}x|"[a-z ]{1,30}"'), byte_lm).fsm
    start = fsm.initial_state
    digit = fsm.next_state(start, byte_lm.tokenizer.convert_tokens_to_ids("1"))
    after_two = fsm.next_state(digit, byte_lm.tokenizer.convert_tokens_to_ids("2"))
    allowed = restrict([(fsm, start), (fsm, digit), (fsm, after_two)], byte_lm.logits_width)
    assert allowed[1] is not None and set(allowed[1].tolist()) == set(fsm.allowed_token_ids(digit).tolist())
    assert allowed[2] is not None and len(allowed[2]) == len(fsm.allowed_token_ids(after_two))
    wide = structspec.compile(structspec.Regex(r"[^\n]{1,40}"), byte_lm).fsm
    assert restrict([(wide, wide.initial_state)], byte_lm.logits_width) == [None]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm", "qwen_lm"])
@pytest.mark.parametrize("draft", [None, "prompt_lookup", structspec.SelfDraft(), structspec.SelfDraft(threshold=True)],
                         ids=str)
def test_restricted_rows_decode_as_full_masked_rows(kind: str, draft: object, request,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lm = request.getfixturevalue(kind)
    few = masks.FEW * lm.logits_width
    options = {"draft": draft, "max_new_tokens": 60, "output_logprobs": True}
    restricted = structspec.generate_result(lm, Order, PROMPT, **options)
    batched = structspec.generate_batch(lm, Order, [PROMPT, PROMPT + " "], batch_size=2, draft=draft,
                                        max_new_tokens=60)
    monkeypatch.setattr(masks, "FEW", 0.0)  # every row full: the whole LM head, then the bitmask
    full = structspec.generate_result(lm, Order, PROMPT, **options)
    full_batched = structspec.generate_batch(lm, Order, [PROMPT, PROMPT + " "], batch_size=2, draft=draft,
                                             max_new_tokens=60)
    assert restricted.token_ids == full.token_ids
    assert restricted.stats.target_forward_passes == full.stats.target_forward_passes
    assert restricted.logprobs == logprobs_approx(full.logprobs, lm.dtype)
    assert [r.token_ids for r in batched] == [r.token_ids for r in full_batched]
    # the output went through restricted rows (enum, digits, punctuation after a value); on the byte-level
    # vocabulary through full ones too (the note's text)
    fsm = structspec.compile(Order, lm).fsm
    sizes, state = [], fsm.initial_state
    for token in full.token_ids:
        sizes.append(len(fsm.allowed_token_ids(state)))
        state = fsm.next_state(state, token)
    assert min(sizes) < few
    assert kind == "sp_lm" or max(sizes) >= few  # the toy SentencePiece vocabulary is too small for many
