"""A proposer's drafts for one engine step, cut together by what the step's tokens cost (`cut_to_cost`)."""

from __future__ import annotations

import pytest

import structspec
from structspec.decoding import CPU_COST, FLAT_COST, FORCED, Cursor, DraftLength, Forcer, PassCost, PromptLookup
from structspec.integrations.proposal import RequestDraft, cut_to_cost
from structspec.testing.models import FakeLM
from tests.decoding.test_cursor import OUTPUT, PROMPT, SCHEMA


def drafted(n: int, cost: PassCost) -> list[RequestDraft]:
    """``n`` requests one token into `OUTPUT`, each drafted up to 8 tokens: forced text, then prompt lookup."""
    lm = FakeLM()
    fsm = structspec.compile(SCHEMA, lm).fsm
    prompt, sequence = lm.encode_prompt(PROMPT), lm.tokenizer.encode(OUTPUT, add_special_tokens=False)
    requests = [RequestDraft(Cursor(fsm, Forcer(fsm, lm.tokenizer)), DraftLength(cost)) for _ in range(n)]
    for r in requests:
        r.propose(sequence[:1], sequence[:1], prompt + sequence[:1], 8, PromptLookup())
        assert r.draft.sources[0] == FORCED and r.draft.sources[-1] != FORCED  # both kinds to cut between
    return requests


def test_on_a_cpu_a_batch_keeps_the_forced_text_and_cuts_lookup_that_no_longer_pays() -> None:
    alone = drafted(1, CPU_COST)
    [one] = cut_to_cost(alone, CPU_COST)
    assert any(s != FORCED for s in alone[0].draft.sources)  # alone, a lookup token at 2/3 pays for its 0.1
    batch = drafted(32, CPU_COST)
    forced = batch[0].draft.sources.count(FORCED)
    cut = cut_to_cost(batch, CPU_COST)
    # at 32 rows a step already costs 4.1 one-token passes: a token kept 2/3 of the time lowers its yield
    assert all(tokens == cut[0] and len(tokens) == forced for tokens in cut)
    assert all(r.draft.sources == [FORCED] * forced for r in batch)  # the request keeps the cut (it learns from it)
    assert len(one) > forced


@pytest.mark.parametrize("rows", [1, 32])
def test_on_a_flat_cost_every_draft_goes_whole(rows: int) -> None:
    requests = drafted(rows, FLAT_COST)
    whole = [list(r.draft.tokens) for r in requests]
    assert cut_to_cost(requests, FLAT_COST) == whole


def test_a_request_without_a_grammar_keeps_its_lookup_draft_on_a_flat_cost() -> None:
    lm = FakeLM()
    ids = lm.tokenizer.encode("abc abc abc abc", add_special_tokens=False)
    free = RequestDraft(None)
    guess = free.propose(ids, ids[-1:], ids, 3, PromptLookup()).tokens
    assert guess and cut_to_cost([free], FLAT_COST) == [guess]
