"""Decoding one sequence: `RowDecode` driven by one target pass per turn over a KV cache that is cropped
back over rejected drafts (see `structspec.decoding.row` for the algorithm)."""

from __future__ import annotations

import time

import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.drafters import Drafter
from structspec.decoding.row import Decoded, DecodeOptions, RowDecode
from structspec.lm import LanguageModel


def decode(
    lm: LanguageModel, fsm: TokenFSM, prompt_ids: list[int], options: DecodeOptions, drafter: Drafter | None = None
) -> Decoded:
    """Constrained decoding of ``fsm``'s language after ``prompt_ids`` with ``lm``."""
    generator = torch.Generator().manual_seed(options.seed) if options.seed is not None else None
    row = RowDecode.start(fsm, lm.tokenizer, prompt_ids, options, drafter, generator, lm.max_context)
    cache = lm.new_cache()
    while (window := row.prepare()) is not None:
        t0 = time.perf_counter()
        logits = lm.forward(window, cache, logits_to_keep=len(row.candidate.tokens) + 1)
        t1 = time.perf_counter()
        row.stats.target_forward_passes += 1
        row.stats.tokens_fed.append(len(window))
        row.stats.model_seconds += t1 - t0
        fsm.mask_logits_inplace(logits, row.mask_states())  # the bonus row too
        if options.sampling.do_sample:
            logits = logits.cpu()  # draws use the CPU generator, so a seed gives the same sample on any device
        row.stats.constraint_seconds += time.perf_counter() - t1
        if row.accept(*row.verify(logits)) < len(window):  # the rejected rest leaves the cache
            lm.crop(cache, row.cached)
    return row.decoded()
