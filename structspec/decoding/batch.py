"""Decoding many rows per target pass, with continuous batching.

Each row is a `RowDecode` (plain values: FSM state, output, its own forcer,
drafter and generator). A turn:

1. every row `prepare`s its window (pending tokens, forced text, draft); a row
   that stopped leaves and its slot is refilled with the next prompt, prefilled
   on its own (from the KV of the prompts' shared prefix) and written into the
   slot, so a job never waits for its slowest document;
2. one width for the pass (`structspec.decoding.budget.choose_width`): padding
   costs what a token does, so the greedy rows' windows are cut to the width
   with the most expected tokens per unit of pass cost (`RowDecode.fit`: a
   shorter candidate, or a chunk of a long forced run with no logits); sampled
   rows are fed whole. Without a stored curve: the widest window, nothing cut;
3. one target pass over all windows (`structspec.decoding.loop.slot_pass`),
   right-padded to the longest, with explicit positions and a 4-D mask over
   cache slots (`structspec.models.slot_cache`); a greedy row with a tree drafter
   feeds a token tree, its siblings at one position;
   logits only for each row's candidate and bonus positions, and of those only
   the allowed ids' where the FSM allows few (`structspec.decoding.verify.restrict`);
4. one packed bitmask for the full logits rows, applied in one operation;
   greedy rows read one argmax per logits row, sampled rows verify on the CPU
   with their own generator;
5. each row `accept`s; its rejected slots (a chain's tail, a tree's other
   branches) become holes.

A row's tokens equal the row decoded alone (`structspec.decoding.loop`) bit for
bit where the model is batch-invariant (`LM.batch_invariant`: every pass gives
a row the logits it gets alone; its prompt is then prefilled whole, as alone,
not from the shared prefix); elsewhere up to float rounding, as batch shapes
change the order of float sums.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator

from structspec.decoding.budget import choose_width, pass_cost
from structspec.decoding.candidate import DraftRequest
from structspec.decoding.draft_batch import DraftBatch
from structspec.decoding.draft_model import ModelDrafter
from structspec.decoding.drafter import Drafter
from structspec.decoding.loop import decode, slot_pass
from structspec.decoding.row import Decoded, DecodeOptions, RowDecode, RowInput
from structspec.models.protocol import LanguageModel
from structspec.models.slot_cache import SlotCache

def shared_prefix(prompts: list[list[int]]) -> list[int]:
    """The longest token prefix all ``prompts`` share, short of each prompt's last token (which every row
    feeds in its first pass)."""
    if not prompts:
        return []
    n = min(len(p) for p in prompts) - 1
    first = prompts[0]
    for p in prompts[1:]:
        n = next((i for i in range(n) if p[i] != first[i]), n)
    return first[: max(n, 0)]


def decode_batch(
    lm: LanguageModel, rows: Iterator[RowInput], options: DecodeOptions, batch_size: int,
    prefix: list[int] | None = None,
) -> Iterator[tuple[int, Decoded]]:
    """Decode ``rows`` ``batch_size`` at a time; yields ``(index, Decoded)`` as each row stops.

    ``prefix`` (token ids every prompt starts with) is prefilled once and its KV
    copied into every row's prefill. At ``batch_size=1``, and for models with
    sliding-window layers (`LM.batchable` is False), rows run one at a time
    through the single-row loop.
    """
    if batch_size == 1 or not lm.batchable:  # one at a time: no slot mask, and sliding windows stay whole
        for item in rows:
            yield item.index, decode(lm, item, options)
        return
    prefix_cache = None
    if prefix and not lm.batch_invariant:  # invariant rows prefill as they do alone: whole
        prefix_cache = lm.new_cache()
        lm.forward(prefix, prefix_cache)
    queue = iter(rows)
    first = [item for _, item in zip(range(batch_size), queue)]
    index = [item.index for item in first]
    slots = SlotCache(lm.new_cache(), len(first))
    cost = pass_cost(lm)

    drafts: dict[int, DraftBatch] = {}  # by draft LM: one batched draft cache each

    def prefill(slot: int, item: RowInput) -> RowDecode:
        """A new row in ``slot``: its prompt but the last token in the slot's KV (one prefill pass)."""
        t0 = time.perf_counter()
        row = RowDecode.start(item, options, lm, cost)
        ids, reused = item.prompt_ids, len(prefix or []) if prefix_cache is not None else 0
        own = copy.deepcopy(prefix_cache) if prefix_cache is not None else lm.new_cache()
        if len(ids) - 1 > reused:
            lm.forward(ids[reused:-1], own)
        slots.place(slot, len(ids) - 1, own)
        row.prefilled(len(ids) - 1 - reused, time.perf_counter() - t0, reused)
        if drafter := _batchable_drafter(item.drafter):
            batch = drafts.setdefault(id(drafter.lm), DraftBatch(drafter.lm, len(first)))
            batch.reset(slot)
            drafter.attach(batch.row(slot))
        return row

    live: list[RowDecode] = [prefill(slot, item) for slot, item in enumerate(first)]

    while live:
        windows: dict[int, list[int]] = {}
        todo = list(range(len(live)))
        while todo:  # each round drafts one more token for rows waiting on a batched draft pass
            retry = []
            for slot in todo:
                window = live[slot].prepare(len(live))
                if isinstance(window, DraftRequest):  # drafts on once the draft pass below ran
                    retry.append(slot)
                    continue
                if window is not None:
                    windows[slot] = window
                    continue
                yield index[slot], live[slot].decoded()
                if (item := next(queue, None)) is not None:
                    index[slot] = item.index
                    live[slot] = prefill(slot, item)
                    retry.append(slot)
            for batch in drafts.values():
                if batch.wanted:
                    batch.run()
            todo = retry
        if len(windows) < len(live):  # finished rows with nothing to refill leave the batch
            keep = sorted(windows)
            live, index = [live[s] for s in keep], [index[s] for s in keep]
            slots.select(keep)
            for batch in drafts.values():
                batch.select(keep)
            for new, row in enumerate(live):
                if drafter := _batchable_drafter(row.item.drafter):
                    drafter.attach(drafts[id(drafter.lm)].row(new))
            windows = {new: windows[old] for new, old in enumerate(keep)}
        if not live:
            break
        floor = max((len(windows[s]) for s, row in enumerate(live) if row.options.sampling.do_sample), default=1)
        width = choose_width([row.window_gains() for row in live], cost, floor)
        if (cap := lm.max_pass_tokens) is not None:  # the pass feeds every row's window
            width = max(min(width, cap // len(live)), floor)
        slot_pass(lm, slots, [(row, row.fit(width)) for row in live])


def _batchable_drafter(drafter: Drafter | None) -> ModelDrafter | None:
    """The model drafter inside ``drafter`` (itself, or `Composite`'s fallback) if its LM can share batched
    passes; other drafters (prompt lookup, a cross-tokenizer draft model) work row by row."""
    inner = getattr(drafter, "fallback", drafter)
    return inner if isinstance(inner, ModelDrafter) and inner.lm.batchable else None
