"""One draft model's KV cache shared by every row of a batch, fed in one draft pass per round.

A model drafter of a batched row (`ModelDrafter`, self-draft, and staged
speculation's `StagedDrafter`) draws its logits from a `DraftRow` of this
cache. When they are not computed yet the row answers a `DraftRequest`, which
the drafter returns and `RowDecode.prepare` hands to the batch driver; it runs
one draft pass for every row that asked and calls `RowDecode.prepare` again,
which drafts on from where the chain stopped. The cache is packed as the
target's is (`structspec.models.packed_slots`): a draft pass feeds only the
asking rows' new tokens (a staged row's guess with them), in one sequence, and
rows' rejected drafts become holes.
"""

from __future__ import annotations

from itertools import accumulate

import torch

from structspec.decoding.candidate import DraftRequest
from structspec.models.packed_slots import PackedSlots
from structspec.models.protocol import LanguageModel

_PREFILL_ALONE = 32  # a row with more new tokens than this (a fresh prompt) is prefilled on its own


class DraftBatch:
    """The draft LM's cache over rows ``0..rows-1``: what each row fed (``seen``) and the logits its last pass
    computed (``last``: the first context length they follow, and the logits rows from there)."""

    def __init__(self, lm: LanguageModel, rows: int) -> None:
        self.lm = lm
        self.slots = PackedSlots(lm.new_cache(), rows)
        self.seen: list[list[int]] = [[] for _ in range(rows)]
        self.last: list[tuple[int, torch.Tensor] | None] = [None] * rows
        self.wanted: dict[int, tuple[list[int], int]] = {}  # row -> (context, start) for the next `run`
        self.passes = [0] * rows  # draft passes each row took so far

    def row(self, row: int) -> DraftRow:
        """Row ``row``'s view, a model drafter's logits source. Changes nothing."""
        return DraftRow(self, row)

    def logits_along(self, row: int, context: list[int], start: int) -> torch.Tensor | DraftRequest:
        """Logits after ``context[:i]`` for each ``i`` in ``start..len(context)`` [len(context) − start + 1, vocab]
        if this row's last pass computed them (a fresh tensor); else a `DraftRequest`, recorded for the next `run`
        (changes the requests)."""
        last = self.last[row]
        if last is not None and self.seen[row] == context and last[0] <= start:
            return last[1][start - last[0]:].clone()
        self.wanted[row] = (list(context), start)
        return DraftRequest()

    def run(self) -> None:
        """One draft pass over the requested rows' new tokens, packed into one sequence (the other rows feed
        nothing), plus a prefill for rows with a fresh prompt, each counted in the row's `passes`. Changes the
        cache."""
        windows: list[list[int]] = []
        positions: list[int] = []
        for row in range(len(self.seen)):
            if row not in self.wanted:
                windows.append([])
                continue
            context, start = self.wanted[row]
            seen = self.seen[row]
            n = next((i for i, (a, b) in enumerate(zip(seen, context)) if a != b), min(len(seen), len(context)))
            n = min(n, start - 1)  # logits after context[:start] come from position start − 1, fed again if cached
            self.passes[row] += 1
            if len(context) - n > _PREFILL_ALONE:
                self._prefill(row, context[:start - 1])
                self.passes[row] += 1
                n = start - 1
            else:
                self.slots.truncate(row, n)
            windows.append(context[n:])
            positions += range(n, len(context))
        widths = [len(w) for w in windows]
        ends = list(accumulate(widths))
        wanted = sorted(self.wanted)
        counts = [len(self.wanted[row][0]) - self.wanted[row][1] + 1 for row in wanted]  # logits rows per row
        logits = self.lm.forward_slots([[t for w in windows for t in w]], [positions], self.slots.window_mask(widths),
                                       self.slots.kv, [(0, j) for row, k in zip(wanted, counts)
                                                       for j in range(ends[row] - k, ends[row])])
        self.slots.keep(widths, widths)
        for row, rows in zip(wanted, logits.split(counts)):
            context, start = self.wanted[row]
            self.seen[row], self.last[row] = context, (start, rows)
        self.wanted.clear()
        self.slots.compact()

    def _prefill(self, row: int, tokens: list[int]) -> None:
        own = self.lm.new_cache()
        self.lm.forward(tokens, own)
        self.slots.place(row, len(tokens), own)

    def reset(self, row: int) -> None:
        """Row ``row`` starts a new prompt: nothing of the old one is kept (changes the table)."""
        self.slots.place(row, 0)
        self.seen[row], self.last[row] = [], None

    def select(self, rows: list[int]) -> None:
        """Keep only batch rows ``rows``, as the target's slots do (changes the table; the rows that left leave
        holes)."""
        self.slots.select(rows)
        self.seen = [self.seen[r] for r in rows]
        self.last = [self.last[r] for r in rows]
        self.passes = [self.passes[r] for r in rows]


class DraftRow:
    """One row's view of a `DraftBatch`, as a model drafter's logits source (`DraftContext`)."""

    def __init__(self, batch: DraftBatch, row: int) -> None:
        self.batch, self.index = batch, row

    @property
    def passes(self) -> int:
        """Draft passes this row took so far (the batch runs them)."""
        return self.batch.passes[self.index]

    def logits_along(self, context: list[int], start: int) -> torch.Tensor | DraftRequest:
        """As `DraftBatch.logits_along` for this row (records a request where the logits are not computed)."""
        return self.batch.logits_along(self.index, context, start)

