"""The prefill floor: what feeding each prompt costs on its own, a part of every call that no decoding mode
changes. The benchmarks report it beside their rows so that a reader sees how much of a call's time decoding
could still win back."""

from __future__ import annotations

import time

from structspec.models.transformers_lm import LM


def prefill_seconds(lm: LM, prompts: list[list[int]]) -> float:
    """Seconds to prefill each of ``prompts`` (token ids) as structspec does, every token but the last in one pass
    on an empty cache, summed over the prompts (each timed alone, after any warm-up the caller ran). Runs the
    model on caches of its own; changes nothing else."""
    total = 0.0
    for ids in prompts:
        if len(ids) < 2:  # nothing before the last token: no prefill pass
            continue
        cache = lm.new_cache()
        start = time.perf_counter()
        lm.forward(ids[:-1], cache)
        total += time.perf_counter() - start
    return total
