"""The shipped example data that the commands and the benchmarks read: the extraction task set (documents, their
schema, the expected fields), and the spec a command's ``--schema`` names.

Every method in a benchmark gets the same `extraction_prompt`, so the prompt is
short and neutral: it names the fields and asks for JSON, nothing more.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from structspec.jobs import spec as job_spec
from structspec.jobs.errors import JobConfigError

EXAMPLE_DATA = "structspec.example_data"  # the clone's examples/, shipped inside the wheel under this name


@dataclass(frozen=True)
class Task:
    """One document to extract ``schema`` from; ``expected`` is the reference value (None if unknown)."""

    id: str
    schema_name: str
    schema: type[BaseModel]
    text: str
    expected: dict[str, Any] | None


def example_file(name: str) -> Path:
    """The path of the shipped example file ``name`` (``examples/NAME`` in a clone, inside the installed package
    otherwise), whatever the working directory. Reads nothing."""
    return Path(str(files(EXAMPLE_DATA).joinpath(name)))  # a real file: the package is installed unzipped


@contextmanager
def importable_beside(file: Path | None) -> Iterator[None]:
    """While the block runs, modules beside ``file`` import by name (its folder first on `sys.path`), as
    ``python file.py`` would let them; None changes nothing. The path is put back after."""
    if file is None:
        yield
        return
    folder = str(file.resolve().parent)
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        sys.path.remove(folder)


def load_spec(arg: str) -> Any:
    """`structspec.jobs.spec.load_spec` (``package.module:Model``, ``path/to/file.py:Model``, ``schema.json``,
    ``grammar:NAME``), a Python file importing the modules beside it."""
    module, _, _ = arg.rpartition(":")
    with importable_beside(Path(module) if module.endswith(".py") else None):
        return job_spec.load_spec(arg)


def load_schemas(path: str | Path | None = None) -> dict[str, type[BaseModel]]:
    """The ``SCHEMAS`` dict of a Python file (None: the shipped ``examples/schemas.py``), imported by path with
    the modules beside it importable (`JobConfigError` when it cannot be)."""
    file = example_file("schemas.py") if path is None else Path(path)
    with importable_beside(file):
        module = job_spec.import_file(file)
    if not isinstance(getattr(module, "SCHEMAS", None), dict):
        raise JobConfigError(f"{path} has no SCHEMAS dict; define SCHEMAS = {{'name': Model, ...}} in it")
    return module.SCHEMAS


def load_tasks(path: str | Path | None = None, schemas: str | Path | None = None) -> list[Task]:
    """Read a JSONL file of ``{"id", "schema", "text", "expected"}`` records, each schema named in the
    ``SCHEMAS`` of ``schemas`` (None: the shipped ``examples/tasks.jsonl`` and ``examples/schemas.py``)."""
    by_name = load_schemas(schemas)
    file = example_file("tasks.jsonl") if path is None else Path(path)
    tasks = []
    for line in file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        name = record["schema"]
        if name not in by_name:
            raise KeyError(f"task {record['id']!r} names schema {name!r}; known: {', '.join(by_name)}")
        tasks.append(Task(record["id"], name, by_name[name], record["text"], record.get("expected")))
    return tasks


def extraction_prompt(text: str, schema: type[BaseModel]) -> list[dict[str, str]]:
    """Chat messages asking to extract ``schema``'s fields from ``text`` as JSON."""
    fields = ", ".join(schema.model_fields)
    return [{
        "role": "user",
        "content": f"Extract the following fields from the document as JSON: {fields}.\n\nDocument:\n{text}",
    }]


def field_accuracy(value: dict[str, Any], expected: dict[str, Any]) -> float:
    """Share of ``expected``'s top-level fields that ``value`` has equal.

    Numbers compare with a small relative tolerance, strings case-insensitively
    after stripping; lists and objects compare element by element the same way.
    """
    if not expected:
        return 1.0
    hits = sum(name in value and _same(value[name], want) for name, want in expected.items())
    return hits / len(expected)


def _same(got: Any, want: Any) -> bool:
    if isinstance(got, bool) or isinstance(want, bool):
        return got is want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)
    if isinstance(got, str) and isinstance(want, str):
        return got.strip().casefold() == want.strip().casefold()
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    return got == want
