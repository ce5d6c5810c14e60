"""When a model drafter stops drafting: the heuristic schedule and threshold decoding."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol


class Policy(Protocol):
    """When a model drafter stops drafting; ``probs`` are its probabilities of this candidate's tokens."""

    def keep_going(self, probs: list[float]) -> bool: ...

    def feedback(self, probs: list[float], accepted: int) -> None: ...


@dataclass
class Schedule:
    """The heuristic schedule: draft ``length`` tokens (start 5; +2 after a fully accepted draft, −1
    otherwise), and stop early after a token whose draft probability is below ``confidence`` (dynamic
    speculation; None disables)."""

    length: int = 5
    confidence: float | None = 0.4
    max_length: int = 32

    def keep_going(self, probs: list[float]) -> bool:
        if len(probs) >= self.length:
            return False
        return not probs or self.confidence is None or probs[-1] >= self.confidence

    def feedback(self, probs: list[float], accepted: int) -> None:
        if not probs:
            return
        self.length = min(self.length + 2, self.max_length) if accepted == len(probs) else max(self.length - 1, 1)


@dataclass
class Threshold:
    """Threshold decoding: keep drafting while the cumulative draft probability stays above ``threshold``.

    After a rejection the threshold moves halfway toward the cumulative
    probability of the last accepted draft token (toward 1 when none was
    accepted); after a fully accepted draft it drops by ``step``; it stays in
    [``low``, ``high``].
    """

    threshold: float = 0.5
    step: float = 0.1
    low: float = 0.05
    high: float = 0.95
    max_length: int = 32

    def keep_going(self, probs: list[float]) -> bool:
        return len(probs) < self.max_length and math.prod(probs) >= self.threshold

    def feedback(self, probs: list[float], accepted: int) -> None:
        if not probs:
            return
        if accepted < len(probs):
            toward = math.prod(probs[:accepted]) if accepted else 1.0
            self.threshold += (toward - self.threshold) / 2
        else:
            self.threshold -= self.step
        self.threshold = min(max(self.threshold, self.low), self.high)
