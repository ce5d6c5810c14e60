"""Driving `RowDecode` through target passes (see `structspec.decoding.row` for the algorithm).

One sequence (`decode_steps`) runs one target pass per turn over a KV cache
cropped back over rejected drafts. A row that drafts token trees
(`structspec.decoding.drafter.TreeDrafting`) takes the slot path instead, as every
row of a batch does (`slot_pass`): explicit positions, a mask over cache slots,
and holes where the rejected branches were (`structspec.models.packed_slots`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from itertools import accumulate
from dataclasses import replace

import torch

from structspec.decoding.budget import choose_widths, pass_cost
from structspec.decoding.calibrate import packed_cost
from structspec.decoding.drafter import TreeDrafting
from structspec.decoding.row import Decoded, DecodeOptions, RowDecode, RowInput
from structspec.decoding.masks import MaskFill
from structspec.decoding.verify import restrict
from structspec.models.protocol import LanguageModel
from structspec.models.packed_slots import PackedSlots
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
    pays, as a batch of one (`choose_widths` on the packed pass-cost curve, measured on a named model's first
    decode and stored: `structspec.decoding.calibrate.packed_cost`).
    """
    if item.generator is None and options.seed is not None:
        item = replace(item, generator=torch.Generator().manual_seed(options.seed))
    trees = isinstance(item.drafter, TreeDrafting) and lm.batchable
    row = RowDecode.start(item, options, lm, pass_cost(lm))
    cache = lm.new_cache()
    slots = PackedSlots(cache, 1) if trees else None
    if lm.prefills_apart and len(item.prompt_ids) > 1:
        _prefill_apart(lm, cache, slots, row)
    if slots is not None:
        step = _slot_step(lm, row, slots)
    else:
        step = _crop_step(lm, row, cache)
    told = 0  # output tokens already yielded
    cap = lm.max_pass_tokens
    packed = packed_cost(lm)  # measured on the model's first decode, then stored
    while (window := row.prepare()) is not None:
        assert isinstance(window, list), "a row alone drafts from a cache of its own: it never waits on a batch"
        if not options.sampling.do_sample:  # a batch of one: fed what pays (a sampled draft was drawn: kept whole)
            limit = cap if cap is not None and len(row.pending) < cap else None
            window = row.fit(choose_widths([row.window_gains()], packed, [len(row.pending)], limit)[0])
        step(window)
        if len(row.out) > told:
            yield row.out[told:], row.sources[told:]
            told = len(row.out)
    if len(row.out) > told:  # forced in the last `prepare`
        yield row.out[told:], row.sources[told:]
    return row.decoded()


def _prefill_apart(lm: LanguageModel, cache: object, slots: PackedSlots | None, row: RowDecode) -> None:
    """Feed ``row``'s prompt but its last token apart from the decode passes (changes the cache, the slots, the
    row and the model's prefix cache), as a batched row's is: the forced text and drafts that follow then go
    through attention by row, as plain decoding's one-token steps do, instead of inside the prompt's pass
    (`LM.prefills_apart`). On the chunk grid, its leading chunks reused where held
    (`structspec.models.prefix_cache.prefill_prompt`)."""
    t0 = time.perf_counter()
    ids = row.pending
    reused = prefill_prompt(lm, ids[:-1], cache)
    if slots is not None:
        slots.place(0, len(ids) - 1)  # what the prefill just appended
    row.prefilled(len(ids) - 1 - reused, time.perf_counter() - t0, reused)


def _crop_step(lm: LanguageModel, row: RowDecode, cache: object) -> Callable[[list[int]], None]:
    """One turn of ``row`` on a KV cache of its own: a pass over the window, verify, accept, crop the rest."""
    fsm, sampling = row.item.fsm, row.options.sampling

    def step(window: list[int]) -> None:
        t0 = time.perf_counter()
        rows = [(fsm, state) for state in row.mask_states()]  # the bonus row too
        allowed = restrict(rows, lm.logits_width)
        fill = MaskFill.start(rows, allowed, lm.device)  # fills while the model runs where that pays
        t1 = time.perf_counter()
        logits = lm.forward(window, cache, len(row.candidate.tokens) + 1, allowed)
        t2 = time.perf_counter()
        fill.apply(logits)
        if sampling.do_sample:
            logits = logits.cpu()  # draws use the CPU generator, so a seed gives the same sample on any device
        path, token = row.verify(logits)
        scores = row.path_logprobs(logits, path, token)
        row.record_pass(len(window), t2 - t1, time.perf_counter() - t2 + t1 - t0)
        if len(row.accept(path, token, scores)) < len(window):  # a chain keeps a prefix: crop the rest
            lm.crop(cache, row.cached)

    return step


def _slot_step(lm: LanguageModel, row: RowDecode, slots: PackedSlots) -> Callable[[list[int]], None]:
    """One turn of ``row`` on the slot path, as a batch of one."""
    return lambda window: slot_pass(lm, slots, [(row, window)])


def slot_pass(lm: LanguageModel, slots: PackedSlots, fed: list[tuple[RowDecode, list[int]]]) -> None:
    """One target pass over every row's window (``fed``: each row and its window of pending tokens and
    candidate, a chain or a tree; or a chunk of pending tokens alone, `RowDecode.fit`), packed into one sequence
    appended to ``slots``' cache, then mask, verify and accept per row. Rejected tokens become holes in ``slots``,
    gathered away when they pile up. Changes the rows and the slot cache."""
    t0 = time.perf_counter()
    live, windows = [row for row, _ in fed], [window for _, window in fed]
    widths = [len(window) for window in windows]
    masks = [row.mask_states() for row in live]  # per row, a state per logits row (a chunk: none)
    starts = [0, *accumulate(widths)][:-1]  # each row's first token in the packed window
    wanted = [(0, start + j) for start, width, states in zip(starts, widths, masks)  # candidate and bonus positions
              for j in range(width - len(states), width)]
    rows = [(row.item.fsm, state) for row, states in zip(live, masks) for state in states]
    allowed = restrict(rows, lm.logits_width)
    attend = slots.window_mask(widths, [row.window_parents() for row in live])
    positions = [p for row in live for p in row.window_positions()]
    fill = MaskFill.start(rows, allowed, lm.device)  # fills while the model runs where that pays
    t1 = time.perf_counter()
    logits = lm.forward_slots([[t for window in windows for t in window]], [positions], attend, slots.kv, wanted,
                              allowed)
    t2 = time.perf_counter()
    fill.apply(logits)
    sampled = any(row.options.sampling.do_sample for row in live)
    if sampled:
        logits = logits.cpu()  # each row draws from its own CPU generator, so samples do not depend on the device
        choices = None
    else:
        choices = logits.argmax(-1).tolist()  # the one read-back of the pass
    t3 = time.perf_counter()
    kept, r = [], 0
    for row, window, states in zip(live, windows, masks):
        n = len(states)
        row.record_pass(len(window), (t2 - t1) / len(live), (t3 - t2 + t1 - t0) / len(live))  # each its share
        if not n:  # a chunk: nothing to verify
            kept.append(row.accept_chunk())
            continue
        path, token = row.verify(logits[r : r + n], choices[r : r + n] if choices is not None else None)
        kept.append(row.accept(path, token, row.path_logprobs(logits[r : r + n], path, token)))
        r += n
    slots.keep(kept, widths)
    slots.compact()


def decode(lm: LanguageModel, item: RowInput, options: DecodeOptions) -> Decoded:
    """Constrained decoding of ``item`` with ``lm`` (`decode_steps`, run out). Changes the item's drafter and
    generator."""
    steps = decode_steps(lm, item, options)
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value
