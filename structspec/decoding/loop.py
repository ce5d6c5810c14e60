"""Decoding one sequence: `RowDecode` driven by one target pass per turn over a KV cache that is cropped
back over rejected drafts (see `structspec.decoding.row` for the algorithm)."""

from __future__ import annotations

import time
from collections.abc import Generator

import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.budget import pass_cost
from structspec.decoding.drafters import Drafter
from structspec.decoding.row import Decoded, DecodeOptions, RowDecode, token_logprobs
from structspec.decoding.verify import mask_full_rows, restrict
from structspec.lm import LanguageModel

Turn = tuple[list[int], list[str]]
"""The output tokens one turn added (forced, accepted drafts and the target's own) and their sources."""


def decode_steps(
    lm: LanguageModel, fsm: TokenFSM, prompt_ids: list[int], options: DecodeOptions, drafter: Drafter | None = None,
    generator: torch.Generator | None = None,
) -> Generator[Turn, None, Decoded]:
    """Constrained decoding of ``fsm``'s language after ``prompt_ids`` with ``lm``, one turn at a time.

    Yields each turn's new output tokens as they are accepted (their concatenation is the output) and
    returns the `Decoded`. Each step runs at most one target pass. Samples with ``generator``, else one
    seeded with ``options.seed``.
    """
    if generator is None and options.seed is not None:
        generator = torch.Generator().manual_seed(options.seed)
    row = RowDecode.start(fsm, lm.tokenizer, prompt_ids, options, drafter, generator, lm.max_context,
                          pass_cost(lm))
    cache = lm.new_cache()
    told = 0  # output tokens already yielded
    while (window := row.prepare()) is not None:
        t0 = time.perf_counter()
        rows = [(fsm, state) for state in row.mask_states()]  # the bonus row too
        allowed = restrict(rows, lm.logits_width)
        t1 = time.perf_counter()
        logits = lm.forward(window, cache, len(row.candidate.tokens) + 1, allowed)
        t2 = time.perf_counter()
        row.stats.target_forward_passes += 1
        row.stats.tokens_fed.append(len(window))
        row.stats.model_seconds += t2 - t1
        mask_full_rows(logits, rows, allowed)
        if options.sampling.do_sample:
            logits = logits.cpu()  # draws use the CPU generator, so a seed gives the same sample on any device
        accepted, token = row.verify(logits)
        scores = None
        if row.logprobs is not None:  # row i of the logits scores candidate token i; the target's token is next
            scores = token_logprobs(logits, row.candidate.tokens[:accepted] + [token], options.sampling)
        row.stats.constraint_seconds += time.perf_counter() - t2 + t1 - t0
        if row.accept(accepted, token, scores) < len(window):  # the rejected rest leaves the cache
            lm.crop(cache, row.cached)
        if len(row.out) > told:
            yield row.out[told:], row.sources[told:]
            told = len(row.out)
    if len(row.out) > told:  # forced in the last `prepare`
        yield row.out[told:], row.sources[told:]
    return row.decoded()


def decode(
    lm: LanguageModel, fsm: TokenFSM, prompt_ids: list[int], options: DecodeOptions, drafter: Drafter | None = None,
    generator: torch.Generator | None = None,
) -> Decoded:
    """Constrained decoding of ``fsm``'s language after ``prompt_ids`` with ``lm`` (`decode_steps`, run out)."""
    steps = decode_steps(lm, fsm, prompt_ids, options, drafter, generator)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
