"""The decode loop: fast-forward, draft, one target pass, verify, accept.

Each turn reads as the algorithm:

1. fast-forward the tokens the FSM forces (no model call);
2. stop if the FSM allows nothing but EOS;
3. draft a candidate under the FSM: forced text in its canonical spelling
   (spliced for free) and the drafter's tokens;
4. one target pass over every pending token plus the candidate, keeping
   logits for the candidate positions and the bonus position;
5. mask every row by the FSM state it was computed in and verify (greedy
   prefix match or speculative sampling, `structspec.decoding.verify`);
6. keep the accepted prefix and the target's own token, crop the KV cache
   back over the rejected rest. FSM states are kept per output position, so
   rollback is indexing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from structspec.decoding.drafters import Drafter
from structspec.decoding.fastforward import FastForward, Forcer
from structspec.automaton.fsm import TokenFSM
from structspec.errors import OptionError
from structspec.lm import LanguageModel
from structspec.result import DraftStats, Stats, StopReason
from structspec.decoding.sampling import SamplingConfig
from structspec.decoding.verify import verify_greedy, verify_sampled

FORCED, MODEL = "forced", "model"  # sources besides drafter names

@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; ``max_new_tokens`` counts output tokens (EOS is not output)."""

    max_new_tokens: int = 512
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    fast_forward: FastForward = "exact"

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise OptionError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.fast_forward == "canonical":
            raise OptionError(
                "fast_forward='canonical' was retired: use 'exact', which splices the canonical spelling into "
                "verified drafts, is lossless and needs fewer passes"
            )
        if self.fast_forward not in ("off", "exact"):
            raise OptionError(f"fast_forward must be 'off' or 'exact', got {self.fast_forward!r}")


@dataclass
class Decoded:
    """Raw loop output, before parsing: tokens, how each was produced, why it stopped."""

    token_ids: list[int]
    sources: list[str]  # per token: "forced", "model" or the drafter's name
    stop_reason: StopReason
    stats: Stats


def decode(
    lm: LanguageModel, fsm: TokenFSM, prompt_ids: list[int], options: DecodeOptions, drafter: Drafter | None = None
) -> Decoded:
    """Constrained decoding of ``fsm``'s language after ``prompt_ids`` with ``lm`` (see module doc)."""
    stats = Stats(prompt_tokens=len(prompt_ids))
    generator = torch.Generator().manual_seed(options.seed) if options.seed is not None else None
    forcer = Forcer(fsm, lm.tokenizer) if options.fast_forward == "exact" else None
    cache, cached = lm.new_cache(), 0  # cached: positions the target's KV cache holds
    state = fsm.initial_state
    pending = list(prompt_ids)  # tokens the target has not seen yet, all fed at the next pass
    out: list[int] = []
    states: list[int] = []  # states[i]: the FSM state after out[i]
    sources: list[str] = []
    while True:
        t0 = time.perf_counter()
        forced = forcer.force(state) if forcer else None
        if forced:
            pending += forced.token_ids
            out += forced.token_ids
            states += forced.states
            sources += [FORCED] * len(forced.token_ids)
            state = states[-1]
        stats.constraint_seconds += time.perf_counter() - t0
        if len(out) > options.max_new_tokens:
            del out[options.max_new_tokens :], sources[options.max_new_tokens :]
            stop = "max_new_tokens"
            break
        if fsm.is_complete(state):
            stop: StopReason = "fsm_complete"
            break

        candidate = draft_candidate(
            drafter, forcer, fsm, list(prompt_ids) + out, state, options.max_new_tokens - len(out),
            options, generator, stats,
        )

        t0 = time.perf_counter()
        logits = lm.forward(pending + candidate.tokens, cache, logits_to_keep=len(candidate.tokens) + 1)
        t1 = time.perf_counter()
        cached += len(pending) + len(candidate.tokens)
        stats.target_forward_passes += 1
        stats.tokens_fed.append(len(pending) + len(candidate.tokens))
        stats.model_seconds += t1 - t0

        fsm.mask_logits_inplace(logits, [state] + candidate.states)  # the bonus row too
        if options.sampling.do_sample:
            accepted, token = verify_sampled(logits, candidate.tokens, candidate.q, options.sampling, generator)
        else:
            accepted, token = verify_greedy(logits, candidate.tokens)
        if accepted < len(candidate.tokens):  # the rejected rest leaves the cache
            cached -= len(candidate.tokens) - accepted
            lm.crop(cache, cached)
            if forcer and candidate.sources[accepted] == FORCED:
                forcer.learn(candidate.tokens[accepted], token)
        out += candidate.tokens[:accepted]
        states += candidate.states[:accepted]
        sources += candidate.sources[:accepted]
        state = states[-1] if accepted else state
        _count_drafts(stats, drafter, candidate, accepted)
        stats.constraint_seconds += time.perf_counter() - t1

        if fsm.is_complete(state):  # the candidate finished the output; the target's token is EOS
            stop = "fsm_complete"
            break
        if token == fsm.eos_token_id:
            stop = "eos"
            break
        if len(out) == options.max_new_tokens:
            stop = "max_new_tokens"
            break
        state = fsm.next_state(state, token)
        assert state is not None, "a masked choice is always allowed"
        out.append(token)
        states.append(state)
        sources.append(MODEL)
        pending = [token]

    _count_output(stats, fsm, out, sources)
    return Decoded(out, sources, stop, stats)


@dataclass
class Candidate:
    """Drafted tokens with the FSM state after each, who proposed it, and its draft distribution."""

    tokens: list[int] = field(default_factory=list)
    states: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    q: list[torch.Tensor | None] = field(default_factory=list)  # None: a point mass


def draft_candidate(
    drafter: Drafter | None, forcer: Forcer | None, fsm: TokenFSM, context: list[int], state: int, limit: int,
    options: DecodeOptions, generator: torch.Generator | None, stats: Stats,
) -> Candidate:
    """Up to ``limit`` tokens after ``context`` (in ``state``): forced text spelled canonically wherever the
    FSM forces some, the drafter's tokens elsewhere; every token is allowed by the FSM."""
    cand = Candidate()
    if drafter is not None:
        drafter.begin()
    while len(cand.tokens) < limit and not fsm.is_complete(state):
        t0 = time.perf_counter()
        spliced, spliced_states = forcer.spelled(state) if forcer else ([], [])
        if spliced:
            n = min(len(spliced), limit - len(cand.tokens))
            cand.tokens += spliced[:n]
            cand.states += spliced_states[:n]
            cand.sources += [FORCED] * n
            cand.q += [None] * n
            state = spliced_states[n - 1]
            stats.constraint_seconds += time.perf_counter() - t0
            continue
        if drafter is None:
            break
        passes = drafter.passes
        step = drafter.next(context + cand.tokens, state, fsm, options.sampling, generator)
        entry = stats.drafts.setdefault(step.source if step else drafter.name, DraftStats())
        entry.seconds += time.perf_counter() - t0
        entry.draft_passes += drafter.passes - passes
        next_state = fsm.next_state(state, step.token) if step else None
        if step is None or next_state is None:
            break
        cand.tokens.append(step.token)
        cand.states.append(next_state)
        cand.sources.append(step.source)
        cand.q.append(step.q)
        state = next_state
    return cand


def _count_drafts(stats: Stats, drafter: Drafter | None, cand: Candidate, accepted: int) -> None:
    """Per-source drafted/accepted counts of one verified candidate; tells the drafter how it did."""
    drafted: dict[str, int] = {}
    kept: dict[str, int] = {}
    for i, source in enumerate(cand.sources):
        drafted[source] = drafted.get(source, 0) + 1
        kept[source] = kept.get(source, 0) + (i < accepted)
    for source, n in drafted.items():
        entry = stats.drafts.setdefault(source, DraftStats())
        entry.drafted += n
        entry.accepted += kept[source]
        entry.verify_passes += 1
    if drafter is not None:
        drafter.feedback(drafted, kept)


def _count_output(stats: Stats, fsm: TokenFSM, out: list[int], sources: list[str]) -> None:
    stats.output_tokens = len(out)
    stats.forced_tokens = sources[: len(out)].count(FORCED)
    stats.model_tokens = sources[: len(out)].count(MODEL)
    stats.forced_bytes = sum(len(fsm.vocab.token_bytes[t] or b"") for t, s in zip(out, sources) if s == FORCED)

