"""Staged speculation: a draft model's own drafts come from prompt lookup, checked by the draft in one pass.

Lossless against plain masked decoding (greedy and seeded sampling), single-row and batched, same tokenizer
(a draft model, self-draft) and through text; and on a document the draft copies from, fewer draft passes
than drafted tokens, counted exactly.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
import torch
from pydantic import BaseModel, Field

import structspec
from structspec import Regex
from structspec.decoding.cost import DraftLength
from structspec.decoding.drafters.cross_tokenizer import CrossTokenizerDrafter
from structspec.decoding.drafters.draft_model import ModelDrafter
from structspec.decoding.drafters.factory import DRAFT_NAMES, Staged, make_drafter
from structspec.decoding.drafters.lookup import PromptLookup
from structspec.decoding.drafters.staged import StagedDrafter
from structspec.testing import restricted, tiny_lm

from tests.conftest import DEVICE


class Order(BaseModel):
    customer: Annotated[str, Field(pattern=r"[A-Z][a-z]{1,8}")]
    city: Literal["Paris", "London", "Tokyo", "Berlin"]
    items: Annotated[int, Field(json_schema_extra={"maxDigits": 2})]
    paid: bool


CASES = [
    (Order, "Alice from Paris ordered 12 items, paid: true. Alice lives in Paris."),
    (Regex(r"(red|green|blue) (small|large) [a-z]{2,6}"), "a green small box, a green small cup"),
    ({"type": "array", "items": {"enum": ["Oslo", "Lima"]}, "maxItems": 3}, "Oslo, Lima, Oslo"),
    (Regex(r"[a-z ]{3,30}"), "the quick brown fox jumps over the quick brown dog"),
]
KINDS = {"byte_lm": "byte_level", "sp_lm": "sentencepiece"}
OTHER = {"byte_lm": "sp_lm", "sp_lm": "byte_lm"}


def _draft(which: str, kind: str, request: pytest.FixtureRequest) -> Any:
    """``draft=`` for the staged variant ``which`` on the ``kind`` target."""
    if which == "self":
        return Staged()
    if which == "draft_model":  # another random model with the target's tokenizer: many rejections
        return Staged(tiny_lm(KINDS[kind], seed=7, device=DEVICE))
    return Staged(request.getfixturevalue(OTHER[kind]))  # another tokenizer: through text


def _plain(lm: structspec.LM) -> list[list[int]]:
    return [structspec.generate_result(lm, spec, prompt, max_new_tokens=40, fast_forward="off", draft=None).token_ids
            for spec, prompt in CASES]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["self", "draft_model", "other_tokenizer"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_greedy_staged_drafting_equals_plain_masked_decoding(kind: str, which: str, request) -> None:
    lm = request.getfixturevalue(kind)
    draft = _draft(which, kind, request)
    plain = _plain(lm)
    name = "staged_self_draft" if which == "self" else "staged_draft_model"
    single = [structspec.generate_result(lm, spec, prompt, max_new_tokens=40, draft=draft)
              for spec, prompt in CASES]
    assert [r.token_ids for r in single] == plain
    assert sum(r.stats.drafts[name].draft_passes for r in single if name in r.stats.drafts) > 0  # it drafted
    batch = structspec.generate_batch(lm, [s for s, _ in CASES], [p for _, p in CASES], batch_size=3,
                                      max_new_tokens=40, draft=draft)
    assert [r.token_ids for r in batch] == plain


@pytest.mark.slow
@pytest.mark.parametrize("which", ["self", "draft_model", "other_tokenizer"])
def test_sampled_staged_drafting_draws_the_same_sample_as_plain_sampling(which: str, byte_lm, request) -> None:
    """Staged drafts are greedy point masses: verification draws y ~ p as plain sampling does, so a seed gives
    the same output, alone and in a batch (row i seeded with seed + i)."""
    draft = _draft(which, "byte_lm", request)
    for seed in (1, 2):
        plain = [structspec.generate_result(byte_lm, spec, prompt, max_new_tokens=40, fast_forward="off",
                                            draft=None, temperature=1.3, seed=seed + i).token_ids
                 for i, (spec, prompt) in enumerate(CASES)]
        single = [structspec.generate_result(byte_lm, spec, prompt, max_new_tokens=40, draft=draft,
                                             temperature=1.3, seed=seed + i)
                  for i, (spec, prompt) in enumerate(CASES)]
        assert [r.token_ids for r in single] == plain
        assert sum(d.drafted for r in single for name, d in r.stats.drafts.items() if name.startswith("staged")) > 0
        batch = structspec.generate_batch(byte_lm, [s for s, _ in CASES], [p for _, p in CASES], batch_size=3,
                                          max_new_tokens=40, draft=draft, temperature=1.3, seed=seed)
        assert [r.token_ids for r in batch] == plain


class _Tokens(list):
    """`_CopyingLM`'s cache: the tokens fed, cropped as a KV cache is."""

    def crop_slots(self, length: int) -> None:
        del self[length:]


class _CopyingLM:
    """An LM that copies from its context, like an induction head: where the text's last few bytes occurred
    before, it prefers the longest token that spells what followed them there. Its cache is the list of
    tokens fed; it counts its forward passes (``passes``); everything else is ``lm``'s (tokenizer, vocab)."""

    def __init__(self, lm: structspec.LM) -> None:
        self.lm, self.passes = lm, 0

    def new_cache(self) -> _Tokens:
        return _Tokens()

    def forward(self, token_ids: list[int], cache: list[int], logits_to_keep: int = 1, allowed=None) -> torch.Tensor:
        self.passes += 1
        cache += token_ids
        rows = torch.zeros(logits_to_keep, self.lm.logits_width)
        for row, end in enumerate(range(len(cache) - logits_to_keep + 1, len(cache) + 1)):
            text = self.lm.vocab.spell(cache[:end])
            for n in range(8, 1, -1):  # the longest tail of the text seen before
                if (at := text.find(text[-n:], 0, len(text) - 1)) >= 0:
                    copied = text[at + n : at + n + 16]
                    for t, spelled in enumerate(self.lm.vocab.token_bytes):
                        if spelled and copied.startswith(spelled):
                            rows[row, t] = float(len(spelled))
                    break
        return restricted(rows, allowed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lm, name)


DOCUMENT = 'The record is {"name": "Alice Smith", "city": "Paris", "note": "paid in full"}. Again: '
RECORD = Regex(r'\{"name": "[A-Za-z ]{1,20}", "city": "[A-Za-z]{1,10}", "note": "[a-z ]{1,20}"\}')


@pytest.mark.parametrize("mode", ["off", "exact"])
def test_staged_drafting_spends_fewer_draft_passes_than_it_drafts_on_a_copied_document(byte_lm, mode,
                                                                                      free_drafts) -> None:
    target = _CopyingLM(byte_lm)  # target and draft copy the document: drafts are accepted

    def run(drafter):
        return structspec.generate_result(target, RECORD, DOCUMENT, max_new_tokens=60, fast_forward=mode,
                                          draft=drafter)

    plain = structspec.generate_result(target, RECORD, DOCUMENT, max_new_tokens=60, fast_forward="off", draft=None)
    staged_lm, unstaged_lm = _CopyingLM(byte_lm), _CopyingLM(byte_lm)
    staged = run(StagedDrafter(staged_lm))
    unstaged = run(ModelDrafter(unstaged_lm))
    assert staged.token_ids == unstaged.token_ids == plain.token_ids
    assert byte_lm.vocab.decode(plain.token_ids).startswith('{"name": "Alice Smith"')  # the copy
    s, u = staged.stats.drafts["staged_draft_model"], unstaged.stats.drafts["draft_model"]
    assert s.draft_passes == staged_lm.passes and u.draft_passes == unstaged_lm.passes  # exact counts
    # the same greedy draft tokens, so the same candidates and verdicts; staged found them in fewer passes
    assert (s.drafted, s.accepted) == (u.drafted, u.accepted) and s.accepted > 0
    assert staged.stats.target_forward_passes == unstaged.stats.target_forward_passes
    assert s.draft_passes < s.drafted
    assert s.draft_passes < u.draft_passes


def test_staged_cross_tokenizer_drafting_spends_fewer_draft_passes_on_a_copied_document(byte_lm, sp_lm, free_drafts,
                                                                                        monkeypatch) -> None:
    # chunks of 5 tokens, which one guess covers (free drafts on a flat curve would ask for the whole budget)
    monkeypatch.setattr(DraftLength, "choose", lambda self, fed, cap: min(cap, 5))
    target = _CopyingLM(byte_lm)

    def run(staged: bool) -> tuple[structspec.Result, int]:
        draft = _CopyingLM(sp_lm)  # another tokenizer: the chunk is copied in its own ids and translated
        drafter = CrossTokenizerDrafter(draft, byte_lm.tokenizer, byte_lm.vocab,
                                        lookup=PromptLookup() if staged else None)
        r = structspec.generate_result(target, RECORD, DOCUMENT, max_new_tokens=60, fast_forward="off",
                                       draft=drafter)
        return r, draft.passes

    plain = structspec.generate_result(target, RECORD, DOCUMENT, max_new_tokens=60, fast_forward="off", draft=None)
    (staged, staged_passes), (unstaged, unstaged_passes) = run(True), run(False)
    assert staged.token_ids == unstaged.token_ids == plain.token_ids
    s, u = staged.stats.drafts["draft_model"], unstaged.stats.drafts["draft_model"]
    assert s.draft_passes == staged_passes and u.draft_passes == unstaged_passes
    assert (s.drafted, s.accepted) == (u.drafted, u.accepted) and s.accepted > 0  # the same greedy text
    assert s.draft_passes < u.draft_passes


def test_names_resolve(byte_lm, sp_lm) -> None:
    assert not {"staged", "tree"} & set(DRAFT_NAMES)  # classes the user constructs
    staged = make_drafter(Staged(), byte_lm)
    assert isinstance(staged, StagedDrafter) and staged.lm is byte_lm.early_exit()
    assert isinstance(make_drafter(Staged(byte_lm), byte_lm), StagedDrafter)
    cross = make_drafter(Staged(sp_lm), byte_lm)
    assert isinstance(cross, CrossTokenizerDrafter) and cross.lookup is not None
    assert make_drafter(sp_lm, byte_lm).lookup is None
