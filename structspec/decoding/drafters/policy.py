"""Whether a model drafter still has a token worth proposing: its own probability of the tokens it drafted.

A model drafter keeps no draft length of its own: how many tokens a candidate may have is the row's one
decision (`structspec.decoding.cost.DraftLength`, which learns per position how often drafted tokens are kept
and counts what the draft passes cost). What the drafter alone knows is how sure it is of what it drafts, and
where it is unsure it stops, as prompt lookup stops where nothing matches: an input to the length, not a
length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Confidence:
    """Stop after a drafted token whose own probability is under ``floor`` (dynamic speculation), or, with
    ``cumulative``, once the product of the candidate's token probabilities is under it (threshold decoding).
    Holds no state."""

    floor: float = 0.4
    cumulative: bool = False

    def keep_going(self, probs: list[float]) -> bool:
        """Whether to draft another token after tokens of these probabilities (this candidate's). Changes
        nothing."""
        if not probs:
            return True
        return (math.prod(probs) if self.cumulative else probs[-1]) >= self.floor


THRESHOLD = Confidence(0.5, cumulative=True)
"""Threshold decoding's stop: the candidate's cumulative draft probability under one half."""
