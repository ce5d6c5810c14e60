"""The decode loop: fast-forward what the FSM forces, then one target pass per decision.

Reads as the algorithm: fast-forward forced tokens (no model call) → stop if
the FSM allows nothing but EOS → one forward pass over every pending token →
mask the logits by the FSM state → choose a token → advance the FSM.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from structspec.errors import TokenBudgetExceeded
from structspec.fastforward import FastForward, Forcer
from structspec.fsm import TokenFSM
from structspec.result import Stats, StopReason
from structspec.sampling import SamplingConfig, choose_token

Source = Literal["forced", "model"]


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; ``max_new_tokens`` counts output tokens (EOS is not output)."""

    max_new_tokens: int = 512
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    fast_forward: FastForward = "exact"

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.fast_forward not in ("off", "exact", "canonical"):
            raise ValueError(f"fast_forward must be 'off', 'exact' or 'canonical', got {self.fast_forward!r}")


@dataclass
class Decoded:
    """Raw loop output, before parsing: tokens, how each was produced, why it stopped."""

    token_ids: list[int]
    sources: list[Source]
    stop_reason: StopReason
    stats: Stats


def decode(lm: Any, fsm: TokenFSM, prompt_ids: list[int], options: DecodeOptions) -> Decoded:
    """Constrained decoding of ``fsm``'s language after ``prompt_ids`` with ``lm`` (see module doc)."""
    stats = Stats(prompt_tokens=len(prompt_ids))
    generator = torch.Generator().manual_seed(options.seed) if options.seed is not None else None
    forcer = Forcer(fsm, lm.tokenizer, options.fast_forward) if options.fast_forward != "off" else None
    cache = lm.new_cache()
    state = fsm.initial_state
    pending = list(prompt_ids)  # tokens the model has not seen yet, all fed at the next pass
    out: list[int] = []
    states: list[int] = []  # states[i]: the FSM state after out[i]
    sources: list[Source] = []
    while True:
        t0 = time.perf_counter()
        forced = forcer.force(state, out, states) if forcer else None
        if forced:  # replaces out[replace_from:], which is still pending
            dropped = len(out) - forced.replace_from
            model_made = len(forced.token_ids) - forced.forced_count
            del out[forced.replace_from:], states[forced.replace_from:], sources[forced.replace_from:]
            pending = pending[: len(pending) - dropped] + forced.token_ids
            out += forced.token_ids
            states += forced.states
            sources += ["model"] * model_made + ["forced"] * forced.forced_count
            state = states[-1]
        stats.constraint_seconds += time.perf_counter() - t0
        if len(out) > options.max_new_tokens:
            raise _out_of_budget(options, fsm, out[: options.max_new_tokens], sources, stats)
        if fsm.is_complete(state):
            stop: StopReason = "fsm_complete"
            break

        t0 = time.perf_counter()
        logits = lm.forward(pending, cache)[-1:]
        t1 = time.perf_counter()
        stats.target_forward_passes += 1
        stats.tokens_fed.append(len(pending))
        stats.model_seconds += t1 - t0

        allowed = fsm.allowed_token_ids(state)
        if len(allowed) == 1:  # no draw, so sampled runs consume the RNG alike in every mode
            token = allowed[0]
        else:
            fsm.mask_logits_inplace(logits, [state])
            token = choose_token(logits[0], options.sampling, generator)
        next_state = fsm.next_state(state, token)
        stats.constraint_seconds += time.perf_counter() - t1
        if token == fsm.eos_token_id:
            stop = "eos"
            break
        if len(out) == options.max_new_tokens:
            raise _out_of_budget(options, fsm, out, sources, stats)
        assert next_state is not None, "a masked choice is always allowed"
        state = next_state
        out.append(token)
        states.append(state)
        sources.append("model")
        pending = [token]

    _count_output(stats, fsm, out, sources)
    return Decoded(out, sources, stop, stats)


def _count_output(stats: Stats, fsm: TokenFSM, out: list[int], sources: list[Source]) -> None:
    stats.output_tokens = len(out)
    stats.forced_tokens = sources[: len(out)].count("forced")
    stats.forced_bytes = sum(len(fsm.vocab.token_bytes[t] or b"") for t, s in zip(out, sources) if s == "forced")


def _out_of_budget(
    options: DecodeOptions, fsm: TokenFSM, out: list[int], sources: list[Source], stats: Stats
) -> TokenBudgetExceeded:
    _count_output(stats, fsm, out, sources)
    return TokenBudgetExceeded(options.max_new_tokens, fsm.vocab.decode(out), out, stats, sources[: len(out)])
