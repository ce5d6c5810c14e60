"""What a target pass costs, and the tokens a draft and a pass should have for it.

A target pass costs a fixed part (reading the weights, launching kernels) plus
a part per fed token (the matrix products). On a GPU the per-token part is
close to nothing up to hundreds of tokens, so long drafts are free; on a CPU a
fed token costs a sizeable share of a pass, and a 10-token draft of which two
are kept makes a pass slower than it saves. A pass packs every row's window
into one sequence (`structspec.models.packed_slots`), so it costs what the
tokens it feeds in all cost, whatever the rows; a row alone is a pass of one
row. `PassCost` is that one curve, measured for the model, dtype, device,
kernels and threads by an explicit calibration (`structspec.decoding.calibrate`,
``structspec calibrate``) and stored (`curve_path`); a model without a stored
curve drafts by `prior_cost`, a curve for its device and dtype drawn from the
ones measured, so the defaults are fast without a calibration.

One decision reads it: how many drafted tokens a row asks its drafter for and how many a pass feeds, made by
`choose_widths` (tokens are fed while the expected kept tokens they add pay for what they add to the cost) over
gains from one row's `DraftLength`: its acceptance of the i-th drafted token once the ones before it were kept,
learned per row (a greedy row starting from its job's or engine's rows' rates, its ``pool``). Its inputs are
those statistics, this curve and, for a drafter that runs a draft model, what a draft pass costs
(`draft_pass_cost`, in one-token target passes, times the draft passes a drafted token took so far). It is made twice on the same terms, because the facts arrive twice:

- before drafting (`DraftLength.choose`), on the window the row would offer if its drafter gave a chain of
  its own tokens, the row as if alone, counting the draft passes still to be run: the most drafter tokens
  worth making;
- once the windows exist (the drivers), on what was drafted (forced text spliced in, a chain cut short by the
  FSM or the drafter, a tree) and on every row of the pass: the draft passes are spent by then, and a batch's
  rows share the pass's cost. Where drafted tokens cost more than they keep, every row is fed its pending
  tokens only: plain masked decoding's pass, the crossover where drafting turns itself off.

An engine's proposer makes the same decision for its requests (`structspec.integrations.proposal`: `choose` per
request, `choose_widths` over the engine step's rows). A model drafter keeps no draft length of its own: it
stops early only where it has nothing worth proposing (its own probability of its token,
`structspec.decoding.drafters.policy.Confidence`), as prompt lookup stops where nothing matches.

No clock is read while decoding and nothing is measured: a run's passes depend only on the stored curve, and a
sampled row's draft only on its own history and the curve: it always chooses as if alone and is never cut, so a
seed reproduces its sample in any batch and at every run. A greedy row's output never depends on its drafts, so
cutting it by a measured curve changes passes, not tokens.
"""

from __future__ import annotations

import json
import math
import re
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import torch

from structspec.cache import cache_dir, read_entry
from structspec.models.device import native_bf16
from structspec.models.protocol import LanguageModel

PRIOR = (2.0, 1.0)  # pseudo-counts (accepted, rejected) of every position: an untried length looks decent


@dataclass(frozen=True)
class PassCost:
    """Seconds of a pass against the tokens it feeds in all, relative to a one-token pass: linear between
    ``points`` ((tokens fed, cost) by tokens fed, the first at one token) and along the last slope beyond."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def linear(cls, per_token: float) -> PassCost:
        """A one-token pass 1.0, each more token ``per_token``."""
        return cls(((1, 1.0), (2, 1.0 + per_token)))

    def __call__(self, fed: int) -> float:
        """The cost of a pass feeding ``fed`` tokens. Changes nothing."""
        pts = self.points
        if len(pts) == 1:
            return pts[0][1]  # a single point: flat
        i = next((i for i in range(1, len(pts)) if fed <= pts[i][0]), len(pts) - 1)  # the segment, or the last
        (n0, c0), (n1, c1) = pts[i - 1], pts[i]
        return c0 + (c1 - c0) * (fed - n0) / (n1 - n0)


FLAT_COST = PassCost.linear(0.0)
"""A fed token costs nothing: drafts are as long as the drafter makes them and a pass feeds them whole. What a GPU's
pass costs, up to hundreds of tokens (docs/benchmarks/pass-cost.md), and a model without weights (the tests'
fakes)."""

CPU_COST = PassCost.linear(0.1)
"""A CPU pass in float32, or in bfloat16 where the CPU multiplies it natively: each fed token 0.1 of a one-token
pass. The curves measured on 2-core AMD EPYCs (docs/benchmarks/pass-cost.md) run 0.10–0.12 a token on AVX2 in
float32 (oneDNN), 0.06–0.07 in bfloat16 with AVX-512 BF16, 0.02 in float32 there: the steepest common one, so a
draft is fed only where it is kept often enough to pay on all of them."""

EMULATED_COST = PassCost.linear(0.7)
"""A CPU pass in a half-precision dtype the CPU does not multiply natively (bfloat16 without AVX-512 BF16 or AMX,
float16): converted on every product, each fed token costs 0.6–0.8 of a one-token pass (measured on an AVX2 EPYC),
so only drafts kept nearly every time pay."""


TINY_PARAMETERS = 10_000_000
"""Below this many parameters a CPU pass is its fixed costs (Python, kernel calls), whatever it feeds: flat."""

_PARAMETERS: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
"""Per torch model: its parameter count, summed once (`prior_cost` runs at every decode call)."""


def prior_cost(lm: LanguageModel) -> PassCost:
    """The curve ``lm`` drafts by without a stored one: `FLAT_COST` off the CPU, for a model without torch weights
    and for a tiny one (`TINY_PARAMETERS`), `EMULATED_COST` for a half-precision dtype this CPU does not multiply
    natively, else `CPU_COST`. Measures nothing, changes nothing."""
    parameters = _parameters(getattr(lm, "model", None))
    if lm.device.type != "cpu" or parameters is None or parameters < TINY_PARAMETERS:
        return FLAT_COST
    if lm.dtype in (torch.bfloat16, torch.float16) and not (lm.dtype == torch.bfloat16 and native_bf16()):
        return EMULATED_COST
    return CPU_COST


def curve_source(lm: LanguageModel) -> str:
    """Which curve ``lm`` drafts by, in words, for a command to print: the stored file, or the prior and how to
    measure one. Reads the cache as `pass_cost` does (`stored_cost`: a damaged file is dropped, and then it is
    the prior that is named)."""
    path = curve_path(lm)
    if stored_cost(lm) is not None:
        return f"pass cost: the curve stored in {path}"
    prior = prior_cost(lm)
    if prior is FLAT_COST:
        return "pass cost: flat (a fed token costs nearly nothing off the CPU)"
    kind = "half precision without native support" if prior is EMULATED_COST else str(lm.dtype).removeprefix("torch.")
    fix = " (structspec calibrate --model NAME measures this machine's)" if path is not None else ""
    return f"pass cost: the CPU prior for {kind}, {prior(2) - 1:.2f} of a pass a fed token{fix}"


def choose_widths(gains: list[list[float]], cost: PassCost, floors: list[int], cap: int | None = None,
                  drafting: float = 0.0) -> list[int]:
    """Each row's tokens fed in one packed pass: from ``floors[b]`` up, the extension with the most expected tokens
    per fed token first, taken while the pass's expected tokens per unit of its cost (``cost(total tokens)``,
    `pass_cost`, plus ``drafting`` for each token past the floors: draft passes still to run) do not fall,
    ``cap`` tokens in all at most.
    ``gains[b][w − 1]``: row ``b``'s expected tokens when fed its window's first ``w`` tokens. Ties go to the
    wider, so a flat curve (`FLAT_COST`) with nothing to draft feeds every window whole. Changes nothing."""
    widths = list(floors)
    total, got = sum(widths), sum(g[w - 1] for g, w in zip(gains, widths))

    def spent(tokens: int) -> float:
        """The cost of a pass of ``tokens`` tokens in all, with the drafting of those past the floors."""
        return cost(tokens) + drafting * (tokens - sum(floors))

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
        if (got + rate * extra) * spent(total) < got * spent(total + extra):
            return widths
        widths[b], total, got = widths[b] + extra, total + extra, got + rate * extra
        offers[b] = best(b)


def draft_pass_cost(draft: LanguageModel, target: LanguageModel) -> float:
    """What one pass of the ``draft`` model costs in one-token passes of ``target``, by the prior a model without
    a calibration drafts by: the share of the target's parameters the draft's are (a one-token pass reads every
    weight once, on a GPU as on a CPU; an early exit's shared head and embeddings count in both); 0 where either
    has no torch weights (the tests' fakes, whose passes cost nothing per token either: `prior_cost`). Measures
    nothing, changes nothing."""
    sizes = [_parameters(getattr(lm, "model", None)) for lm in (draft, target)]
    return 0.0 if None in sizes or not sizes[1] else min(sizes[0] / sizes[1], 1.0)  # type: ignore[operator]


def _parameters(model: object) -> int | None:
    """A torch model's parameter count, summed once per model; None for anything else. Changes nothing."""
    if not isinstance(model, torch.nn.Module):
        return None
    if model not in _PARAMETERS:
        _PARAMETERS[model] = sum(p.numel() for p in model.parameters())
    return _PARAMETERS[model]


def curve_path(lm: LanguageModel) -> Path | None:
    """Where ``lm``'s stored curve lives (``$STRUCTSPEC_CACHE/pass-cost``, by name, dtype, device type, kernels
    and, on the CPU, torch's thread count); None for a model without a name, or whose name is only its class's
    (built in memory: two such models of one class would share a curve). Changes nothing."""
    name, device = lm.name, lm.device
    if not name or name == type(getattr(lm, "model", None)).__name__:
        return None  # a model built in memory is named by its class, which names no weights: no curve of its own
    # another curve entirely; "2": oneDNN's layers take a pass in one call, not in calls of 16 rows
    kernels = "-onednn2" if lm.kernels == "onednn" else ""
    threads = f"-t{torch.get_num_threads()}" if device.type == "cpu" else ""  # a CPU pass's cost is the threads'
    dtype = str(lm.dtype).removeprefix("torch.")
    # "-packed": by the tokens a packed pass feeds in all (files without it hold per-row curves, no longer read)
    key = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{name}-{dtype}-{device.type}{threads}{kernels}-packed")
    return cache_dir("pass-cost") / f"{key}.json"


def pass_cost(lm: LanguageModel) -> PassCost:
    """``lm``'s stored curve (`stored_cost`), else `prior_cost`: what decoding drafts by, read once per call of
    the public API and passed down to the drivers. Reads the cache; measures nothing, changes nothing but a
    damaged curve, which it drops with a `structspec.cache.CacheWarning`."""
    stored = stored_cost(lm)
    return prior_cost(lm) if stored is None else stored


def stored_cost(lm: LanguageModel) -> PassCost | None:
    """``lm``'s stored curve (`structspec.decoding.calibrate.calibrate`), or None: none stored, or the file was
    damaged (dropped with a `structspec.cache.CacheWarning`). Reads the cache; changes nothing but a damaged
    file."""
    path = curve_path(lm)
    return None if path is None else read_entry(path, _stored_curve, "decoding drafts by the prior until "
                                                                     "`structspec calibrate` stores one again")


def _stored_curve(data: bytes) -> PassCost:
    """The curve a stored file holds: one curve, under "1" (rows: a packed pass's one), from a one-token pass,
    by growing tokens fed, at finite positive costs; anything else raises."""
    points = tuple((int(n), float(c)) for n, c in json.loads(data)["curves"]["1"])
    fed = [n for n, _ in points]
    if not points or fed[0] != 1 or fed != sorted(set(fed)) or not all(math.isfinite(c) and c > 0 for _, c in points):
        raise ValueError(f"not a pass-cost curve: {points[:8]}")
    return PassCost(points)


@dataclass
class DraftLength:
    """One row's draft lengths: its acceptance of drafted tokens by position, and from it the tokens worth
    drafting (`choose`) and the expected kept tokens of a window (`expected_kept`, the gains `choose_widths`
    feeds by).

    ``tried[i]``: candidates whose drafted token ``i`` (0-based, drafter tokens
    only: spliced forced text is nearly always accepted and not counted) was
    verified with every drafted token before it accepted; ``kept[i]``: of those,
    how many kept it. ``draft_pass``: one draft pass's cost in one-token target
    passes (`draft_pass_cost`; 0 for a drafter that runs no model), paid per
    drafter token as often as ``passes`` in ``drafted`` show; ``spliced`` in
    ``drafted``: the forced text a drafter token opens, kept with it. ``pool``:
    the counts of every row of the job or engine this row runs in (a
    `DraftLength` each row records into too), the prior a row's per-position
    rates (`hazard`) start from: a short output (a tool call, a few steps) is
    over before its own counts say what drafting pays on this workload.

    ``unsure_stops``: the drafter stops itself after a token it is unsure of (a
    model drafter, `structspec.decoding.drafter.ModelDrafting`), so a candidate
    reaches token ``i`` only where it drafted the ones before it confidently, and
    those are kept more often than their position's rate says: the chance a path
    is kept whole to its ``i``-th drafter token is then measured directly
    (``whole[i]`` of ``reached[i]``, the candidates that had that token), not as a
    product of per-position rates, which treats each token as independent of the
    drafter having gone on. (Prompt lookup keeps the product: its drafts cost no
    pass, and on the CPU prior the direct measure cost it 2 % more in the replay
    of recorded outputs, issue 59.)
    """

    cost: PassCost
    draft_pass: float = 0.0
    unsure_stops: bool = False
    tried: list[int] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)  # candidates with a drafter token i
    whole: list[int] = field(default_factory=list)  # of those, kept with every drafter token before it
    drafted: int = 0  # drafter tokens verified
    passes: int = 0  # the draft passes they took
    spliced: int = 0  # forced tokens spliced between and after them
    pool: DraftLength | None = None

    def choose(self, fed: int, cap: int) -> int:
        """The drafter tokens in ``[0, cap]`` worth drafting after ``fed`` pending tokens (one at least): the
        tokens `choose_widths` would feed of a chain of ``cap`` of them, the row alone, counting the draft passes
        they need (`drafting`). Changes nothing."""
        fed = max(fed, 1)
        kept = self.expected_kept(list(range(-1, cap - 1)), [True] * cap)  # a chain of drafter tokens
        carried = 1.0 + self.spliced / (self.drafted + 1)  # a drafter token opens the forced text after it
        gains = [float(w) for w in range(1, fed + 1)] + [fed + carried * k for k in kept]
        return choose_widths([gains], self.cost, [fed], drafting=self.drafting)[0] - fed

    @property
    def drafting(self) -> float:
        """What drafting one more drafter token costs, in one-token target passes: a draft pass times the passes
        a drafter token took so far (one before any was verified). Changes nothing."""
        return self.draft_pass * (self.passes + 1) / (self.drafted + 1) if self.draft_pass else 0.0

    def expected_kept(self, parents: list[int], drafted: list[bool]) -> list[float]:
        """Expected tokens a verify pass keeps of a candidate (a chain or a token tree, ``parents[i]``: node
        ``i``'s parent, −1 the root) fed only its first ``n`` nodes, for each ``n`` (entry ``n − 1``): the best
        path's expected accepted prefix, where the drafter's ``k``-th token on a path (``drafted[i]``) is kept
        with chance `hazard` ``(k)`` and spliced forced text always (it nearly always is). Changes nothing."""
        survive: list[float] = []  # per node: the chance the path to it is kept whole
        expected: list[float] = []  # per node: the path's expected kept tokens
        depth: list[int] = []  # per node: the drafter's tokens on the path to it
        out: list[float] = []
        whole = self.whole_rates(sum(drafted)) if self.unsure_stops else []
        for i, p in enumerate(parents):
            above = depth[p] if p >= 0 else 0
            path = survive[p] if p >= 0 else 1.0
            if drafted[i]:
                path = whole[above] if self.unsure_stops else path * self.hazard(above)
            survive.append(path)
            expected.append((expected[p] if p >= 0 else 0.0) + survive[i])
            depth.append(above + drafted[i])
            out.append(max(expected[i], out[-1] if out else 0.0))
        return out

    def whole_rates(self, n: int) -> list[float]:
        """For ``i < n``: the estimated chance a path is kept whole to drafter token ``i`` where the drafter drafted
        it: ``whole[i]`` of ``reached[i]``, with `PRIOR`'s weight of pseudo-counts at the rate before it times the
        row's step one token deeper (`deeper`). Changes nothing."""
        step = self.deeper()
        out: list[float] = []
        for i in range(n):
            mean = (out[-1] if out else 1.0) * step
            seen, whole = (self.reached[i], self.whole[i]) if i < len(self.reached) else (0, 0)
            out.append((whole + sum(PRIOR) * mean) / (seen + sum(PRIOR)))
        return out

    def deeper(self) -> float:
        """How a path's whole rate changes one drafter token deeper, pooled over the positions reached: the paths
        kept whole to token ``i`` (``i`` ≥ 1) of those that token ``i − 1``'s rate predicts for ``reached[i]``,
        `PRIOR`'s hazard before any, at most 1. Changes nothing."""
        # What an untried position is taken to be: one token deeper as the tried ones were, not `PRIOR`'s 2/3
        # (with it, the positions past the deepest tried looked poor however well the tried ones did, and the
        # length stopped where the row stopped trying; a row lives a few dozen candidates). Measured on whole
        # paths, not as the hazard: where the drafter goes on only when sure, a deeper token's path is kept about
        # as often as a shallower one's. At most 1: an untried position is never taken to beat the deepest tried.
        predicted = sum(r * w / seen for r, w, seen in zip(self.reached[1:], self.whole, self.reached))
        return min((sum(self.whole[1:]) + PRIOR[0]) / (predicted + sum(PRIOR)), 1.0)

    def hazard(self, i: int) -> float:
        """Estimated chance that drafted token ``i`` is accepted given the ones before it were: the row's counts
        after `PRIOR`'s weight of pseudo-counts at the pool's estimate (`PRIOR`'s own rate without a pool)."""
        tried, kept = (self.tried[i], self.kept[i]) if i < len(self.tried) else (0, 0)
        weight = PRIOR[0] + PRIOR[1]
        prior = self.pool.hazard(i) if self.pool is not None else PRIOR[0] / weight
        return (kept + weight * prior) / (tried + weight)

    def record(self, drafted: int, accepted: int, passes: int = 0, spliced: int = 0) -> None:
        """One verified candidate had ``drafted`` drafter tokens (on its deepest path), of which the first
        ``accepted`` were kept, drafted in ``passes`` draft passes, and ``spliced`` forced tokens (changes the
        counts, and the pool's)."""
        if self.pool is not None:
            self.pool.record(drafted, accepted, passes, spliced)
        self.drafted += drafted
        self.passes += passes
        self.spliced += spliced
        _count(self.reached, self.whole, drafted, accepted)
        # positions verified with all drafted tokens before them kept
        _count(self.tried, self.kept, min(accepted + 1, drafted), accepted)


def _count(seen: list[int], kept: list[int], positions: int, accepted: int) -> None:
    """Count one candidate at its first ``positions`` positions in ``seen``, and in ``kept`` those before
    ``accepted`` (the lists grow to reach them). Changes both lists."""
    if len(seen) < positions:
        seen += [0] * (positions - len(seen))
        kept += [0] * (positions - len(kept))
    for i in range(positions):
        seen[i] += 1
        kept[i] += i < accepted
