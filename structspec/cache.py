"""Where structspec keeps what it computes once: converted models, compiled FSMs, token walks, pass-cost curves.

``STRUCTSPEC_CACHE`` overrides the directory; the default follows XDG
(``~/.cache/structspec``). Every entry heals and every writer is safe beside others:

- a write goes to a temporary file of its own (a unique name) and is renamed into place (`write_atomic`,
  `writing`), so a reader sees the old entry or the whole new one, never a torn one;
- a read that finds an entry it cannot use (truncated, garbled, another version's) warns once with a
  `CacheWarning` naming the file, drops it and returns None, and its caller builds the entry again
  (`read_entry`, `drop_damaged`); pickled entries carry a checksum (`write_pickle`, `read_pickle`), so a
  garbled one is never unpickled into a wrong automaton;
- an entry slow to build (a model's conversion, a GGUF joined from its parts) is built under a lock file beside
  it (`locked`): the first process builds it, the others wait and then read it; the builder first removes what
  builders killed mid-write left (`remove_leftovers`).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, TypeVar

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; unique temporary names still keep every entry whole
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")
_SEAL = b"structspec-sha256\n"  # what a checksummed entry starts with, then the digest of what follows it


class CacheWarning(RuntimeWarning):
    """A damaged cache entry was found and dropped; it is built again."""


def cache_dir(*parts: str) -> Path:
    """The cache directory (or a subdirectory of it), created if missing."""
    root = os.environ.get("STRUCTSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "structspec"
    )
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def writing(path: Path) -> Iterator[IO[bytes]]:
    """A binary file to write ``path``'s new content into: a temporary file of this writer's own beside it,
    renamed over ``path`` when the block ends without an error (removed when it raises)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    with writing(path) as f:
        f.write(data)


def read_entry(path: Path, parse: Callable[[bytes], T], rebuilt: str = "built again") -> T | None:
    """``parse`` of ``path``'s bytes, or None when there is no entry or ``parse`` raises: then the entry is
    damaged, and `drop_damaged` warns (saying it is ``rebuilt``) and removes it. Reads the cache; writes it only
    to drop a damaged entry."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return parse(data)
    except Exception as e:  # anything a truncated or garbled file makes a parser raise
        drop_damaged(path, f"{type(e).__name__}: {e}"[:200], rebuilt)
        return None


def drop_damaged(path: Path, why: str, rebuilt: str = "built again") -> None:
    """Warn (`CacheWarning`, naming ``path`` and ``why``) and remove the damaged entry ``path``, a file or a
    directory (renamed aside first, so that no reader ever sees it half removed)."""
    warnings.warn(f"structspec's cache entry {path} is damaged ({why}): removed, and {rebuilt}", CacheWarning,
                  stacklevel=3)
    if path.is_dir():
        aside = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.damaged."))
        try:
            os.replace(path, aside)  # an empty directory: replaced
        except FileNotFoundError:
            pass  # another process dropped it first
        shutil.rmtree(aside, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_pickle(path: Path, value: Any) -> None:
    """Pickle ``value`` to ``path`` (`write_atomic`) behind a checksum that `read_pickle` verifies."""
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    write_atomic(path, _SEAL + hashlib.sha256(data).digest() + data)


def read_pickle(path: Path, kind: type[T], rebuilt: str = "built again") -> T | None:
    """The ``kind`` that `write_pickle` stored at ``path``, or None: none stored, or a damaged entry (a wrong
    checksum, or not a ``kind``), dropped with a warning (`read_entry`)."""
    return read_entry(path, lambda data: _unpickled(data, kind), rebuilt)


def _unpickled(data: bytes, kind: type[T]) -> T:
    if not data.startswith(_SEAL):
        raise ValueError("no checksum header")
    digest, body = data[len(_SEAL):len(_SEAL) + 32], data[len(_SEAL) + 32:]
    if hashlib.sha256(body).digest() != digest:
        raise ValueError(f"checksum mismatch over {len(body)} bytes")
    value = pickle.loads(body)
    if not isinstance(value, kind):
        raise TypeError(f"holds a {type(value).__name__}, not a {kind.__name__}")
    return value


def remove_leftovers(path: Path) -> None:
    """Remove what writers of ``path`` killed mid-write left beside it: their temporary files and directories
    (``.<name>.*``, the lock file kept). Only under `locked` (``path``): no writer of it is running then (where
    there are no locks, Windows, nothing is removed)."""
    if fcntl is None:
        return
    for left in path.parent.glob(f".{path.name}.*"):
        if left.is_dir():
            shutil.rmtree(left, ignore_errors=True)
        elif left.name != f".{path.name}.lock":
            left.unlink(missing_ok=True)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the lock of the entry ``path`` (``.<name>.lock`` beside it, kept: removing a lock file races) while
    the block runs; other processes wait for it. Not reentrant: lock each entry once per process."""
    if fcntl is None:
        yield
        return
    with open(path.with_name(f".{path.name}.lock"), "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
