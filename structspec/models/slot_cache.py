"""A padded batch's KV cache and which of its slots each row may attend to: holes instead of moved KV.

The pass-cost tool's batches of B rows × W tokens (`structspec.tools.pass_cost`); decoding packs its rows into
one sequence instead (`structspec.models.packed_slots`).

A batched pass appends one window of W slots to every row's cache. A row keeps
the slots of the tokens it fed and the target accepted; its padding and its
rejected drafts (a chain's rejected tail, a token tree's other branches) become
holes, masked out for good, so no key or value moves. The hole table is plain
torch on the CPU: the caller copies one mask per pass to the model's device.
"""

from __future__ import annotations

from typing import Any

import torch


class SlotCache:
    """``kv``, the model's KV cache (`LanguageModel.new_cache`: per layer, keys and values [rows, heads, slots,
    d]), and ``valid[b, t]``: whether row ``b`` may attend to slot ``t`` (its kept tokens, in order)."""

    def __init__(self, kv: Any, rows: int) -> None:
        self.kv = kv
        self.valid = torch.zeros(rows, 0, dtype=torch.bool)

    @property
    def width(self) -> int:
        """Slots per row in the cache (kept and holes)."""
        return self.valid.shape[1]

    def window_mask(self, widths: list[int], parents: list[list[int]] | None = None) -> torch.Tensor:
        """Bool [rows, W, width + W], True where query ``j`` of row ``b``'s window may attend: the row's kept
        slots, then its in-window ancestors and itself. ``parents[b][j]`` is the window offset of token ``j``'s
        parent (−1: none, it follows the kept slots); by default a chain (``j − 1``, causal), in a token tree
        siblings share a parent. Padding queries (``j ≥ widths[b]``) see only themselves, so their states stay
        finite. Changes nothing."""
        w = torch.tensor(widths)
        W = int(w.max())
        live = torch.arange(W)[None, :] < w[:, None]  # [rows, W]
        if parents is None:
            window = torch.ones(W, W, dtype=torch.bool).tril() & live[:, :, None] & live[:, None, :]
        else:  # a token sees what its parent sees, and itself (parents come first in the window)
            window = torch.zeros(len(widths), W, W, dtype=torch.bool)
            for b, row in enumerate(parents):
                for j, p in enumerate(row):
                    if p >= 0:
                        window[b, j] = window[b, p]
                    window[b, j, j] = True
        window |= torch.eye(W, dtype=torch.bool) & ~live[:, :, None]
        past = self.valid[:, None, :] & live[:, :, None]
        return torch.cat([past, window], dim=2)

    def keep(self, kept: list[int] | list[list[int]], W: int) -> None:
        """After a pass over windows of ``W`` slots: row ``b`` keeps the first ``kept[b]`` of its window's slots
        (a chain), or the window offsets listed in ``kept[b]`` (a tree's verified path); the rest are holes
        (changes the table)."""
        start = self.width
        self._grow(start + W)
        for b, n in enumerate(kept):
            offsets = torch.arange(n) if isinstance(n, int) else torch.tensor(n, dtype=torch.long)
            self.valid[b, start + offsets] = True

    def _grow(self, width: int) -> None:
        """Widen every row of the table to at least ``width`` slots with holes (changes the table)."""
        if width > self.width:
            self.valid = torch.cat([self.valid, torch.zeros(len(self.valid), width - self.width, dtype=torch.bool)], 1)

