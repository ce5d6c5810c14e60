"""Where structspec keeps what it computes once: converted models and compiled FSMs.

``STRUCTSPEC_CACHE`` overrides the directory; the default follows XDG
(``~/.cache/structspec``). Every write goes to a temporary file first and is
renamed into place, so an interrupted process never leaves a torn entry.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache directory (or a subdirectory of it), created if missing."""
    root = os.environ.get("STRUCTSPEC_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "structspec"
    )
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see either the old file or the whole new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
