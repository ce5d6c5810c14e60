"""What the spawned processes of `test_cache_healing`'s races run: a module of its own, light to import (each
process imports it, and torch only where it loads a model)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING

from structspec.cache import cache_dir
from structspec.models import shipped

if TYPE_CHECKING:
    from structspec.vocab import TokenVocab


def tiny_convert(name: str, into: Path, verbose: bool) -> None:
    """A shipped model's conversion, made the tiny model's (no GGUF), slow enough for others to start meanwhile;
    each one logged beside the cache's models."""
    from structspec.testing import save_tiny_model

    time.sleep(0.5)
    save_tiny_model(into)
    with open(cache_dir() / "conversions.log", "a") as log:
        log.write(f"{os.getpid()}\n")


def _slow_copy(source: IO[bytes], target: IO[bytes]) -> None:
    """`shutil.copyfileobj`, slow enough for another process to start the same join meanwhile."""
    time.sleep(0.3)
    target.write(source.read())


def join_parts(cache: str, parts: list[Path], barrier) -> None:
    os.environ["STRUCTSPEC_CACHE"] = cache
    shutil.copyfileobj = _slow_copy  # this spawned process's own
    barrier.wait()
    shipped._concatenated("model.gguf", parts)


def load_shipped(cache: str, barrier) -> None:
    import structspec

    os.environ["STRUCTSPEC_CACHE"] = cache
    shipped._convert = tiny_convert
    barrier.wait()
    for _ in range(2):  # and again, while the others may still be converting or loading
        lm = structspec.load("smollm2-135m", device="cpu", kernels="torch")
        lm.forward([1, 2, 3], lm.new_cache())


def compile_regex(cache: str, regex: str, vocab: TokenVocab, barrier) -> None:
    from structspec.automaton import fsm

    os.environ["STRUCTSPEC_CACHE"] = cache
    fsm.DISK_MIN_SECONDS = 0.0
    barrier.wait()
    assert fsm.TokenFSM.from_regex(regex, vocab).info.source in ("compiled", "disk")
