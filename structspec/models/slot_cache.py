"""A padded batch's KV cache and which of its slots each row may attend to: holes instead of moved KV.

The pass-cost tool's batches of B rows × W tokens (`structspec.tools.pass_cost`); decoding packs its rows into
one sequence instead (`structspec.models.packed_slots`). It moves the transformers LM's key and value tensors
itself ([rows, heads, slots, d] per layer), so it serves that model only.

A batched pass appends one window of W slots to every row's cache. A row keeps
the slots of the tokens it fed and the target accepted; its padding and its
rejected drafts (a chain's rejected tail, a token tree's other branches) become
holes, masked out for good, so no key or value moves on the hot path.
`compact` gathers the kept slots to the front when holes pile up. The hole
table is plain torch on the CPU: the driver copies one mask per pass to the
model's device.
"""

from __future__ import annotations

from typing import Any

import torch


class SlotCache:
    """``kv``, the model's KV cache (`LanguageModel.new_cache`: per layer, keys and values [rows, heads, slots,
    d]), and ``valid[b, t]``: whether row ``b`` may attend to slot ``t`` (its kept tokens, in order)."""

    slack = 64  # holes tolerated beyond the kept slots before compacting (a gather copies the whole cache)

    def __init__(self, kv: Any, rows: int) -> None:
        self.kv = kv
        self.valid = torch.zeros(rows, 0, dtype=torch.bool)

    @property
    def width(self) -> int:
        """Slots per row in the cache (kept and holes)."""
        return self.valid.shape[1]

    def place(self, row: int, length: int, source: Any = None) -> None:
        """Row ``row`` now holds a fresh sequence in slots ``[0, length)`` (refill): the first ``length`` positions
        of the one-row cache ``source``, copied in (every row widened with holes if needed), or, without one,
        what a pass already wrote there. Changes the cache and the table."""
        if source is not None:
            _copy_row(self.kv, len(self.valid), row, source, length)
        self._grow(length)
        self.valid[row] = False
        self.valid[row, :length] = True

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

    def truncate(self, row: int, n: int) -> None:
        """Row ``row`` keeps only its first ``n`` kept slots; the rest become holes (a rollback; changes
        the table)."""
        kept = self.valid[row].nonzero().flatten()
        self.valid[row, kept[n:]] = False

    def select(self, rows: list[int]) -> None:
        """Keep only batch rows ``rows``, in that order (finished rows leave the batch). Changes the cache and the
        table."""
        for layer in self.kv.layers:
            if layer.is_initialized:
                index = torch.tensor(rows, dtype=torch.long, device=layer.keys.device)
                layer.keys, layer.values = layer.keys[index], layer.values[index]
        self.valid = self.valid[rows]

    def compact(self) -> bool:
        """If holes outnumber kept slots (beyond `slack`), move every row's kept slots to the front, in order, in
        the cache (one gather of the whole cache) and the table; returns whether it did. Changes both then."""
        counts = self.valid.sum(1)
        longest = int(counts.max()) if len(counts) else 0
        if self.width <= 2 * longest + self.slack:
            return False
        # stable sort puts kept slots first, in their order; the tail of each row points at holes
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :longest]  # [rows, longest]
        for layer in self.kv.layers:
            if layer.is_initialized:
                i = order.to(layer.keys.device)[:, None, :, None]
                layer.keys = layer.keys.gather(2, i.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
                layer.values = layer.values.gather(2, i.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))
        self.valid = torch.arange(longest)[None, :] < counts[:, None]
        return True

    def _grow(self, width: int) -> None:
        """Widen every row of the table to at least ``width`` slots with holes (changes the table)."""
        if width > self.width:
            self.valid = torch.cat([self.valid, torch.zeros(len(self.valid), width - self.width, dtype=torch.bool)], 1)


def _copy_row(kv: Any, rows: int, row: int, source: Any, length: int) -> None:
    """Copy the first ``length`` positions of the one-row cache ``source`` into row ``row`` of the ``rows``-row
    cache ``kv`` (slots ``[0, length)``), widening every row with empty slots if needed (changes ``kv``)."""
    if length == 0:
        return
    for dst, src in zip(kv.layers, source.layers):
        k, v = src.keys[:, :, :length], src.values[:, :, :length]
        if not dst.is_initialized:
            dst.lazy_initialization(k, v)
            dst.keys = k.new_zeros((rows, *k.shape[1:]))
            dst.values = v.new_zeros((rows, *v.shape[1:]))
        if dst.keys.shape[2] < length:
            grow = (0, 0, 0, length - dst.keys.shape[2])
            dst.keys = torch.nn.functional.pad(dst.keys, grow)
            dst.values = torch.nn.functional.pad(dst.values, grow)
        dst.keys[row, :, :length] = k[0]
        dst.values[row, :, :length] = v[0]
