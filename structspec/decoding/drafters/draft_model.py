"""A draft LM with the target's tokenizer, drafting under the FSM mask, and where its logits come from.

`ModelDrafter` drafts one token per draft pass, as many as the row's draft length
allows (`structspec.decoding.cost.DraftLength`, which counts what its passes
cost: `DraftModel.draft_pass_cost`), stopping early only after a token it is
unsure of (`Confidence`). Self-draft is a `ModelDrafter` over
`LM.early_exit` (the target's first layers plus its final norm and LM head), a
draft model for any target. Its logits come from a KV cache of its own
(`CachedContext`) or, in a batch, from a row of a cache shared by every row
(`structspec.decoding.drafters.draft_batch`), which may answer with a `DraftRequest`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.candidate import DraftRequest, Step
from structspec.decoding.drafter import Turn
from structspec.decoding.cost import draft_pass_cost
from structspec.decoding.drafters.policy import Confidence
from structspec.decoding.sampling import probabilities, sample
from structspec.models.protocol import KVCache, LanguageModel


class DraftContext(Protocol):
    """Where a model drafter gets next-token logits: its own KV cache, or a row of a batched one."""

    passes: int

    def logits_along(self, context: list[int], start: int) -> torch.Tensor | DraftRequest:
        """Next-token logits after ``context[:i]`` for each ``i`` in ``start..len(context)``
        [len(context) − start + 1, vocab], a fresh tensor, or a `DraftRequest` where a batched pass must run
        first."""


class CachedContext:
    """An LM with a KV cache over a token stream that changes at the end: feeds only what is new."""

    def __init__(self, lm: LanguageModel) -> None:
        self.lm = lm
        self.cache: KVCache | None = None
        self.seen: list[int] = []
        self.last: torch.Tensor | None = None  # logits after `seen`
        self.passes = 0

    def logits_along(self, context: list[int], start: int) -> torch.Tensor:
        """Next-token logits after ``context[:i]`` for each ``i`` in ``start..len(context)``
        [len(context) − start + 1, vocab], a fresh tensor: one pass feeding ``context`` from its common prefix
        with what the cache holds, or from ``start − 1`` if that is shorter (no pass when only the known last
        logits are asked for). Changes the cache: it then holds ``context``."""
        if start == len(context) and context == self.seen and self.last is not None:
            return self.last.clone()[None]
        n = next((i for i, (a, b) in enumerate(zip(self.seen, context)) if a != b), min(len(self.seen), len(context)))
        if self.cache is None:
            self.cache, n = self.lm.new_cache(), 0
        n = min(n, start - 1)  # logits after context[:start] come from position start − 1, fed again if cached
        self.cache.crop_slots(n)
        logits = self.lm.forward(context[n:], self.cache, logits_to_keep=len(context) - start + 1)
        self.passes += 1
        self.seen, self.last = list(context), logits[-1].clone()
        return logits


def masked(logits: torch.Tensor, fsm: TokenFSM, states: list[int]) -> torch.Tensor:
    """Draft ``logits`` [rows, vocab] cut or padded (with -inf) to the target's logits width (extra ids belong
    to no token), row ``i`` masked by ``states[i]``, EOS ids at -inf: the returned rows are ``logits`` itself (a
    view, changed in place) where it is at least that wide, else a new padded tensor (``logits`` unchanged).

    A candidate cannot carry EOS, so the draft distribution is q without the EOS
    ids: drawing from full q and dropping an EOS draw would bias speculative sampling.
    """
    width = fsm.logits_width
    if logits.shape[-1] >= width:
        logits = logits[:, :width]
    else:
        logits = torch.cat([logits, logits.new_full((len(logits), width - logits.shape[-1]), float("-inf"))], -1)
    fsm.mask_logits_inplace(logits, states)
    logits[:, list(fsm.eos_token_ids)] = float("-inf")
    return logits


@dataclass(eq=False)
class DraftModel:
    """What the model drafters share: a draft LM and its KV cache over the token stream."""

    lm: LanguageModel

    def __post_init__(self) -> None:
        self._own = CachedContext(self.lm)
        self._context: DraftContext = self._own  # a `ModelDrafter` in a batch draws from a batch row instead

    @property
    def passes(self) -> int:
        """Draft forward passes so far."""
        return self._context.passes

    def attach(self, context: DraftContext) -> None:
        """Draft from ``context`` (a row of a batched draft cache) instead of a cache of its own (changes the
        drafter)."""
        self._context = context

    def draft_pass_cost(self, target: LanguageModel) -> float:
        """One pass of this drafter's model in one-token passes of ``target`` (`draft_pass_cost`), which the
        row's draft length counts. Changes nothing."""
        return draft_pass_cost(self.lm, target)


@dataclass(eq=False)
class ModelDrafter(DraftModel):
    """A draft LM with the target's tokenizer, drafting under the FSM mask (see module doc); with a
    ``confidence`` (None: none), it stops after a token it is unsure of."""

    name: str = "draft_model"
    confidence: Confidence | None = field(default_factory=Confidence)
    _probs: list[float] = field(default_factory=list)  # its probability of each of this candidate's tokens

    def begin(self) -> None:
        self._probs = []

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        """Nothing to learn: the row's draft length learns from the verdicts."""

    def next(self, turn: Turn, context: list[int], state: int) -> Step | DraftRequest | None:
        if self.confidence is not None and not self.confidence.keep_going(self._probs):
            return None
        logits = self._context.logits_along(context, len(context))
        if isinstance(logits, DraftRequest):
            return logits
        logits = masked(logits, turn.fsm, [state])[0]
        if torch.isinf(logits).all():
            return None
        if turn.sampling.do_sample:
            q = probabilities(logits.cpu(), turn.sampling)  # verified on the CPU, next to the target's p
            token = sample(q, turn.generator)
        else:
            q, token = None, int(logits.argmax())
        self._probs.append(float((q if q is not None else logits.softmax(-1))[token]))
        return Step(token, self.name, q)
