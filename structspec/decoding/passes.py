"""One target pass over rows' windows, for both ways a decode keeps its KV cache.

The drivers (`structspec.decoding.loop`, `structspec.decoding.batch`) ask each
row for its `Window`, cut it to what pays, and call `run_pass`: the windows'
masks are filled while the model runs (`structspec.decoding.masks`), the model
computes the logits rows of each window's candidate and bonus positions, and
each row commits its rows (`RowDecode.commit`); the cache then keeps what the
rows kept. Two caches:

- `Cropped`: one row's KV cache of its own, cropped back over a rejected chain's
  tail (what plain decoding's cache does);
- `Slots`: rows' windows packed into one sequence appended to a slot cache
  (`structspec.models.packed_slots.PackedSlots`), with explicit positions and a
  mask over cache slots: a token tree's siblings share a position, rejected
  tokens become holes. Batches and token trees run here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import torch

from structspec.decoding.masks import pass_masks
from structspec.decoding.row import Committed, RowDecode
from structspec.decoding.window import Window
from structspec.models.packed_slots import PackedSlots
from structspec.models.protocol import Allowed, KVCache, LanguageModel


class TargetCache(Protocol):
    """The target's KV cache as a pass sees it: feed windows, then keep what the rows kept."""

    def forward(self, lm: LanguageModel, windows: list[Window], allowed: Allowed) -> torch.Tensor:
        """The logits rows of ``windows`` (their `Window.states`, in order), restricted as ``allowed`` says; the
        windows' KV appended. Changes the cache."""
        ...

    def keep(self, windows: list[Window], kept: list[list[int]]) -> None:
        """Drop each window's KV but its ``kept`` offsets. Changes the cache."""
        ...


@dataclass(frozen=True)
class Cropped:
    """One row's KV cache of its own (``lm.new_cache()``): a window is fed after what it holds, and a chain's
    rejected tail is cropped off."""

    cache: KVCache

    def forward(self, lm: LanguageModel, windows: list[Window], allowed: Allowed) -> torch.Tensor:
        (window,) = windows
        assert not window.chunk, "a row alone is fed its pending tokens whole"
        return lm.forward(window.tokens, self.cache, len(window.states), allowed)

    def keep(self, windows: list[Window], kept: list[list[int]]) -> None:
        (window,), (offsets,) = windows, kept
        if len(offsets) < len(window.tokens):  # a chain keeps a prefix: crop the rest
            self.cache.crop_slots(window.start + len(offsets))


@dataclass(frozen=True)
class Slots:
    """Rows' windows packed into one sequence appended to ``slots``, each token at its position and attending to
    its row's cache slots and its parents in the window; rejected tokens become holes, gathered away when they
    pile up."""

    slots: PackedSlots

    def forward(self, lm: LanguageModel, windows: list[Window], allowed: Allowed) -> torch.Tensor:
        widths = [len(window.tokens) for window in windows]
        starts = [0, *accumulate(widths)][:-1]  # each row's first token in the packed window
        wanted = [(0, start + j) for start, width, window in zip(starts, widths, windows)  # candidate and bonus
                  for j in range(width - len(window.states), width)]
        attend = self.slots.window_mask(widths, [window.parents for window in windows])
        positions = [p for window in windows for p in window.positions]
        return lm.forward_slots([[t for window in windows for t in window.tokens]], [positions], attend,
                                self.slots.kv, wanted, allowed)

    def keep(self, windows: list[Window], kept: list[list[int]]) -> None:
        self.slots.keep(kept, [len(window.tokens) for window in windows])
        self.slots.compact()


def run_pass(lm: LanguageModel, cache: TargetCache, fed: list[tuple[RowDecode, Window]]) -> list[Committed]:
    """One target pass over each row's window (``fed``: each row and its window, maybe cut: `Window.first`), then
    each row's commit of its masked logits rows, in order; the cache keeps what the rows kept. Greedy rows read one
    argmax per logits row (the pass's one read-back); sampled rows verify on the CPU with their own generator, so
    a seed gives the same sample on any device. Each row is charged its share of the pass's seconds. Changes the
    rows and the cache."""
    t0 = time.perf_counter()
    windows = [window for _, window in fed]
    allowed, masks = pass_masks(windows, lm.logits_width, lm.device)  # filled while the model runs where that pays
    t1 = time.perf_counter()
    logits = cache.forward(lm, windows, allowed)
    t2 = time.perf_counter()
    masks.apply(logits)
    if any(window.sampled for window in windows):
        logits, choices = logits.cpu(), None
    else:
        choices = logits.argmax(-1).tolist()
    t3 = time.perf_counter()
    model, constraint = (t2 - t1) / len(fed), (t3 - t2 + t1 - t0) / len(fed)
    committed, r = [], 0
    for row, window in fed:
        n = len(window.states)
        mine = choices[r : r + n] if choices is not None else None
        committed.append(row.commit(window, logits[r : r + n], mine, model, constraint))
        r += n
    cache.keep(windows, [c.kept for c in committed])
    return committed
