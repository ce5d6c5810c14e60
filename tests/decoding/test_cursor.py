"""One cursor, driven by every adapter: the own loop's row, `Matcher`, the transformers processor and the
proposer's per-request state see the same states, masks, forced text and drafts for one token sequence."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import structspec
from structspec.automaton import TokenFSM
from structspec.decoding import CPU_COST, ENDED, FORCED, Cursor, DraftLength, Forcer, PromptLookup
from structspec.decoding.cost import FLAT_COST
from structspec.decoding.row import Decoded, DecodeOptions, RowDecode, RowInput
from structspec.errors import OptionError
from structspec.integrations.matcher import Matcher
from structspec.integrations.proposal import RequestDraft
from structspec.integrations.transformers import LogitsProcessor
from structspec.testing.models import FakeLM

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "city": {"enum": ["Paris", "Berlin", "Madrid"]},
                   "zip": {"type": "string"}},
    "required": ["name", "city", "zip"],
}
PROMPT = "Ada Lovelace lives in Paris, zip 75001. Extract name, city and zip as JSON."
OUTPUT = '{"name":"Ada Lovelace","city":"Paris","zip":"75001"}'


@dataclass(frozen=True)
class Turn:
    """What the row offered one target pass: after ``at`` output tokens, in ``state``, this candidate."""

    at: int
    state: int
    tokens: list[int]
    sources: list[str]


def split_once(lm: FakeLM, text: str) -> list[int]:
    """``text``'s tokens with its first ``":"`` written ``":`` + ``"``, as a model that prefers the split would:
    forced text the target rejects once, so the row and the proposer learn the split."""
    ids = lm.tokenizer.encode(text, add_special_tokens=False)
    whole, head, quote = (lm.vocab.ids_by_bytes.get(b) for b in (b'":"', b'":', b'"'))
    assert None not in (whole, head, quote), "the byte-level test tokenizer has these tokens"
    at = ids.index(whole)
    return ids[:at] + [head, quote] + ids[at + 1 :]


def drive_row(lm: FakeLM, fsm: TokenFSM, prompt: list[int], sequence: list[int]) -> list[Turn]:
    """The own loop's row deciding ``sequence`` (then EOS) under prompt lookup, the target choosing the sequence's
    next token at every position: each turn's candidate and where it starts."""
    row = RowDecode.start(RowInput(0, fsm, prompt, PromptLookup(), None), DecodeOptions(max_new_tokens=200), lm,
                          FLAT_COST)
    turns = []
    while not isinstance(window := row.prepare(), Decoded):
        at, cand = len(row.out), window.candidate
        turns.append(Turn(at, window.state, list(cand.tokens), list(cand.sources)))
        logits = torch.zeros(len(window.states), lm.logits_width)
        for j in range(len(window.states)):  # on the sequence while the candidate is: its next token wins
            if cand.tokens[:j] == sequence[at : at + j]:
                logits[j, sequence[at + j] if at + j < len(sequence) else fsm.eos_token_id] = 1.0
        row.commit(window, logits)
    assert row.out == sequence
    return turns


def test_every_adapter_sees_the_same_states_masks_forced_text_and_drafts() -> None:
    lm = FakeLM()
    fsm = structspec.compile(SCHEMA, lm).fsm
    prompt, sequence = lm.encode_prompt(PROMPT), split_once(lm, OUTPUT)
    turns = drive_row(lm, fsm, prompt, sequence)
    proposer = RequestDraft(Cursor(fsm, Forcer(fsm, lm.tokenizer)))
    matcher, processor = Matcher(fsm), LogitsProcessor(fsm, lm.tokenizer)
    by_start = {t.at: t for t in turns}
    done = 0
    for at in range(len(sequence) + 1):
        ids = torch.tensor([prompt + sequence[:at]])
        masked = processor(ids, torch.zeros(1, lm.logits_width))
        assert matcher.accept_tokens(sequence[matcher.accepted : at])
        bitmask = fsm.allocate_token_bitmask(2)
        matcher.fill_next_token_bitmask(bitmask, 0)
        fsm.fill_next_token_bitmask(bitmask, 1, matcher.state)
        assert torch.equal(bitmask[0], bitmask[1])
        allowed = {i for i in range(lm.logits_width) if bitmask[0, i // 32] >> (i % 32) & 1}
        assert set(masked[0].isfinite().nonzero().flatten().tolist()) == allowed
        assert processor.states(ids) == [matcher.state]
        if at not in by_start:
            continue
        turn = by_start[at]
        draft = proposer.propose(sequence[:at], sequence[done:at], prompt + sequence[:at], len(turn.tokens),
                                 PromptLookup())
        assert proposer.cursor is not None and proposer.cursor.state == matcher.state == turn.state
        assert (draft.tokens, draft.sources) == (turn.tokens, turn.sources)
        assert matcher.forced_text() == proposer.cursor.forced_text()
        spelled, _ = proposer.cursor.forced_spelling()
        if turn.sources[:1] == [FORCED]:  # the candidate opens with the forced text, spelled alike
            k = min(len(spelled), len(turn.tokens))
            assert k and turn.tokens[:k] == spelled[:k]
        done = at
    assert len(turns) < len(sequence) / 2  # forced text and lookup held: fewer passes than tokens
    assert any(s != FORCED for t in turns for s in t.sources) and any(FORCED in t.sources for t in turns)
    head = lm.vocab.ids_by_bytes[b'":']  # the split the target preferred once, learned by both, then forgotten
    assert any(token == head and source == FORCED for t in turns for token, source in zip(t.tokens, t.sources))


def test_a_cursor_rolls_back_by_indexing_and_ends_at_eos() -> None:
    lm = FakeLM()
    fsm = structspec.compile(SCHEMA, lm).fsm
    ids = lm.tokenizer.encode(OUTPUT, add_special_tokens=False)
    cursor = Cursor(fsm)
    assert cursor.validate(ids + [fsm.eos_token_id, 5]) == len(ids) + 1  # EOS ends it; nothing after
    assert not cursor.accept(ids + [ids[0]]) and cursor.accepted == 0  # all or nothing
    assert cursor.accept(ids) and cursor.is_complete() and not cursor.is_terminated()
    states = list(cursor.states)
    cursor.rollback(3)
    assert cursor.states == states[:-3] and not cursor.is_complete()
    assert cursor.accept(ids[-3:] + [fsm.eos_token_id]) and cursor.is_terminated() and cursor.state == ENDED
    assert cursor.forced_text() == "" and cursor.draft(PromptLookup(), ids, 4).tokens == []
    with pytest.raises(OptionError, match="cannot roll back"):
        cursor.rollback(len(ids) + 2)
    cursor.reset()
    assert cursor.states == [fsm.initial_state]


def test_a_proposer_drafts_only_the_lookup_that_pays_on_its_pass_cost() -> None:
    lm = FakeLM()
    fsm = structspec.compile(SCHEMA, lm).fsm
    prompt, sequence = lm.encode_prompt(PROMPT), lm.tokenizer.encode(OUTPUT, add_special_tokens=False)
    at = sequence.index(lm.vocab.ids_by_bytes[b'":"']) + 1  # inside the name's value: lookup copies "Ada ..."
    free = RequestDraft(Cursor(fsm, Forcer(fsm, lm.tokenizer)))
    assert free.propose(sequence[:at], sequence[:at], prompt + sequence[:at], 8, PromptLookup()).sources[0] != FORCED
    rejected = DraftLength(CPU_COST)
    for _ in range(20):  # every drafted token so far was rejected: on a CPU a fed token costs 0.1 of a pass
        rejected.record(4, 0)
    costly = RequestDraft(Cursor(fsm, Forcer(fsm, lm.tokenizer)), rejected)
    assert costly.propose(sequence[:at], sequence[:at], prompt + sequence[:at], 8, PromptLookup()).tokens == []
