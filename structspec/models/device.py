"""Where and in what a model runs: the torch device, the default dtype, the CPU's native bfloat16, and torch's
thread count (capped at the CPUs this process may use)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from structspec.errors import OptionError

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str = "auto", dtype: str | torch.dtype | None = None,
                   model: str | None = None) -> tuple[torch.device, torch.dtype]:
    """The device and dtype ``load`` uses for ``device``/``dtype`` options (``"auto"``: CUDA if available) and
    ``model``'s name (`default_dtype`). Does not change anything."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        where = torch.device(device)
    except RuntimeError:
        raise OptionError(f"device={device!r} is not a torch device: use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if where.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"device={device!r} but torch sees no CUDA device: use device='cpu' or 'auto'")
    if dtype is None:
        return where, default_dtype(where, model)
    if isinstance(dtype, torch.dtype):
        return where, dtype
    if dtype not in _DTYPES:
        raise OptionError(f"dtype={dtype!r} is not one of {', '.join(_DTYPES)}")
    return where, _DTYPES[dtype]


DTYPE_VARIABLE = "STRUCTSPEC_DEFAULT_DTYPE"
"""The environment variable that overrides `default_dtype` ("float32" or "bfloat16"): CI runs the fast tests
again with the other CPU default forced, so that no test passes only in its own machine's default."""


FLOAT32_MODELS = frozenset({"smollm2-135m"})
"""Shipped models whose answers bfloat16 makes wrong, so they load in float32 on every device unless a dtype is
named: SmolLM2-135M's field accuracy on the shipped tasks drops in bfloat16, and the demo's object with it
(docs/benchmarks/accuracy.md). A 135M model is cheap in float32 anywhere."""


def default_dtype(where: torch.device, model: str | None = None) -> torch.dtype:
    """The dtype `load` gives ``model`` (a name, or None) on ``where`` when ``dtype=None``: float32 for the models
    bfloat16 costs accuracy (`FLOAT32_MODELS`), else the machine's default: ``$STRUCTSPEC_DEFAULT_DTYPE`` where
    set (it stands for the other kind of CPU), else bfloat16 where it is fast (CUDA, and CPUs that multiply it
    natively), else float32. Changes nothing."""
    forced = os.environ.get(DTYPE_VARIABLE)
    if forced and forced not in ("float32", "bfloat16"):
        raise OptionError(f"{DTYPE_VARIABLE}={forced!r} is not a default dtype: set it to float32 or bfloat16, "
                          "or unset it for the machine's own default")
    if model in FLOAT32_MODELS:
        return torch.float32
    if forced:
        return _DTYPES[forced]
    return torch.bfloat16 if where.type == "cuda" or native_bf16() else torch.float32


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively in oneDNN (AVX-512 BF16 or AMX). Changes nothing."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def available_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota (a container's
    ``--cpus``), which torch's own default does not see. Changes nothing."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        quota, period = _CPU_MAX.read_text().split()
        return min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):  # no cgroup v2 file, or "max": no quota
        return cpus


_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")


def default_threads() -> int:
    """The thread count `load` gives torch when ``threads=None``: torch's current count (``OMP_NUM_THREADS`` or
    its default), capped at `available_cpus` so that it does not oversubscribe. Changes nothing."""
    return min(torch.get_num_threads(), available_cpus())


def check_threads(threads: int | None) -> None:
    """Raise `OptionError` unless ``threads`` is None or a positive int. Changes nothing."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise OptionError(
            f"threads={threads!r} is not a positive int; use threads=None (torch's count, at most the "
            f"{available_cpus()} CPUs this process may use) or threads=1 on a machine shared with other jobs"
        )


def use_threads(threads: int | None) -> int:
    """Set torch's intra-op thread count (process-wide: changes torch's global setting) to ``threads``, or
    to `default_threads` when None (then unchanged unless torch's count exceeds the available CPUs); returns it."""
    check_threads(threads)
    count = default_threads() if threads is None else threads
    if count != torch.get_num_threads():
        torch.set_num_threads(count)
    return count
