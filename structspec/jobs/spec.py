"""The spec a job extracts, as ``--schema`` names it: a Pydantic model in a module or a file, a JSON Schema
file, or a named grammar."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import structspec
from structspec.errors import StructspecError
from structspec.jobs.errors import JobConfigError


def load_spec(arg: str) -> Any:
    """The output spec named by ``arg``.

    Forms: ``package.module:Model`` (imported, the current directory first),
    ``path/to/file.py:Model`` (imported by path), ``schema.json`` (a JSON Schema
    file) and ``grammar:NAME`` (a regex from `structspec.grammars`).
    """
    if arg.startswith("grammar:"):
        return _grammar(arg.removeprefix("grammar:"))
    if arg.endswith(".json"):
        try:
            return json.loads(Path(arg).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise JobConfigError(f"cannot read the JSON Schema file {arg}: {e}") from None
    module_name, sep, attr = arg.rpartition(":")
    if not sep or not module_name or not attr:
        raise JobConfigError(
            f"--schema {arg!r}: use package.module:Model, path/to/file.py:Model, schema.json or grammar:NAME"
        )
    module = import_file(module_name) if module_name.endswith(".py") else _import_module(module_name)
    try:
        obj: Any = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise JobConfigError(f"--schema {arg!r}: {module_name} has no attribute {attr!r}") from None
    return obj


def _import_module(name: str) -> Any:
    sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's own packages import from where they stand
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise JobConfigError(f"cannot import {name!r}: {e}") from None
    finally:
        sys.path.remove(os.getcwd())


def import_file(path: str | Path) -> ModuleType:
    """The Python file at ``path``, imported by path (a fresh module each call, not put in `sys.modules`).

    Any failure (no such file, an error in the file) is a `JobConfigError` saying which.
    """
    file = Path(path)
    spec = importlib.util.spec_from_file_location(f"_structspec_file_{file.stem}", file)
    if not file.is_file() or spec is None or spec.loader is None:
        raise JobConfigError(f"no Python file {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # any error in the user's file is a configuration error
        raise JobConfigError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    return module


def _grammar(name: str) -> structspec.Regex:
    try:
        found = structspec.grammars.get(name)
    except (StructspecError, LookupError) as e:
        raise JobConfigError(str(e)) from None
    return structspec.Regex(found) if isinstance(found, str) else found
