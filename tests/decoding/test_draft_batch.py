"""The batch's packed draft cache (`DraftBatch`) serves every draft model kind a row of it can hold: rows attached to
it draft, through `DraftRequest`s answered by shared draft passes, exactly what each drafts over a cache of its own.
The batch driver's round is played here by hand (ask every row, run the batch's pass, ask again)."""

from __future__ import annotations

import structspec
from structspec import Regex
from structspec.decoding.candidate import DraftRequest
from structspec.decoding.drafter import Turn
from structspec.decoding.drafters.cross_tokenizer import CrossTokenizerDrafter
from structspec.decoding.drafters.draft_batch import DraftBatch
from structspec.decoding.drafters.lookup import PromptLookup
from structspec.decoding.sampling import SamplingConfig
from structspec.testing import FakeLM, sentencepiece_tokenizer

PROMPTS = ["Alice lives in Paris and Alice likes tea. Alice", "Bob, London", "the cat sat on the mat; the cat"]


def drafts(drafters: list[CrossTokenizerDrafter], batch: DraftBatch | None, target: FakeLM) -> list[list[int]]:
    """Each drafter's chain after its prompt, asked token by token as the decode loop asks; with ``batch``, every
    round's requests answered by one `DraftBatch.run`. Changes the drafters and the batch."""
    fsm = structspec.compile(Regex(r"[\s\S]{1,200}"), target).fsm
    contexts = [target.encode_prompt(p) for p in PROMPTS]
    turns = [Turn(fsm, None, SamplingConfig(), None, c, fsm.initial_state, 16, 5) for c in contexts]  # chunks of 5
    out: list[list[int]] = [[] for _ in drafters]
    todo = list(range(len(drafters)))
    while todo:
        retry = []
        for i in todo:
            step = drafters[i].next(turns[i], contexts[i] + out[i], fsm.initial_state)
            if step is not None:
                if not isinstance(step, DraftRequest):
                    out[i].append(step.token)
                retry.append(i)
        if batch is not None and batch.wanted:
            batch.run()
        todo = retry
    return out


def test_cross_tokenizer_rows_draft_from_shared_draft_passes_what_they_draft_alone() -> None:
    target = FakeLM()
    for lookup in (None, PromptLookup()):  # one pass per token, or a guess checked in the first pass
        def drafter(lm: FakeLM) -> CrossTokenizerDrafter:
            return CrossTokenizerDrafter(lm, target.tokenizer, target.vocab, lookup=lookup)

        alone_lm = FakeLM(seed=3, tokenizer=sentencepiece_tokenizer())
        alone = [drafter(alone_lm) for _ in PROMPTS]
        expected = drafts(alone, None, target)
        # (a made-up draft's text is often not UTF-8 and translates to nothing; some rows' is)
        assert any(expected) and alone_lm.passes == sum(d.passes for d in alone)
        shared_lm = FakeLM(seed=3, tokenizer=sentencepiece_tokenizer())
        batch = DraftBatch(shared_lm, len(PROMPTS))
        rows = [drafter(shared_lm) for _ in PROMPTS]
        for i, row in enumerate(rows):
            batch.reset(i)
            row.attach(batch.row(i))
        assert drafts(rows, batch, target) == expected
        assert [row.passes for row in rows] == [d.passes for d in alone]  # each row counts the passes it asked for
        assert shared_lm.passes < sum(row.passes for row in rows)  # rows asked together: shared passes
