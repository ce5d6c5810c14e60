"""How many tokens a draft should have: the tokens a verify pass is expected to keep against what it costs.

A target pass costs a fixed part (reading the weights, launching kernels) plus
a part per fed token (the matrix products). On a GPU the per-token part is
close to nothing up to hundreds of tokens, so long drafts are free; on a CPU a
fed token costs a sizeable share of a pass, and a 10-token draft of which two
are kept makes a pass slower than it saves. In a batch the fixed part is shared
and the tokens of every row add up, so a row's drafts should be shorter still.
`PassCost` is that curve, per batch size, measured once per model, dtype and
device by ``structspec pass-cost --store`` (free tokens until then: the
drafter's own lengths); `DraftLength` learns, per row, how often the i-th drafted token is
accepted once the ones before it were, and drafts the length with the most
expected output tokens per unit of the row's share of the pass.

A batched pass is as wide as its longest window, and a padded position costs
as much as a fed one. `choose_width` picks one width per pass for the batch as
a whole: the tokens every row is expected to add to its cache (a greedy row's
window cut to the width, `structspec.decoding.row.RowDecode.fit`) per unit of
the whole pass's cost. Without a stored curve that is the widest window, as if
no row were cut. Greedy rows still draft for the batch they share (`choose`
with its row count), not as if alone: longer drafts would give the width more
to fill padding with, but on SmolLM2's extraction tasks that saved under 1% of
pass cost, and a model drafter would spend draft passes on tokens then cut.

No clock is read while decoding, and the choice depends only on the row's own
history, the stored curve and, for greedy rows, how many rows share the pass.
A sampled row always chooses as if alone and is never cut, so a seed
reproduces its sample in any batch and at every run; a greedy row's output
never depends on its drafts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from structspec.cache import cache_dir, write_atomic
from structspec.models.protocol import LanguageModel

PRIOR = (2.0, 1.0)  # pseudo-counts (accepted, rejected) of every position: an untried length looks decent


Points = tuple[tuple[int, float], ...]  # (tokens fed per row, seconds relative to one row's one-token pass)


@dataclass(frozen=True)
class PassCost:
    """Seconds of a pass against tokens fed per row, relative to one row's one-token pass: one curve per
    measured batch size (``curves[rows]``), linear between its points and along its last slope beyond."""

    curves: dict[int, Points]

    @classmethod
    def linear(cls, per_token: float) -> PassCost:
        """One row: a one-token pass 1.0, each more token ``per_token`` (no batch curves)."""
        return cls({1: ((1, 1.0), (2, 1.0 + per_token))})

    def __call__(self, fed: int, rows: int = 1) -> float:
        """A row's share of a pass where ``rows`` rows are fed ``fed`` tokens each: the whole pass's cost,
        linear in the row count between the two nearest measured batch sizes, divided by ``rows``; past the
        largest measured size, that size's share. Changes nothing."""
        sizes = sorted(self.curves)
        below = max((n for n in sizes if n <= rows), default=sizes[0])
        above = min((n for n in sizes if n >= rows), default=sizes[-1])
        if below == above:  # a measured size, or outside the measured ones
            return self._whole(below, fed) / below
        low, high = self._whole(below, fed), self._whole(above, fed)
        return (low + (high - low) * (rows - below) / (above - below)) / rows

    def _whole(self, size: int, fed: int) -> float:
        """The cost of a pass of ``size`` rows fed ``fed`` tokens each, on that size's curve: linear between its
        points and along its last slope beyond."""
        pts = self.curves[size]
        for i in range(1, len(pts)):
            if fed <= pts[i][0] or i == len(pts) - 1:  # between two points, or past the last one
                (n0, c0), (n1, c1) = pts[i - 1], pts[i]
                return c0 + (c1 - c0) * (fed - n0) / (n1 - n0)
        return pts[0][1]  # a single point: flat


# Until a curve is stored, a fed token costs nothing: drafts are as long as the drafter makes them. Measured
# on this CPU at B = 1 (README), the stored curves drafted shorter and lost time on both shipped models: the
# choice does not yet count the forced text a finished draft lets the candidate splice in after it.
DEFAULT_COST = PassCost.linear(0.0)


def choose_width(gains: list[list[float]], cost: PassCost, floor: int = 1) -> int:
    """The width ``W ≥ floor`` of one pass over ``len(gains)`` rows with the most expected tokens added to the
    rows' caches per unit of the whole pass's cost (``cost(W, rows) × rows``: padding costs what a token
    does). ``gains[b][w − 1]``: row ``b``'s expected tokens when fed its window's first ``w`` tokens; past its
    window, its whole window's. Ties go to the wider, so a flat curve (`DEFAULT_COST`) picks the widest window
    and cuts no row. Changes nothing."""
    rows, widest = len(gains), max(len(g) for g in gains)
    best, best_value = widest, 0.0
    for width in range(floor, widest + 1):
        value = sum(g[min(width, len(g)) - 1] for g in gains) / (cost(width, rows) * rows)
        if value >= best_value:
            best, best_value = width, value
    return best


def curve_path(lm: LanguageModel) -> Path | None:
    """Where ``lm``'s stored curve lives (``$STRUCTSPEC_CACHE/pass-cost``, by name, dtype, device type and
    kernels); None for a model without a name. Changes nothing."""
    name, device, dtype = lm.name, lm.device, lm.dtype
    if not name:
        return None
    packed = "-onednn" if lm.kernels == "onednn" else ""  # another curve entirely
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{name}-{str(dtype).removeprefix('torch.')}-{device.type}{packed}")
    return cache_dir("pass-cost") / f"{key}.json"


def pass_cost(lm: LanguageModel) -> PassCost:
    """``lm``'s stored curves, else `DEFAULT_COST`. Reads the cache; changes nothing."""
    path = curve_path(lm)
    if path is not None and path.exists():
        stored = json.loads(path.read_text())["curves"]
        return PassCost({int(rows): tuple((int(n), float(c)) for n, c in pts) for rows, pts in stored.items()})
    return DEFAULT_COST


def store_pass_cost(lm: LanguageModel, seconds: dict[tuple[int, int], float]) -> Path:
    """Store ``lm``'s curves from measured ``seconds`` per pass by (rows, tokens fed per row); must include
    one row's one-token pass. Later decoding with the model drafts by them. Writes the cache."""
    path = curve_path(lm)
    if path is None or (1, 1) not in seconds:
        raise ValueError("curves are stored for a named model on a device, and need one row's one-token pass")
    capped: dict[tuple[int, int], float] = {}
    cheapest: dict[int, float] = {}  # per row count: the cheapest pass at least as wide as the current one
    for rows, fed in sorted(seconds, reverse=True):
        # A pass never costs more than a wider one: a slow outlier (a stall, a page fault) would otherwise
        # make drafting avoid that width for good, so each point is capped by the cheapest wider one.
        capped[rows, fed] = cheapest[rows] = min(seconds[rows, fed], cheapest.get(rows, float("inf")))
    curves: dict[int, list[tuple[int, float]]] = {}
    for rows, fed in sorted(capped):  # the unit stays one row's one-token pass, capped too
        curves.setdefault(rows, []).append((fed, capped[rows, fed] / capped[1, 1]))
    raw = {f"{rows}x{fed}": s for (rows, fed), s in seconds.items()}
    write_atomic(path, json.dumps({"curves": curves, "seconds": raw}).encode())
    return path


@dataclass
class DraftLength:
    """Per-row acceptance of drafted tokens by position, and the draft length it pays to ask for.

    ``tried[i]``: candidates whose drafted token ``i`` (0-based, drafter tokens
    only: spliced forced text is nearly always accepted and not counted) was
    verified with every drafted token before it accepted; ``kept[i]``: of those,
    how many kept it.
    """

    cost: PassCost
    tried: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)

    def choose(self, fed: int, cap: int, rows: int = 1) -> int:
        """The draft length in ``[0, cap]`` maximizing (1 + expected accepted) / the row's share of a pass of
        ``rows`` rows, where ``fed`` tokens go into the pass besides the draft. Changes nothing."""
        best, best_value = 0, 1.0 / self.cost(fed, rows)
        expected, survive = 0.0, 1.0
        for k in range(1, cap + 1):
            survive *= self.hazard(k - 1)
            expected += survive
            value = (1.0 + expected) / self.cost(fed + k, rows)
            if value > best_value:
                best, best_value = k, value
        return best

    def expected_kept(self, parents: list[int], drafted: list[bool]) -> list[float]:
        """Expected tokens a verify pass keeps of a candidate (a chain or a token tree, ``parents[i]``: node
        ``i``'s parent, −1 the root) fed only its first ``n`` nodes, for each ``n`` (entry ``n − 1``): the best
        path's expected accepted prefix, where the drafter's ``k``-th token on a path (``drafted[i]``) is kept
        with chance `hazard` ``(k)`` and spliced forced text always (it nearly always is). Changes nothing."""
        survive: list[float] = []  # per node: the chance the path to it is kept whole
        expected: list[float] = []  # per node: the path's expected kept tokens
        depth: list[int] = []  # per node: the drafter's tokens on the path to it
        out: list[float] = []
        for i, p in enumerate(parents):
            above = depth[p] if p >= 0 else 0
            survive.append((survive[p] if p >= 0 else 1.0) * (self.hazard(above) if drafted[i] else 1.0))
            expected.append((expected[p] if p >= 0 else 0.0) + survive[i])
            depth.append(above + drafted[i])
            out.append(max(expected[i], out[-1] if out else 0.0))
        return out

    def hazard(self, i: int) -> float:
        """Estimated chance that drafted token ``i`` is accepted given the ones before it were."""
        tried, kept = (self.tried[i], self.kept[i]) if i < len(self.tried) else (0, 0)
        return (kept + PRIOR[0]) / (tried + PRIOR[0] + PRIOR[1])

    def record(self, drafted: int, accepted: int) -> None:
        """One verified candidate had ``drafted`` drafter tokens, of which the first ``accepted`` were kept
        (changes the counts)."""
        reached = min(accepted + 1, drafted)  # positions verified with all drafted tokens before them kept
        if len(self.tried) < reached:
            self.tried += [0] * (reached - len(self.tried))
            self.kept += [0] * (reached - len(self.kept))
        for i in range(reached):
            self.tried[i] += 1
            self.kept[i] += i < accepted
