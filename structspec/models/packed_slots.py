"""A batch's KV cache as one packed sequence: each pass feeds every row only its own tokens (ragged windows).

A padded batch would feed B rows × the longest window, so one row's long draft
or forced run would pad every other row, and a padded position costs what a
token does. Here the rows' windows are
concatenated into one sequence of N = Σ widths tokens, each at its own row's
positions, appended to one KV sequence that every row shares; ``valid[b, t]``
says which slots row ``b`` may attend to (its prompt and kept tokens, in
order), so a query sees its own row's past and its in-window ancestors and
nothing else: a block-diagonal mask over the packed window. A pass then costs
what the tokens fed cost. Rejected drafts, the slots of rows that left and
refilled rows' old slots are holes; `compact` gathers the used slots to the
front when holes pile up. The table is plain torch on the CPU; the cache is the model's own, moved only through
the `structspec.models.protocol.KVCache` calls (append, gather), so any `LanguageModel` that batches fits.
"""

from __future__ import annotations

import torch

from structspec.models.protocol import KVCache


class PackedSlots:
    """``kv``, the model's KV cache (`LanguageModel.new_cache`, a `KVCache`) holding one sequence of slots,
    and ``valid[b, t]``: whether row ``b`` may attend to slot ``t``."""

    slack = 256  # holes tolerated beyond the used slots before compacting (a gather copies the whole cache)

    def __init__(self, kv: KVCache, rows: int) -> None:
        self.kv = kv
        self.valid = torch.zeros(rows, 0, dtype=torch.bool)
        self.shared: list[torch.Tensor] = []  # per shared prefix (`place_shared`): its slots, kept by `compact`

    @property
    def width(self) -> int:
        """Slots in the cache (used by some row, and holes)."""
        return self.valid.shape[1]

    def place_shared(self, source: KVCache, length: int) -> int:
        """Append the first ``length`` positions of the one-row cache ``source`` as slots no row owns, kept while
        the batch runs (a spec's shared prompt prefix); returns its handle for `place`. Changes the cache and
        the table."""
        start = self.width
        self.kv.append_slots([source], length)
        self._grow(start + length)
        self.shared.append(torch.arange(start, start + length))
        return len(self.shared) - 1

    def place(self, row: int, length: int, source: KVCache | None = None, shared: int | None = None) -> None:
        """Row ``row`` now holds a fresh sequence of ``length`` slots (its old slots become holes): the first
        ``length`` positions of the one-row cache ``source``, appended, or, without one, the last ``length`` slots
        a forward already appended to the cache; ``length`` 0: none, the decode passes feed the row's prompt
        (chunked prefill). ``shared``: the row first attends to that shared prefix (`place_shared`). Changes the
        cache and the table."""
        self.valid[row] = False
        if shared is not None:
            self.valid[row, self.shared[shared]] = True
        if length == 0:
            return
        start = self.width
        if source is not None:
            self.kv.append_slots([source], length)
        self._grow(start + length)
        self.valid[row, start:] = True

    def window_mask(self, widths: list[int], parents: list[list[int]] | None = None) -> torch.Tensor:
        """Bool [1, N, width + N] for one packed window of N = Σ ``widths`` tokens (row ``b``'s tokens after row
        ``b − 1``'s), True where a query may attend: its row's valid slots, then its in-window ancestors and
        itself. ``parents[b][j]``: the offset in row ``b``'s window of token ``j``'s parent (−1: none); by default
        a chain. Changes nothing."""
        total = sum(widths)
        window = torch.zeros(total, total, dtype=torch.bool)
        start = 0
        for b, w in enumerate(widths):
            block = window[start:start + w, start:start + w]  # a view: writing it writes ``window``
            if parents is None:
                block.copy_(torch.ones(w, w, dtype=torch.bool).tril())
            else:  # a token sees what its parent sees, and itself (parents come first in the window)
                for j, p in enumerate(parents[b]):
                    if p >= 0:
                        block[j] = block[p]
                    block[j, j] = True
            start += w
        owner = torch.repeat_interleave(torch.arange(len(widths)), torch.tensor(widths, dtype=torch.long))
        return torch.cat([self.valid[owner], window], dim=1)[None]

    def keep(self, kept: list[int] | list[list[int]], widths: list[int]) -> None:
        """After a pass over one packed window (row ``b``'s ``widths[b]`` tokens after the rows before it): row
        ``b`` keeps the first ``kept[b]`` of its tokens (a chain), or the offsets listed in ``kept[b]`` (a tree's
        verified path); the rest are holes (changes the table)."""
        start = self.width
        self._grow(start + sum(widths))
        for b, n in enumerate(kept):
            offsets = torch.arange(n) if isinstance(n, int) else torch.tensor(n, dtype=torch.long)
            self.valid[b, start + offsets] = True
            start += widths[b]

    def truncate(self, row: int, n: int) -> None:
        """Row ``row`` keeps only its first ``n`` valid slots; the rest become holes (a rollback; changes the
        table)."""
        kept = self.valid[row].nonzero().flatten()
        self.valid[row, kept[n:]] = False

    def select(self, rows: list[int]) -> None:
        """Keep only batch rows ``rows``, in that order (finished rows leave; their slots become holes). Changes
        the table."""
        self.valid = self.valid[rows]

    def compact(self) -> bool:
        """If holes outnumber the slots some row uses (beyond `slack`), move the used slots to the front, in order
        (one gather of the whole cache), and returns True; changes the cache and the table then."""
        used = self.valid.any(0)
        for slots in self.shared:
            used[slots] = True
        count = int(used.sum())
        if self.width <= 2 * count + self.slack:
            return False
        index = used.nonzero().flatten()
        self.kv.gather_slots(index)
        self.valid = self.valid[:, index]
        moved = torch.cumsum(used, 0) - 1  # each used slot's place after the gather
        self.shared = [moved[slots] for slots in self.shared]
        return True

    def _grow(self, width: int) -> None:
        """Widen the table to ``width`` slots with holes (changes the table)."""
        if width > self.width:
            self.valid = torch.cat([self.valid, torch.zeros(len(self.valid), width - self.width, dtype=torch.bool)], 1)
