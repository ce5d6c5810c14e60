"""One sequence decoded a turn at a time (see `structspec.decoding.row` for the algorithm).

A turn is two calls on the row: `RowDecode.prepare` offers a window, the
driver feeds it as far as it pays and runs one target pass over it
(`structspec.decoding.passes.run_pass`), which hands the logits to
`RowDecode.commit`. The row's KV cache is its own, cropped back over rejected
drafts; a row that drafts token trees (`structspec.decoding.drafter.TreeDrafting`)
takes the slot path instead, as every row of a batch does: explicit positions, a
mask over cache slots, and holes where the rejected branches were
(`structspec.models.packed_slots`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from dataclasses import replace

import torch

from structspec.decoding.cost import choose_widths, pass_cost
from structspec.decoding.calibrate import packed_cost
from structspec.decoding.candidate import DraftRequest
from structspec.decoding.drafter import TreeDrafting
from structspec.decoding.passes import Cropped, Slots, TargetCache, run_pass
from structspec.decoding.row import Decoded, DecodeOptions, RowDecode, RowInput
from structspec.decoding.window import Window
from structspec.models.packed_slots import PackedSlots
from structspec.models.protocol import LanguageModel
from structspec.models.prefix_cache import prefill_prompt

Emitted = tuple[list[int], list[str]]
"""The output tokens one turn added (forced, accepted drafts and the target's own) and their sources."""


def decode_steps(lm: LanguageModel, item: RowInput, options: DecodeOptions) -> Generator[Emitted, None, Decoded]:
    """Constrained decoding of ``item`` (its FSM's language after its prompt, its drafter and generator) with
    ``lm``, one turn at a time.

    Yields each turn's new output tokens as they are accepted (their concatenation is the output) and
    returns the `Decoded` (stop reason "error" with its `UnspellableError` where the output reached a state the
    vocabulary cannot spell on from). Each step runs at most one target pass. Samples with the item's
    generator, else one seeded with ``options.seed``. A tree drafter on a model that batches (`LM.batchable`)
    runs on the slot path, where token trees are verified; elsewhere it drafts chains. A greedy row is fed what
    pays, as a batch of one (`choose_widths` on the model's packed pass-cost curve:
    `structspec.decoding.calibrate.packed_cost`).
    """
    row = RowDecode.start(_seeded(item, options), options, lm, pass_cost(lm))
    cache, fit = _own_cache(lm, row, item), _fit_alone(lm, options)
    told = 0  # output tokens already yielded
    while not isinstance(offer := row.prepare(), Decoded):  # a window, until the row stops
        (done,) = run_pass(lm, cache, [(row, fit(offer))])  # the row commits the pass's logits
        if done.token_ids:
            yield done.token_ids, done.sources
            told += len(done.token_ids)
    if len(offer.token_ids) > told:  # forced in the last `prepare`
        yield offer.token_ids[told:], offer.sources[told:]
    return offer


def decode(lm: LanguageModel, item: RowInput, options: DecodeOptions) -> Decoded:
    """Constrained decoding of ``item`` with ``lm``: `decode_steps`' turns run out, nothing yielded. Changes the
    item's drafter and generator."""
    row = RowDecode.start(_seeded(item, options), options, lm, pass_cost(lm))
    cache, fit = _own_cache(lm, row, item), _fit_alone(lm, options)
    while not isinstance(offer := row.prepare(), Decoded):
        run_pass(lm, cache, [(row, fit(offer))])
    return offer


def _seeded(item: RowInput, options: DecodeOptions) -> RowInput:
    """``item``, with a generator seeded by ``options.seed`` where it has none. Changes nothing."""
    if item.generator is None and options.seed is not None:
        return replace(item, generator=torch.Generator().manual_seed(options.seed))
    return item


def _own_cache(lm: LanguageModel, row: RowDecode, item: RowInput) -> TargetCache:
    """A KV cache of the row's own, cropped back over rejected drafts; slots of its own where ``item``'s tree
    drafter drafts token trees (on a model that batches). Its prompt but the last token prefilled where the
    model prefills apart. Changes the row and the model's prefix cache."""
    kv = lm.new_cache()
    slots = PackedSlots(kv, 1) if isinstance(item.drafter, TreeDrafting) and lm.batchable else None
    if lm.prefills_apart and len(item.prompt_ids) > 1:
        _prefill_apart(lm, kv, slots, row, item.prompt_ids)
    return Slots(slots) if slots is not None else Cropped(kv)


def _fit_alone(lm: LanguageModel, options: DecodeOptions) -> Callable[[Window | DraftRequest], Window]:
    """How a row alone's window is cut: a greedy row's to what pays as a batch of one (`choose_widths` on the
    packed curve), a sampled row's kept whole (its draft was drawn with its generator). Changes nothing."""
    packed, cap = packed_cost(lm), lm.max_pass_tokens

    def fit(window: Window | DraftRequest) -> Window:
        assert isinstance(window, Window), "a row alone drafts from a cache of its own: it never waits on a batch"
        if options.sampling.do_sample:
            return window
        limit = cap if cap is not None and len(window.pending) < cap else None
        return window.first(choose_widths([list(window.gains)], packed, [len(window.pending)], limit)[0])

    return fit


def _prefill_apart(lm: LanguageModel, cache: object, slots: PackedSlots | None, row: RowDecode,
                   ids: list[int]) -> None:
    """Feed the prompt ``ids`` but its last token apart from the decode passes (changes the cache, the slots, the
    row and the model's prefix cache), as a batched row's is: the forced text and drafts that follow then go
    through attention by row, as plain decoding's one-token steps do, instead of inside the prompt's pass
    (`LM.prefills_apart`). On the chunk grid, its leading chunks reused where held
    (`structspec.models.prefix_cache.prefill_prompt`)."""
    t0 = time.perf_counter()
    reused = prefill_prompt(lm, ids[:-1], cache)
    if slots is not None:
        slots.place(0, len(ids) - 1)  # what the prefill just appended
    row.prefilled(len(ids) - 1 - reused, time.perf_counter() - t0, reused)
