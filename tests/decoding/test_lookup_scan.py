"""Prompt lookup's scan for earlier occurrences (`continuations`) against a plain reading of its contract."""

from __future__ import annotations

import random

from structspec.decoding.drafters.lookup import continuations


def reference(context: list[int], longest: int, shortest: int, allowed: set[int]) -> list[int]:
    """What followed each earlier occurrence of the last n tokens, earliest first, for the longest n with one
    whose next token is allowed: every position compared, one by one."""
    for n in range(min(longest, len(context) - 1), shortest - 1, -1):
        found = [context[i + n] for i in range(len(context) - n)
                 if context[i : i + n] == context[-n:] and context[i + n] in allowed]
        if found:
            return found
    return []


def test_the_scan_finds_every_earlier_occurrence_earliest_first() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        context = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        allowed = {t for t in range(4) if rng.random() < 0.7}
        longest, shortest = rng.randrange(1, 5), rng.randrange(1, 3)
        got = list(continuations(context, longest, shortest, allowed.__contains__))
        assert got == reference(context, longest, shortest, allowed), (context, longest, shortest, allowed)
