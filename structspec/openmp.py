"""How torch's OpenMP threads wait: a short spin, then asleep, unless the user said otherwise.

torch's CPU build runs GNU OpenMP (libgomp), whose threads spin at every barrier (300,000 rounds by default)
before they sleep. Alone on a machine that is the fastest wait; beside another busy process it is a cliff: a
spinning thread holds the core that the thread it waits for needs, so every operator of a pass waits out a
scheduler time slice. A spin of 1,000 rounds (what libgomp itself uses when threads outnumber cores) keeps
nearly all of the speed alone and gives the core up under load: on Qwen2.5-Coder-0.5B (bfloat16, 2 threads,
2-core CPU), 2.10 s a record alone and 2.93 beside one busy process, against 1.94 and 5.90 with libgomp's default
and 2.74 and 2.65 with no spin at all (``python -m lab.contention``). libgomp reads its
settings once, when torch loads it, so `short_spin` runs when structspec is imported, before torch is.
"""

from __future__ import annotations

import os
import sys

SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # what libgomp reads for waiting: a user's own choice wins
SPIN = "1000"  # rounds a waiting thread spins before it sleeps


def short_spin() -> bool:
    """Set ``GOMP_SPINCOUNT`` to `SPIN` in this process's environment (inherited by its children) unless torch is
    already imported (too late: libgomp has read its settings) or the user set one of `SETTINGS`; returns whether
    it did. Changes ``os.environ``."""
    if "torch" in sys.modules or any(name in os.environ for name in SETTINGS):
        return False
    os.environ["GOMP_SPINCOUNT"] = SPIN
    return True
