"""How many tokens a draft should have: the tokens a verify pass is expected to keep against what it costs.

A target pass costs a fixed part (reading the weights, launching kernels) plus
a part per fed token (the matrix products). On a GPU the per-token part is
close to nothing up to hundreds of tokens, so long drafts are free; on a CPU a
fed token costs a sizeable share of a pass, and a 10-token draft of which two
are kept makes a pass slower than it saves. In a batch the fixed part is shared
and the tokens of every row add up, so a row's drafts should be shorter still.
`PassCost` is that curve. `DraftLength` learns, per row, how often the i-th drafted token is accepted once
the ones before it were; with padded curves stored by ``structspec pass-cost --store`` (opt-in) it asks the
drafter for the length with the most expected output tokens per unit of the row's share of the pass.

A pass packs every row's window into one sequence
(`structspec.models.packed_slots`), so it costs what the tokens fed cost, not
rows × the longest window; a row alone is a batch of one. `choose_widths` cuts each greedy row's window
to the length whose expected kept tokens — drafted ones and the forced text a finished value lets the candidate
splice in after them — pay for what they add to the pass, on the packed curve: the cost of a pass against the
tokens it feeds, measured for the model, dtype, device, kernels and threads by an explicit calibration
(`structspec.decoding.calibrate`, ``structspec calibrate``) and stored beside the padded curves. Where drafted
tokens cost more than they keep, every row is fed its pending tokens only: plain masked decoding's pass, the
crossover where drafting turns itself off. A model without a stored curve drafts by `DEFAULT_COST`.

No clock is read while decoding and nothing is measured: a run's passes depend only on the stored curves, and a
sampled row's draft only on its own history and the stored curve: it always chooses as if alone and is never
cut, so a seed reproduces its sample in any batch and at every run. A greedy row's output never depends on its
drafts, so cutting it by a measured curve changes passes, not tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

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


DEFAULT_COST = PassCost.linear(0.0)
"""The curve of a model without a stored one (never calibrated, or nameless): a fed token costs nothing, so
drafts are as long as the drafter makes them and a pass feeds them whole (what a GPU's pass costs, up to hundreds
of tokens; on a CPU, calibrate: ``structspec calibrate --model NAME``)."""


def choose_widths(gains: list[list[float]], cost: PassCost, floors: list[int], cap: int | None = None) -> list[int]:
    """Each row's tokens fed in one packed pass: from ``floors[b]`` up, the extension with the most expected tokens
    per fed token first, taken while the pass's expected tokens per unit of its cost (``cost(total tokens)``, a
    packed curve: `structspec.decoding.calibrate.packed_cost`) do not fall, ``cap`` tokens in all at most.
    ``gains[b][w − 1]``: row ``b``'s expected tokens when fed its window's first ``w`` tokens. Ties go to the
    wider, so a flat curve (`DEFAULT_COST`) feeds every window whole. Changes nothing."""
    widths = list(floors)
    total, got = sum(widths), sum(g[w - 1] for g, w in zip(gains, widths))

    def best(b: int) -> tuple[float, int]:
        """Row ``b``'s best extension from its width under the cap: (expected tokens per fed token, tokens)."""
        g, w = gains[b], widths[b]
        most = len(g) - w if cap is None else min(len(g) - w, cap - total)
        return max((((g[w + e - 1] - g[w - 1]) / e, e) for e in range(1, most + 1)), default=(-1.0, 0))

    offers = [best(b) for b in range(len(gains))]
    while True:
        b = max(range(len(offers)), key=lambda i: offers[i][0])
        rate, extra = offers[b]
        if extra == 0:
            return widths
        if cap is not None and total + extra > cap:  # offered before other rows took the room: offer again
            offers[b] = best(b)
            continue
        if (got + rate * extra) * cost(total) < got * cost(total + extra):
            return widths
        widths[b], total, got = widths[b] + extra, total + extra, got + rate * extra
        offers[b] = best(b)


def curve_path(lm: LanguageModel, packed: bool = False) -> Path | None:
    """Where ``lm``'s stored curves live (``$STRUCTSPEC_CACHE/pass-cost``, by name, dtype, device type, kernels
    and, on the CPU, torch's thread count; ``packed``: the packed curve's own file); None for a model without a
    name, or whose name is only its class's (built in memory: two such models of one class would share a curve).
    Changes nothing."""
    name, device, dtype = lm.name, lm.device, lm.dtype
    if not name or name == type(getattr(lm, "model", None)).__name__:
        return None  # a model built in memory is named by its class, which names no weights: no curve of its own
    # another curve entirely; "2": oneDNN's layers take a pass in one call, not in calls of 16 rows
    kernels = "-onednn2" if lm.kernels == "onednn" else ""
    tail = f"{kernels}-packed" if packed else kernels
    threads = f"-t{torch.get_num_threads()}" if device.type == "cpu" else ""  # a CPU pass's cost is the threads'
    dtype_name = str(dtype).removeprefix("torch.")
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{name}-{dtype_name}-{device.type}{threads}{tail}")
    return cache_dir("pass-cost") / f"{key}.json"


def pass_cost(lm: LanguageModel, packed: bool = False) -> PassCost:
    """``lm``'s stored curves (``packed``: its packed curve, a one-row curve over the tokens a packed pass feeds in
    all), else `DEFAULT_COST`. Reads the cache; changes nothing."""
    path = curve_path(lm, packed)
    if path is not None and path.exists():
        stored = json.loads(path.read_text())["curves"]
        return PassCost({int(rows): tuple((int(n), float(c)) for n, c in pts) for rows, pts in stored.items()})
    return DEFAULT_COST


def store_pass_cost(lm: LanguageModel, seconds: dict[tuple[int, int], float], packed: bool = False) -> Path:
    """Store ``lm``'s curves (`curve_of`) from measured ``seconds`` per pass by (rows, tokens fed per row); must
    include one row's one-token pass (``packed``: the packed curve, rows 1, tokens fed in all). Later decoding
    with the model drafts by them. Writes the cache."""
    path = curve_path(lm, packed)
    if path is None:
        raise ValueError("curves are stored for a named model on a device")
    curves = curve_of(seconds).curves
    raw = {f"{rows}x{fed}": s for (rows, fed), s in seconds.items()}
    write_atomic(path, json.dumps({"curves": curves, "seconds": raw}).encode())
    return path


def curve_of(seconds: dict[tuple[int, int], float]) -> PassCost:
    """The curves of measured ``seconds`` per pass by (rows, tokens fed per row), relative to one row's one-token
    pass (which they must include), each point capped by the cheapest wider pass. Changes nothing."""
    if (1, 1) not in seconds:
        raise ValueError("a pass-cost curve needs one row's one-token pass")
    capped: dict[tuple[int, int], float] = {}
    cheapest: dict[int, float] = {}  # per row count: the cheapest pass at least as wide as the current one
    for rows, fed in sorted(seconds, reverse=True):
        # A pass never costs more than a wider one: a slow outlier (a stall, a page fault) would otherwise
        # make drafting avoid that width for good, so each point is capped by the cheapest wider one.
        capped[rows, fed] = cheapest[rows] = min(seconds[rows, fed], cheapest.get(rows, float("inf")))
    curves: dict[int, list[tuple[int, float]]] = {}
    for rows, fed in sorted(capped):  # the unit stays one row's one-token pass, capped too
        curves.setdefault(rows, []).append((fed, capped[rows, fed] / capped[1, 1]))
    return PassCost({rows: tuple(points) for rows, points in curves.items()})


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

    def choose(self, fed: int, cap: int) -> int:
        """The draft length in ``[0, cap]`` maximizing (1 + expected accepted) / the cost of a one-row pass
        where ``fed`` tokens go in besides the draft. Changes nothing."""
        best, best_value = 0, 1.0 / self.cost(fed)
        expected, survive = 0.0, 1.0
        for k in range(1, cap + 1):
            survive *= self.hazard(k - 1)
            expected += survive
            value = (1.0 + expected) / self.cost(fed + k)
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
