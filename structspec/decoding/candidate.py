"""A drafted candidate and its parts: what a drafter proposes, what the target verifies in one pass.

The floor of the decoding wing: plain values, no model and no driver. A
candidate is a chain, or a token tree in topological order; a drafter proposes
one `Step` at a time, or a `DraftRequest` where a batched draft pass must run
before it can.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from structspec.automaton.fsm import TokenFSM

FORCED, MODEL = "forced", "model"  # sources besides drafter names


def enterable(fsm: TokenFSM, states: list[int]) -> int:
    """How many of ``states`` (reached one after another) a draft may enter: those before the first the vocabulary
    cannot spell on from (`TokenFSM.spellable`). A draft never enters such a state, so only the output reaching
    one stops a row. Reads the FSM's caches; changes nothing else."""
    return next((i for i, s in enumerate(states) if not fsm.spellable(s)), len(states))


@dataclass(frozen=True)
class Step:
    """One drafted token; ``q`` is the draft's distribution when it was sampled, None for a point mass."""

    token: int
    source: str
    q: torch.Tensor | None = None


@dataclass(frozen=True)
class DraftRequest:
    """A drafter's answer where it needs draft logits its batch has not computed yet: the batch driver runs
    one draft pass for every row that asked, then the row drafts on from where it stopped."""


@dataclass
class Candidate:
    """Drafted tokens with the FSM state after each, who proposed it, and its draft distribution: a chain, or a
    token tree in topological order whose ``parents[i]`` is the index of the token ``i`` follows (−1: the
    pending tokens). ``seconds``: time spent drafting it, by source (forced text under `FORCED`);
    ``draft_passes``: the drafter's own forward passes for it."""

    tokens: list[int] = field(default_factory=list)
    states: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    q: list[torch.Tensor | None] = field(default_factory=list)  # None: a point mass
    parents: list[int] | None = None  # None: a chain
    seconds: dict[str, float] = field(default_factory=dict)
    draft_passes: int = 0

    def parent_indices(self) -> list[int]:
        """Each token's parent index (a chain's: ``i − 1``). Changes nothing."""
        return self.parents if self.parents is not None else list(range(-1, len(self.tokens) - 1))

    def append(self, step: Step, state: int) -> None:
        """Add ``step``'s token reaching ``state`` at the end of a chain. Changes the candidate."""
        self.tokens.append(step.token)
        self.states.append(state)
        self.sources.append(step.source)
        self.q.append(step.q)

    def first(self, n: int) -> Candidate:
        """A new candidate of the first ``n`` nodes (a chain's prefix; a tree's topological prefix is a tree),
        with this one's drafting time and passes. Changes nothing."""
        parents = self.parents[:n] if self.parents is not None else None
        return Candidate(self.tokens[:n], self.states[:n], self.sources[:n], self.q[:n], parents, self.seconds,
                         self.draft_passes)

    def time(self, source: str, seconds: float) -> None:
        """Add ``seconds`` of drafting to ``source`` (changes the candidate)."""
        self.seconds[source] = self.seconds.get(source, 0.0) + seconds
