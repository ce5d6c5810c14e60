"""How torch's OpenMP threads wait: asleep, not spinning, unless the user said otherwise.

torch's CPU build runs GNU OpenMP (libgomp), whose threads spin for a while at every barrier before they sleep.
Alone on a machine that costs nothing; beside another busy process it is a cliff: a spinning thread holds the
core that the thread it waits for needs, so every operator of a pass waits out a scheduler time slice (a one-token
pass of SmolLM2-135M on 2 threads: 6.5–7.3 s under load against 0.3–0.5 s with passive waiting). libgomp reads
its settings once, when torch loads it, so `passive_wait` runs when structspec is imported, before torch is.
"""

from __future__ import annotations

import os
import sys

SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")  # what libgomp reads for waiting: a user's own choice wins


def passive_wait() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in this process's environment (inherited by its children) unless torch is
    already imported (too late: libgomp has read its settings) or the user set `SETTINGS`; returns whether it
    did. Changes ``os.environ``."""
    if "torch" in sys.modules or any(name in os.environ for name in SETTINGS):
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True
