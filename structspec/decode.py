"""The decode loop: one target pass per decision, the FSM masking every choice.

Reads as the algorithm: stop if the FSM allows nothing but EOS → one forward
pass over the pending tokens → mask the logits by the FSM state → choose a token
→ advance the FSM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from structspec.errors import TokenBudgetExceeded
from structspec.fsm import TokenFSM
from structspec.result import Stats, StopReason
from structspec.sampling import SamplingConfig, choose_token


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; ``max_new_tokens`` counts output tokens (EOS is not output)."""

    max_new_tokens: int = 512
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")


@dataclass
class Decoded:
    """Raw loop output, before parsing."""

    token_ids: list[int]
    stop_reason: StopReason
    stats: Stats


def decode(lm: Any, fsm: TokenFSM, prompt_ids: list[int], options: DecodeOptions) -> Decoded:
    """Constrained decoding of ``fsm``'s language after ``prompt_ids`` with ``lm`` (see module doc)."""
    stats = Stats(prompt_tokens=len(prompt_ids))
    generator = torch.Generator().manual_seed(options.seed) if options.seed is not None else None
    cache = lm.new_cache()
    state = fsm.initial_state
    pending = list(prompt_ids)  # tokens the model has not seen yet, fed at the next pass
    out: list[int] = []
    while True:
        if fsm.is_complete(state):
            stop: StopReason = "fsm_complete"
            break

        t0 = time.perf_counter()
        logits = lm.forward(pending, cache)[-1:]
        t1 = time.perf_counter()
        stats.target_forward_passes += 1
        stats.tokens_fed.append(len(pending))
        stats.model_seconds += t1 - t0

        fsm.mask_logits_inplace(logits, [state])
        token = choose_token(logits[0], options.sampling, generator)
        next_state = fsm.next_state(state, token)
        stats.constraint_seconds += time.perf_counter() - t1
        if token == fsm.eos_token_id:
            stop = "eos"
            break
        if len(out) == options.max_new_tokens:
            raise TokenBudgetExceeded(options.max_new_tokens, fsm.vocab.decode(out), out)
        assert next_state is not None, "a masked choice is always allowed"
        state = next_state
        out.append(token)
        pending = [token]

    stats.output_tokens = len(out)
    return Decoded(out, stop, stats)
