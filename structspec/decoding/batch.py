"""Decoding many rows per target pass, with continuous batching and ragged windows.

Each row is a `RowDecode` (plain values: FSM state, output, its own forcer,
drafter and generator). A turn:

1. every row `prepare`s its window (pending tokens, forced text, draft, drafted
   as if the row were alone: a frozen `structspec.decoding.window.Window`); a row
   that stopped hands back its `Decoded` and leaves, and its slot is refilled
   with the next prompt (`decode_batch`'s ``prefill``: chunked into the decode
   passes, or from its spec's shared prefix, or in a prefill pass of its own), so
   a job never waits for its slowest document;
2. each row's tokens in the pass (`structspec.decoding.cost.choose_widths`):
   its pending tokens at least (a sampled row its whole window), then the
   drafted and spliced tokens whose expected kept tokens pay for what they add
   to the pass on the model's pass-cost curve (``cost``, the caller's read of
   `structspec.decoding.cost.pass_cost`); a greedy row's window is cut to
   them (`Window.first`); the model's `max_pass_tokens` bounds the pass;
3. one target pass over all windows packed into one sequence
   (`structspec.decoding.passes.run_pass` on `Slots`): explicit positions, a block-diagonal
   mask over the shared slot cache (`structspec.models.packed_slots`), no
   padding; a greedy row with a tree drafter feeds a token tree, its siblings at
   one position; logits only for each row's candidate and bonus positions, and of
   those only the allowed ids' where the FSM allows few
   (`structspec.decoding.masks.restrict`);
4. one packed bitmask for the full logits rows, filled while the model runs
   where that pays (`structspec.decoding.masks.MaskFill`), applied in one
   operation; greedy rows read one argmax per logits row, sampled rows verify on
   the CPU with their own generator;
5. each row `commit`s its logits rows (verify, accept, record the pass); its
   rejected slots (a chain's tail, a tree's other branches) become holes.

A row's tokens equal the row decoded alone (`structspec.decoding.loop`) bit for
bit where the model is batch-invariant (`LM.batch_invariant`: every pass gives
a row the logits it gets alone; its prompt is then prefilled as alone: in the
decode passes where it fits `max_pass_tokens`, whose passes compute it as the
row alone's prefill does, else on the chunk grid in a prefill of its own, its held chunks reused:
`structspec.models.prefix_cache`); elsewhere up to
float rounding, as batch shapes change the order of float sums.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from structspec.decoding.cost import DraftLength, PassCost, choose_widths
from structspec.decoding.candidate import DraftRequest
from structspec.decoding.drafters.draft_batch import DraftBatch
from structspec.decoding.drafters.draft_model import DraftModel
from structspec.decoding.drafter import Drafter
from structspec.decoding.loop import decode
from structspec.decoding.passes import Slots, run_pass
from structspec.decoding.row import Decoded, DecodeOptions, RowDecode, RowInput
from structspec.decoding.window import Window
from structspec.models.protocol import LanguageModel
from structspec.models.packed_slots import PackedSlots
from structspec.models.prefix_cache import prefill_prompt

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


def spec_prefixes(rows: list[RowInput]) -> dict[int, list[int]]:
    """Per FSM (by ``id``) that two or more of ``rows`` decode under: the longest token prefix of their prompts
    (`shared_prefix`). Changes nothing."""
    prompts: dict[int, list[list[int]]] = {}
    for row in rows:
        prompts.setdefault(id(row.fsm), []).append(row.prompt_ids)
    return {fsm: prefix for fsm, group in prompts.items() if len(group) > 1 and (prefix := shared_prefix(group))}


def decode_batch(
    lm: LanguageModel, rows: Iterator[RowInput], options: DecodeOptions, batch_size: int, cost: PassCost,
    prefixes: dict[int, list[int]] | None = None,
) -> Iterator[tuple[int, Decoded]]:
    """Decode ``rows`` ``batch_size`` at a time by the model's pass-cost curve ``cost``; yields ``(index,
    Decoded)`` as each row stops.

    ``prefixes``: per FSM (by ``id``), token ids every prompt of that spec starts
    with; where rows may prefill apart from the row alone (the model is not
    batch-invariant) each is prefilled once, its KV held in shared slots that
    every row of that spec attends to. At ``batch_size=1``, and for models with
    sliding-window layers (`LM.batchable` is False), rows run one at a time
    through the single-row loop.
    """
    pool = DraftLength(cost)  # every row's verdicts on its drafts: the prior a new row's draft lengths start from
    if batch_size == 1 or not lm.batchable:  # one at a time: no slot mask, and sliding windows stay whole
        for item in rows:
            yield item.index, decode(lm, item, options, cost, pool)
        return
    queue = iter(rows)
    items = [item for _, item in zip(range(batch_size), queue)]
    size = len(items)  # the batch's rows, before finished rows leave it
    slots = PackedSlots(lm.new_cache(), size)
    shared: dict[int, int] = {}  # per FSM id: its prefix's handle in the slots (`PackedSlots.place_shared`)

    drafts: dict[int, DraftBatch] = {}  # by draft LM: one batched draft cache each

    def prefill(slot: int, item: RowInput) -> RowDecode:
        """A new row in ``slot``. Its prompt but the last token goes in by one of three ways: fed in chunks by the
        decode passes (chunked prefill: where that computes it as the row alone does, or the model promises no
        more than rounding); its spec's shared prefix slots and then chunks (a prefix of that spec, on a model that
        is not batch-invariant); or, on a batch-invariant model, a prefill pass of its own, whole, as alone."""
        t0 = time.perf_counter()
        row = RowDecode.start(item, options, lm, cost, pool)
        ids = item.prompt_ids
        prefix = (prefixes or {}).get(id(item.fsm), []) if not lm.batch_invariant else []
        if prefix and id(item.fsm) not in shared:  # the spec's first row: its prefix prefilled once, then shared
            kv = lm.new_cache()
            lm.forward(prefix, kv)
            shared[id(item.fsm)] = slots.place_shared(kv, len(prefix))
        if prefix:
            slots.place(slot, 0, shared=shared[id(item.fsm)])
            row.prefilled(0, time.perf_counter() - t0, len(prefix))
        elif not lm.batch_invariant or (lm.max_pass_tokens or 0) >= len(ids) - 1:
            slots.place(slot, 0)  # the decode passes feed the whole prompt
        else:
            own = lm.new_cache()
            reused = prefill_prompt(lm, ids[:-1], own)  # on the chunk grid, as alone
            slots.place(slot, len(ids) - 1, own)
            row.prefilled(len(ids) - 1 - reused, time.perf_counter() - t0, reused)
        if drafter := _batchable_drafter(item.drafter):
            batch = drafts.setdefault(id(drafter.lm), DraftBatch(drafter.lm, size))
            batch.reset(slot)
            drafter.attach(batch.row(slot))
        return row

    live: list[RowDecode] = [prefill(slot, item) for slot, item in enumerate(items)]

    while live:
        windows: dict[int, Window] = {}
        todo = list(range(len(live)))
        while todo:  # each round drafts one more token for rows waiting on a batched draft pass
            retry = []
            for slot in todo:
                window = live[slot].prepare()
                if isinstance(window, DraftRequest):  # drafts on once the draft pass below ran
                    retry.append(slot)
                    continue
                if isinstance(window, Window):
                    windows[slot] = window
                    continue
                yield items[slot].index, window  # the row stopped: its `Decoded`
                if (item := next(queue, None)) is not None:
                    items[slot] = item
                    live[slot] = prefill(slot, item)
                    retry.append(slot)
            for batch in drafts.values():
                if batch.wanted:
                    batch.run()
            todo = retry
        if len(windows) < len(live):  # finished rows with nothing to refill leave the batch
            keep = sorted(windows)
            live, items = [live[s] for s in keep], [items[s] for s in keep]
            slots.select(keep)
            for batch in drafts.values():
                batch.select(keep)
            for new, item in enumerate(items):
                if drafter := _batchable_drafter(item.drafter):
                    drafter.attach(drafts[id(drafter.lm)].row(new))
            windows = {new: windows[old] for new, old in enumerate(keep)}
        if not live:
            break
        offered = [windows[s] for s in range(len(live))]
        floors = _floors(offered, lm.max_pass_tokens)
        widths = choose_widths([list(w.gains) for w in offered], cost, floors, lm.max_pass_tokens)
        run_pass(lm, Slots(slots), [(row, window.first(width)) for row, window, width in zip(live, offered, widths)])


def _floors(windows: list[Window], cap: int | None) -> list[int]:
    """The tokens each window is fed at least (`Window.floor`), cut longest first to fit ``cap`` in all, a
    greedy row's only, one token each at least. Changes nothing."""
    floors = [window.floor for window in windows]
    excess = sum(floors) - cap if cap is not None else 0
    for b in sorted(range(len(windows)), key=lambda b: -floors[b]):
        if excess <= 0:
            break
        if not windows[b].sampled:
            cut = min(excess, floors[b] - 1)
            floors[b], excess = floors[b] - cut, excess - cut
    return floors


def _batchable_drafter(drafter: Drafter | None) -> DraftModel | None:
    """The draft model inside ``drafter`` (itself, or `Composite`'s fallback; the target's tokenizer or another)
    if its LM can share batched passes; other drafters (prompt lookup, trees) work row by row."""
    inner = getattr(drafter, "fallback", drafter)
    return inner if isinstance(inner, DraftModel) and inner.lm.batchable else None
