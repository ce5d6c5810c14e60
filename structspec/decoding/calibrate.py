"""The pass-cost curve: measured by an explicit calibration, stored, and read by decoding.

Rows draft only as long, and a pass feeds their drafts only as far, as the tokens they add to a packed pass
(`structspec.models.packed_slots`) are expected to keep more than they cost (`structspec.decoding.cost`:
`DraftLength`, `choose_widths`). What a token costs depends on the model, dtype, device, kernels
and (on the CPU) torch's thread count, so it is measured for them by `calibrate` (``structspec.calibrate(lm)``,
``structspec calibrate --model NAME``): passes of 1 to 64 tokens spread over `ROWS` rows of 256 kept slots
each, as the batch loop runs them (`LanguageModel.forward_slots` over a packed window: each query attends to its
own row's slots, gathered where attention runs by row), a few seconds, stored under
``$STRUCTSPEC_CACHE/pass-cost`` (`structspec.decoding.cost.curve_path`). Decoding only reads it
(`structspec.decoding.cost.pass_cost`): no decode measures anything, and a model without a stored curve drafts by
`structspec.decoding.cost.prior_cost`, the curve for its device and dtype.

A curve measured while another process was busy on the machine is a curve of that moment, not of the model:
`calibrate` stores it only when told to (``store_busy=True``), and otherwise says so (a warning, and
``Calibration.stored`` false), so what a later run feeds does not depend on what the machine did when it was
calibrated.
"""

from __future__ import annotations

import json
import statistics
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from structspec.cache import write_atomic
from structspec.decoding.cost import PassCost, curve_path
from structspec.errors import OptionError
from structspec.models.packed_slots import PackedSlots
from structspec.models.protocol import LanguageModel

TOKENS = (1, 2, 4, 8, 16, 32, 64)  # tokens a packed pass feeds in all
CONTEXT = 256  # kept slots of each row the measured passes attend to
ROWS = 8  # rows the measured passes spread their tokens over (the first row alone in a one-token pass)
REPEATS = 3  # timed passes per point (the median is stored), after one untimed


@dataclass(frozen=True)
class Calibration:
    """What `calibrate` measured: the curve (``cost``, relative to a one-token pass), the median seconds of a pass
    by the tokens it feeds, where it was stored (None: not stored, the machine was busy), and how many threads of
    other work ran beside the measurement (0: an idle machine)."""

    cost: PassCost
    seconds: dict[int, float]
    path: Path | None
    busy: int

    @property
    def stored(self) -> bool:
        """Whether decoding with the model now reads this curve."""
        return self.path is not None


def calibrate(lm: LanguageModel, store_busy: bool = False) -> Calibration:
    """Measure ``lm``'s packed pass-cost curve (`measure`: 8 × 4 passes on a fresh cache of their own, a few
    seconds on a CPU) and store it for its name, dtype, device, kernels and thread count, replacing any stored
    one; later decoding with the model drafts by it. Measured beside other busy work, the curve is not stored
    unless ``store_busy``: a `RuntimeWarning` says so, and decoding keeps what it read before. `OptionError`
    for a model without a name of its own or that cannot run packed passes. Runs the model; writes the cache."""
    path = curve_path(lm)
    if path is None:
        raise OptionError(f"{type(lm).__name__} {lm.name!r} has no name of its own (a model built in memory), and a "
                          "curve is stored by the model's name: load it by name or directory (structspec.load)")
    if not lm.batchable:
        raise OptionError(f"{lm.name} runs one row per pass (sliding-window layers), so it has no packed pass to "
                          "calibrate: decoding drafts by the default curve; nothing to do")
    before = others_running()
    seconds = measure(lm)
    busy, cost = max(before, others_running()), curve_of(seconds)
    if busy and not store_busy:
        warnings.warn(f"{lm.name}: another process ran {busy} thread(s) while the pass cost was measured, so the "
                      "curve is that moment's, not the model's: not stored (decoding keeps "
                      f"{'the stored curve' if path.exists() else 'the default curve'}); calibrate again on an idle "
                      "machine, or pass store_busy=True (--store-busy) to keep it anyway", RuntimeWarning,
                      stacklevel=2)
        return Calibration(cost, seconds, None, busy)
    # one curve, under "1" (a packed pass is one row): the layout `pass_cost` reads
    write_atomic(path, json.dumps({"curves": {1: cost.points}, "seconds": seconds}).encode())
    return Calibration(cost, seconds, path, busy)


def curve_of(seconds: dict[int, float]) -> PassCost:
    """The curve of measured ``seconds`` per pass by tokens fed, relative to a one-token pass (which they must
    include), each point capped by the cheapest wider pass. Changes nothing."""
    if 1 not in seconds:
        raise ValueError("a pass-cost curve needs a one-token pass")
    capped, cheapest = {}, float("inf")
    for fed in sorted(seconds, reverse=True):
        # A pass never costs more than a wider one: a slow outlier (a stall, a page fault) would otherwise
        # make drafting avoid that width for good, so each point is capped by the cheapest wider one.
        capped[fed] = cheapest = min(seconds[fed], cheapest)
    return PassCost(tuple((fed, capped[fed] / capped[1]) for fed in sorted(capped)))


def others_running(samples: int = 5, every: float = 0.01) -> int:
    """How many threads of other work the CPU runs now: the fewest runnable beside this one in ``samples`` reads
    of ``/proc/stat`` (a busy process is runnable in every read; a passing one is not), 0 where there is no
    such file. Sleeps ``samples × every`` seconds; changes nothing."""
    counts = []
    for _ in range(samples):
        try:
            stat = Path("/proc/stat").read_text()
        except OSError:
            return 0
        running = next((line.split()[1] for line in stat.splitlines() if line.startswith("procs_running")), "1")
        counts.append(int(running) - 1)  # this thread, reading
        time.sleep(every)
    return max(0, min(counts))


def measure(lm: LanguageModel) -> dict[int, float]:
    """Median seconds of a packed pass feeding each of `TOKENS` (up to ``lm.max_pass_tokens``), round-robin over
    `ROWS` rows of `CONTEXT` kept slots (`packed_seconds`). Runs passes on fresh caches; changes nothing else."""
    cap = lm.max_pass_tokens
    return packed_seconds(lm, ROWS, [n for n in TOKENS if cap is None or n <= cap])


@torch.no_grad()
def packed_seconds(lm: LanguageModel, rows: int, sizes: list[int], context: int = CONTEXT,
                   repeats: int = REPEATS) -> dict[int, float]:
    """Median seconds of a packed pass (`LanguageModel.forward_slots`) feeding each of ``sizes`` tokens in all,
    round-robin over ``rows`` rows of ``context`` kept slots each (the first rows alone in a pass of fewer
    tokens), logits read for every fed token's row as a verify pass reads them; ``repeats`` timed passes per size
    after one untimed. Runs passes on fresh caches; changes nothing else."""
    generator = torch.Generator().manual_seed(0)
    vocab = min(len(lm.vocab), lm.logits_width)
    cuda = lm.device.type == "cuda"

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    prompt = lm.new_cache()
    lm.forward(ids(context), prompt)
    slots = PackedSlots(lm.new_cache(), rows)
    for row in range(rows):
        slots.place(row, context, prompt)
    seconds: dict[int, float] = {}
    for n in sizes:
        widths = [n // rows + (row < n % rows) for row in range(rows)]
        parents = [list(range(-1, w - 1)) for w in widths]
        positions = [[context + j for j in range(w)] for w in widths]
        times = []
        for repeat in range(repeats + 1):
            attend = slots.window_mask(widths, parents)
            if cuda:
                torch.cuda.synchronize()  # the pass alone: nothing queued before it is timed
            t0 = time.perf_counter()
            logits = lm.forward_slots([ids(n)], [sum(positions, [])], attend, slots.kv, [(0, j) for j in range(n)])
            logits.argmax(-1).tolist()  # the pass's read-back: on a GPU, the wait for it
            if repeat:
                times.append(time.perf_counter() - t0)
            slots.keep([0] * rows, widths)  # holes: every pass attends to the same slots
        seconds[n] = statistics.median(times)
    return seconds
