"""Prompt lookup first, a model drafter where lookup has nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structspec.decoding.candidate import DraftRequest, Step
from structspec.decoding.drafter import Turn
from structspec.decoding.drafters.lookup import PromptLookup


@dataclass(eq=False)
class Composite:
    """Prompt lookup first; ``fallback`` (a model drafter) where lookup has nothing to propose.

    A fallback that does not pay is switched off: once it has drafted
    ``warmup`` tokens with an acceptance rate under ``min_acceptance``, its
    draft passes cost more than its accepted tokens save.
    """

    lookup: PromptLookup
    fallback: Any
    min_acceptance: float = 0.3
    warmup: int = 16
    _drafted: int = 0
    _accepted: int = 0

    @property
    def name(self) -> str:
        return self.fallback.name

    @property
    def passes(self) -> int:
        return self.fallback.passes

    @property
    def fallback_on(self) -> bool:
        return self._drafted < self.warmup or self._accepted >= self.min_acceptance * self._drafted

    def draft_pass_cost(self, target: Any) -> float:
        """A pass of the fallback's model in one-token passes of ``target``: what a row's draft length counts per
        draft pass (lookup's tokens take none). Changes nothing."""
        return self.fallback.draft_pass_cost(target)

    def begin(self) -> None:
        self.lookup.begin()
        self.fallback.begin()

    def next(self, turn: Turn, context: list[int], state: int) -> Step | DraftRequest | None:
        step = self.lookup.next(turn, context, state)
        if step is None and self.fallback_on:
            return self.fallback.next(turn, context, state)
        return step

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        self._drafted += drafted.get(self.fallback.name, 0)
        self._accepted += accepted.get(self.fallback.name, 0)
        self.lookup.feedback(drafted, accepted)
        self.fallback.feedback(drafted, accepted)
