"""Staged speculation: a draft model whose own drafts come from prompt lookup, checked in one draft pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from structspec.decoding.candidate import DraftRequest, Step, enterable
from structspec.decoding.drafters.draft_model import ModelDrafter, masked
from structspec.decoding.drafter import Turn
from structspec.decoding.drafters.lookup import PromptLookup


@dataclass(eq=False)
class StagedDrafter(ModelDrafter):
    """Staged speculation (Spector & Ré 2023, "Accelerating LLM Inference with Staged Speculative Decoding"):
    a draft LM with the target's tokenizer whose own drafts come from prompt lookup.

    Where it needs tokens after a context, ``lookup`` guesses how it goes on
    (up to its ``max_tokens``, each allowed by the FSM) and ONE draft pass over
    the new context tail plus the guess gives the draft's logits at every
    guessed position. The guess's longest prefix that equals the draft's own
    masked greedy choice is drafted, then the draft's own token after it:
    several tokens for one pass. With no guess that is one pass per token, as
    `ModelDrafter` takes. The tokens drafted after a context are kept, so the
    next calls along them cost no pass; the candidate stops where `ModelDrafter`'s
    does (the row's draft length, or a token it is unsure of). The rejected guess tail leaves the draft
    cache at the next pass (`CachedContext` keeps the common prefix). In a
    batch it draws from a row of the batch's draft cache as `ModelDrafter`
    does (`structspec.decoding.drafters.draft_batch`): the guess rides in the
    draft pass every asking row shares.

    Drafts are greedy, sampled rows included: point masses (``q`` None), which
    verification accepts iff the target's own draw equals the draft, so a
    sampled row draws exactly what plain sampling draws with the same seed
    (`structspec.decoding.verify`).
    """

    name: str = "staged_draft_model"
    lookup: PromptLookup = field(default_factory=PromptLookup)
    _run: list[int] = field(default_factory=list)  # a context, then the tokens drafted after it
    _run_probs: list[float] = field(default_factory=list)  # the draft's probability of each drafted token

    def next(self, turn: Turn, context: list[int], state: int) -> Step | DraftRequest | None:
        if self.confidence is not None and not self.confidence.keep_going(self._probs):
            return None
        start = len(self._run) - len(self._run_probs)
        if not (start <= len(context) < len(self._run) and self._run[: len(context)] == context):
            if (request := self._draft_run(turn, context, state)) is not None:
                return request
            start = len(context)
            if start == len(self._run):  # the FSM allows nothing but EOS
                return None
        self._probs.append(self._run_probs[len(context) - start])
        return Step(self._run[len(context)], self.name)

    def _draft_run(self, turn: Turn, context: list[int], state: int) -> DraftRequest | None:
        """Draft the tokens after ``context`` (in ``state``) that one draft pass verifies: the guess's prefix the
        draft agrees with, then the draft's own token (one pass; changes the run and the draft cache). In a batch
        whose draft pass has not run yet: that pass's `DraftRequest`, nothing drafted."""
        fsm = turn.fsm
        guess = self.lookup.guess(context, self.lookup.max_tokens, fsm.next_state, state)
        walked = fsm.walk(state, guess)
        keep = enterable(fsm, walked)  # (the mask of a state the vocabulary cannot leave would raise)
        guess, states = guess[:keep], [state] + walked[:keep]
        logits = self._context.logits_along(context + guess, len(context))
        if isinstance(logits, DraftRequest):
            return logits
        logits = masked(logits, fsm, states)
        tokens: list[int] = []
        probs: list[float] = []
        for row, proposed in zip(logits, guess + [None]):
            if torch.isinf(row).all():
                break
            token = int(row.argmax())
            tokens.append(token)
            probs.append(float(row.softmax(-1)[token]))
            if token != proposed:
                break
        self._run, self._run_probs = context + tokens, probs
        return None
