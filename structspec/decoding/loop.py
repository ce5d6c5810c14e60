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

from structspec.decoding.cost import DraftLength, PassCost, choose_widths
from structspec.decoding.candidate import DraftRequest
from structspec.decoding.drafter import TreeDrafting
from structspec.decoding.passes import Cropped, Slots, run_pass
from structspec.decoding.row import Committed, Decoded, DecodeOptions, RowDecode, RowInput
from structspec.decoding.window import Window
from structspec.models.packed_slots import PackedSlots
from structspec.models.protocol import LanguageModel
from structspec.models.prefix_cache import prefill_prompt

Emitted = tuple[list[int], list[str]]
"""The output tokens one turn added (forced, accepted drafts and the target's own) and their sources."""
Offer = Window | DraftRequest  # what a row offers a turn's pass (a row alone never waits on a batch's draft pass)


def decode_steps(lm: LanguageModel, item: RowInput, options: DecodeOptions,
                 cost: PassCost) -> Generator[Emitted, None, Decoded]:
    """Constrained decoding of ``item`` (its FSM's language after its prompt, its drafter and generator) with
    ``lm``, drafting by its pass-cost curve ``cost`` (`structspec.decoding.cost.pass_cost`), one turn (at most one target pass) at a time: yields each turn's new output tokens as they are
    accepted (their concatenation is the output) and returns the `Decoded` (stop reason "error" with its
    `UnspellableError` where the output reached a state the vocabulary cannot spell on from). Changes the item's
    drafter and generator."""
    row, turn = _alone(lm, item, options, cost)
    told = 0  # output tokens already yielded
    while not isinstance(offer := row.prepare(), Decoded):  # a window, until the row stops
        done = turn(offer)
        if done.token_ids:
            yield done.token_ids, done.sources
            told += len(done.token_ids)
    if len(offer.token_ids) > told:  # forced in the last `prepare`
        yield offer.token_ids[told:], offer.sources[told:]
    return offer


def decode(lm: LanguageModel, item: RowInput, options: DecodeOptions, cost: PassCost,
           pool: DraftLength | None = None) -> Decoded:
    """Constrained decoding of ``item`` with ``lm`` by the pass-cost curve ``cost`` (and ``pool``'s acceptance of
    drafts: `RowDecode.start`): `decode_steps`' turns run out, nothing yielded. Changes the item's drafter and
    generator, and the pool."""
    row, turn = _alone(lm, item, options, cost, pool)
    while not isinstance(offer := row.prepare(), Decoded):
        turn(offer)
    return offer


def _alone(lm: LanguageModel, item: RowInput, options: DecodeOptions, cost: PassCost,
           pool: DraftLength | None = None) -> tuple[RowDecode, Callable[[Offer], Committed]]:
    """``item``'s row (its generator seeded by ``options.seed`` where it has none) and its turn: the row's window
    fed to one target pass (`run_pass`) on a KV cache of the row's own, cropped back over rejected drafts, or
    slots of its own where the item's tree drafter drafts token trees (on a model that batches); a greedy row's
    window cut to what pays as a batch of one (`choose_widths` on ``cost``), a sampled row's fed whole (its
    draft was drawn with its generator). The prompt but its last token is prefilled where the model prefills
    apart. Changes the model's prefix cache."""
    if item.generator is None and options.seed is not None:
        item = replace(item, generator=torch.Generator().manual_seed(options.seed))
    cap, kv = lm.max_pass_tokens, lm.new_cache()
    row = RowDecode.start(item, options, lm, cost, pool)
    slots = PackedSlots(kv, 1) if isinstance(item.drafter, TreeDrafting) and lm.batchable else None
    if lm.prefills_apart and len(item.prompt_ids) > 1:
        _prefill_apart(lm, kv, slots, row, item.prompt_ids)
    cache = Slots(slots) if slots is not None else Cropped(kv)

    def turn(window: Offer) -> Committed:
        assert isinstance(window, Window), "a row alone drafts from a cache of its own: it never waits on a batch"
        if not window.sampled:
            limit = cap if cap is not None and len(window.pending) < cap else None
            window = window.first(choose_widths([list(window.gains)], cost, [len(window.pending)], limit)[0])
        return run_pass(lm, cache, [(row, window)])[0]

    return row, turn


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
