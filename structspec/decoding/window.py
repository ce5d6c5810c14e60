"""What a row offers a target pass: a frozen window of tokens, with what the pass needs to feed and mask them.

A row (`structspec.decoding.row.RowDecode.prepare`) offers a `Window`: its
pending tokens (output or prompt its KV cache has not seen), then its drafted
candidate (a chain, or a token tree). The driver reads only the window: it cuts
it to the width a pass pays for (`Window.first`, from ``gains``), feeds
``tokens`` at ``positions`` (each token attending to its ``parents``), masks the
logits rows by ``states`` and hands the logits back with the window to
`RowDecode.commit`. A window is never changed: cutting makes a new one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.candidate import Candidate


@dataclass(frozen=True)
class Window:
    """A row's tokens for one target pass: ``pending`` (fed first, no verdict needed) and ``candidate``; or, with
    ``chunk``, only the first ``chunk`` pending tokens, fed with no logits and nothing to verify.

    ``start`` is the position of the first token (the positions the row's cache holds); ``state`` the FSM state
    after the pending tokens (the candidate's root); ``gains[w − 1]`` the expected tokens the row's cache gains
    when only the first ``w`` tokens are fed (the pending ones, then the candidate's expected kept path);
    ``sampled``: the row samples, so its draft was drawn with its generator and is fed whole."""

    fsm: TokenFSM
    pending: tuple[int, ...]
    candidate: Candidate
    start: int
    state: int
    gains: tuple[float, ...] = ()
    sampled: bool = False
    chunk: int = 0

    @property
    def fed(self) -> int:
        """The pending tokens this window feeds."""
        return self.chunk or len(self.pending)

    @property
    def tokens(self) -> list[int]:
        """The token ids to feed, in order (a new list)."""
        return list(self.pending[: self.chunk]) if self.chunk else [*self.pending, *self.candidate.tokens]

    @property
    def states(self) -> list[int]:
        """The FSM state each logits row is masked by: the candidate's root, then the state after each candidate
        token (the last is the bonus row's); none for a chunk."""
        return [] if self.chunk else [self.state, *self.candidate.states]

    @property
    def parents(self) -> list[int]:
        """Each token's parent as an offset in the window (−1 for the first, which follows the cache): the pending
        tokens form a chain, the candidate's roots follow the last of them."""
        fed = self.fed
        return list(range(-1, fed - 1)) + [fed + p for p in self.candidate.parent_indices()]

    @property
    def positions(self) -> list[int]:
        """Each token's position: one past its parent's (siblings share one), the first at ``start``."""
        positions: list[int] = []
        for p in self.parents:
            positions.append(positions[p] + 1 if p >= 0 else self.start)
        return positions

    @property
    def floor(self) -> int:
        """The tokens a pass feeds of this window at least: a sampled row's all, a greedy row's pending ones (output
        or prompt already: fed now or later, they cost the same), one at least."""
        return len(self.pending) + len(self.candidate.tokens) if self.sampled else max(len(self.pending), 1)

    def first(self, width: int) -> Window:
        """This window cut to its first ``width`` tokens (whole where it fits): the candidate keeps its first nodes
        (a chain's prefix; a tree's topological prefix is a tree), or, where the pending tokens alone are longer,
        a chunk of them with no candidate and no logits. A new window; changes nothing."""
        fed = len(self.pending)
        if width < fed:
            return replace(self, candidate=self.candidate.first(0), chunk=width)
        return replace(self, candidate=self.candidate.first(width - fed))
