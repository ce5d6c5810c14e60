"""`PeakMemory`: the peak memory of a block of work, on CUDA or the CPU."""

from __future__ import annotations

import os
import re
import resource
from pathlib import Path

import torch


class PeakMemory:
    """Peak memory inside a ``with`` block, in MiB (``peak``, ``growth``; ``how`` says how it was measured).

    On CUDA: the allocator's peak on the model's device, reset on entry. On the
    CPU: the process's resident-set high-water mark (Linux's VmHWM, reset on
    entry through /proc/self/clear_refs); where it cannot be reset, the
    process's high-water mark since it started (getrusage), which only grows.
    """

    def __init__(self, device: torch.device) -> None:
        self.device, self.peak, self.growth = device, 0.0, 0.0
        if device.type == "cuda":
            self.how = "peak CUDA memory allocated (torch), reset per row"
        elif _resettable_rss():
            self.how = "peak resident set (VmHWM), reset per row"
        else:
            self.how = "process resident-set high-water mark since start (getrusage)"

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device) / 2**20
        else:
            if _resettable_rss():
                Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak resident set to the current one
            self.start = _rss_mib("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device) / 2**20
        elif _resettable_rss():
            self.peak = _rss_mib("VmHWM")
        else:
            self.peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
        self.growth = self.peak - self.start


def _rss_mib(key: str) -> float:
    """``key`` (VmRSS, VmHWM) of /proc/self/status in MiB; 0 where there is no /proc."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0.0
    found = re.search(rf"^{key}:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else 0.0


def _resettable_rss() -> bool:
    return os.access("/proc/self/clear_refs", os.W_OK) and _rss_mib("VmHWM") > 0
