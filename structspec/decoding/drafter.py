"""What the decode loop needs of a drafter, and the one object a candidate is drafted under.

The loop asks a drafter for one token at a time (`Drafter.next`) after a
context and an FSM state, under a `Turn`: the FSM, the forcer, the sampling
configuration and generator, where the candidate starts and what it may spend.
It splices forced text in between for free and stops the candidate where the
FSM rejects a token or the drafter returns None. After the target's verdict
the loop calls `Drafter.feedback` so adaptive drafters can learn what to propose.
How many tokens a candidate may have (``Turn.drafted``) is the row's draft length
(`structspec.decoding.cost.DraftLength`), not the drafter's: a `ModelDrafting`
drafter says what its draft passes cost, and the length counts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.candidate import Candidate, DraftRequest, Step
from structspec.decoding.fastforward import Forcer
from structspec.decoding.sampling import SamplingConfig
from structspec.models.protocol import LanguageModel


@dataclass(frozen=True)
class Turn:
    """One candidate's drafting: what it drafts with (``fsm``, ``forcer``, ``sampling``, ``generator``), where
    it starts (after ``context``, in ``state``), its most tokens (``limit``) and drafter tokens (``drafted``).
    Holds no state: a sibling branch drafts under a copy with another start (`dataclasses.replace`)."""

    fsm: TokenFSM
    forcer: Forcer | None
    sampling: SamplingConfig
    generator: torch.Generator | None
    context: list[int]
    state: int
    limit: int
    drafted: int

    def allows(self, state: int) -> Callable[[int], bool]:
        """Whether the FSM allows a token in ``state``, as a predicate. Builds the rows it reaches: the FSM's
        table grows, its language does not."""
        return lambda token: self.fsm.next_state(state, token) is not None


@runtime_checkable
class Drafter(Protocol):
    """What the decode loop needs of a drafter; ``name`` labels its tokens in `Result.sources`."""

    name: str
    passes: int  # draft forward passes so far

    def begin(self) -> None:
        """A new candidate starts (resets per-candidate counters)."""

    def next(self, turn: Turn, context: list[int], state: int) -> Step | DraftRequest | None:
        """The next draft token after ``context`` (the turn's context and the candidate so far) in ``state``, a
        `DraftRequest` where a batched draft pass must run first (ask again after it), or None to stop."""

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        """How many tokens of each source the last candidate had and the target accepted."""


@runtime_checkable
class TreeDrafting(Drafter, Protocol):
    """A drafter that drafts token trees for greedy rows (`structspec.decoding.drafters.tree.TreeDrafter`); a chain
    through `Drafter.next` elsewhere."""

    def draft_tree(self, turn: Turn) -> Candidate:
        """A token tree after the turn's context, at most ``turn.limit`` deep, its size set by ``turn.drafted``
        (the drafter tokens the cost model would feed); every token allowed by the FSM."""


@runtime_checkable
class ModelDrafting(Protocol):
    """A drafter that runs a draft model (`structspec.decoding.drafters.draft_model.DraftModel`): its passes cost
    the row time, which its draft length counts (`structspec.decoding.cost.DraftLength`)."""

    def draft_pass_cost(self, target: LanguageModel) -> float:
        """One draft pass's cost in one-token passes of ``target`` (`structspec.decoding.cost.draft_pass_cost`).
        Changes nothing."""


@runtime_checkable
class Observing(Protocol):
    """A drafter that learns from the target's choices (`structspec.decoding.drafters.lookahead.LookaheadDrafter`)."""

    def observe(self, context: list[int], candidate: Candidate, choices: list[int]) -> None:
        """The target's masked argmax at the root (``choices[0]``) and after each token ``i`` of ``candidate``
        (``choices[1 + i]``), drafted after ``context`` (changes the drafter)."""
