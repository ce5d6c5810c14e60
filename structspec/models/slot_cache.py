"""Which KV-cache slots each row of a batch may attend to: holes instead of moved KV.

A batched pass appends one window of W slots to every row's cache. A row keeps
the slots of the tokens it fed and the target accepted; its padding and its
rejected drafts (a chain's rejected tail, a token tree's other branches) become
holes, masked out for good, so no key or value moves on the hot path.
`compaction` gathers the kept slots to the front when holes pile up.
Plain torch on the CPU: the driver copies one mask per pass to the model's device.
"""

from __future__ import annotations

import torch


class Slots:
    """``valid[b, t]``: whether row ``b`` may attend to cache slot ``t`` (its kept tokens, in order)."""

    slack = 64  # holes tolerated beyond the kept slots before compacting (a gather copies the whole cache)

    def __init__(self, rows: int) -> None:
        self.valid = torch.zeros(rows, 0, dtype=torch.bool)

    @property
    def width(self) -> int:
        """Slots per row in the cache (kept and holes)."""
        return self.valid.shape[1]

    def place(self, row: int, length: int) -> None:
        """Row ``row`` now holds a fresh sequence in slots ``[0, length)`` (refill); changes the table."""
        self.grow(length)
        self.valid[row] = False
        self.valid[row, :length] = True

    def grow(self, width: int) -> None:
        """Widen every row to at least ``width`` slots with holes (changes the table)."""
        if width > self.width:
            self.valid = torch.cat([self.valid, torch.zeros(len(self.valid), width - self.width, dtype=torch.bool)], 1)

    def window_mask(self, widths: list[int], parents: list[list[int]] | None = None) -> torch.Tensor:
        """Bool [rows, W, width + W], True where query ``j`` of row ``b``'s window may attend: the row's kept
        slots, then its in-window ancestors and itself. ``parents[b][j]`` is the window offset of token ``j``'s
        parent (−1: none, it follows the kept slots); by default a chain (``j − 1``, causal), in a token tree
        siblings share a parent. Padding queries (``j ≥ widths[b]``) see only themselves, so their states stay
        finite. Does not change the table."""
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
        self.grow(start + W)
        for b, n in enumerate(kept):
            offsets = torch.arange(n) if isinstance(n, int) else torch.tensor(n, dtype=torch.long)
            self.valid[b, start + offsets] = True

    def truncate(self, row: int, n: int) -> None:
        """Row ``row`` keeps only its first ``n`` kept slots; the rest become holes (a rollback; changes
        the table)."""
        kept = self.valid[row].nonzero().flatten()
        self.valid[row, kept[n:]] = False

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in that order), as the cache does when finished rows leave the batch."""
        self.valid = self.valid[rows]

    def compaction(self) -> torch.Tensor | None:
        """If holes outnumber kept slots, the gather index [rows, new width] that moves every row's kept slots
        to the front (and the table is rewritten to match); else None. The caller gathers the cache with it."""
        counts = self.valid.sum(1)
        longest = int(counts.max()) if len(counts) else 0
        if self.width <= 2 * longest + self.slack:
            return None
        # stable sort puts kept slots first, in their order; the tail of each row points at holes
        order = torch.sort((~self.valid).to(torch.int8), dim=1, stable=True).indices[:, :longest]
        self.valid = torch.arange(longest)[None, :] < counts[:, None]
        return order
