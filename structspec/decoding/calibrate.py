"""The packed pass-cost curve, measured on a model's first decode: what drafting weighs its fed tokens by.

A batch's rows draft only where the tokens they add to a packed pass
(`structspec.models.packed_slots`) are expected to keep more than they cost
(`structspec.decoding.budget.choose_widths`). What a token costs depends on the
model, dtype, device and kernels, so the first decode with a named model (one row or a batch)
measures it: passes of 1 to 64 tokens spread over `ROWS` rows of 256 kept slots
each, as the batch loop runs them (`LanguageModel.forward_slots` over a packed
window: each query attends to its own row's slots, gathered where attention runs
by row), a few seconds once, stored under ``$STRUCTSPEC_CACHE/pass-cost`` for
every later run. A curve measured while another process was busy on the machine
is a curve of that moment, not of the model: it is discarded (the call drafts by
`DEFAULT_COST`, and the process does not measure that model again), so what a
later run feeds does not depend on what the machine did the first time.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from structspec.decoding.budget import DEFAULT_COST, PassCost, curve_path, pass_cost, store_pass_cost
from structspec.models.packed_slots import PackedSlots
from structspec.models.protocol import LanguageModel

TOKENS = (1, 2, 4, 8, 16, 32, 64)  # tokens a packed pass feeds in all
CONTEXT = 256  # kept slots of each row the measured passes attend to
ROWS = 8  # rows the measured passes spread their tokens over (the first row alone in a one-token pass)
REPEATS = 3  # timed passes per point (the median is stored), after one untimed


def packed_cost(lm: LanguageModel) -> PassCost:
    """``lm``'s packed curve: stored, else measured now (`measure`) and stored; `DEFAULT_COST` for a model
    without a name or that cannot batch. May run passes on ``lm`` (a fresh cache of their own) and write the
    cache; changes nothing else."""
    path = curve_path(lm, packed=True)
    if path is None or not lm.batchable or path in _DISCARDED:
        return DEFAULT_COST
    if not path.exists():
        before = others_running()
        seconds = measure(lm)
        if max(before, others_running()) > 0:  # measured beside another busy process: not the model's curve
            _DISCARDED.add(path)
            return DEFAULT_COST
        store_pass_cost(lm, seconds, packed=True)
    return pass_cost(lm, packed=True)


_DISCARDED: set[Path] = set()  # curves measured under load in this process: not measured again until it ends


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


@torch.no_grad()
def measure(lm: LanguageModel) -> dict[tuple[int, int], float]:
    """Median seconds of a packed pass feeding each of `TOKENS` (up to ``lm.max_pass_tokens``), round-robin over
    `ROWS` rows of `CONTEXT` kept slots, keyed ``(1, tokens)``, logits read for every fed token's row as a verify
    pass reads them. Runs passes on fresh caches; changes nothing else."""
    cap = lm.max_pass_tokens
    sizes = [n for n in TOKENS if cap is None or n <= cap]
    generator = torch.Generator().manual_seed(0)
    vocab = min(len(lm.vocab), lm.logits_width)

    def ids(n: int) -> list[int]:
        return torch.randint(3, vocab, (n,), generator=generator).tolist()

    prompt = lm.new_cache()
    lm.forward(ids(CONTEXT), prompt)
    slots = PackedSlots(lm.new_cache(), ROWS)
    for row in range(ROWS):
        slots.place(row, CONTEXT, prompt)
    seconds: dict[tuple[int, int], float] = {}
    for n in sizes:
        widths = [n // ROWS + (row < n % ROWS) for row in range(ROWS)]
        parents = [list(range(-1, w - 1)) for w in widths]
        positions = [[CONTEXT + j for j in range(w)] for w in widths]
        times = []
        for repeat in range(REPEATS + 1):
            attend = slots.window_mask(widths, parents)
            t0 = time.perf_counter()
            logits = lm.forward_slots([ids(n)], [sum(positions, [])], attend, slots.kv, [(0, j) for j in range(n)])
            logits.argmax(-1).tolist()  # the pass's read-back: on a GPU, the wait for it
            if repeat:
                times.append(time.perf_counter() - t0)
            slots.keep([0] * ROWS, widths)  # holes: every pass attends to the same slots
        seconds[1, n] = statistics.median(times)
    return seconds
