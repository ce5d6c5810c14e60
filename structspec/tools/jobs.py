"""Extraction jobs: one spec, many documents, one JSONL line per document.

    structspec extract --schema examples/schemas.py:Invoice --input docs.jsonl --output out.jsonl

Documents are decoded ``batch_size`` at a time (`structspec.iter_batch`), and
each record's line is written the moment its row finishes, so lines come in the
order rows finish, not the input's order. A job is resumable and crash-safe:
each line is written with a single ``write`` to a file opened for appending, so
a killed job leaves whole lines behind; on start a torn last line (power loss) is
cut off, and every input record that already has a line is skipped: a line names
its record by its place in the input and a hash of its id and text, so repeated
ids resume right. Rerunning the same command after Ctrl-C or ``kill -9``
therefore writes each record exactly once, whatever order the rows finished in.
The output keeps a manifest beside it, locked while a job writes: a second job
on the same output, a rerun with other settings, and an output that is not a
job's are refused before anything is written (`structspec.tools.outputs`).
``extract --ray`` runs the same job, with the same lines and resume, on a Ray
cluster (`structspec.integrations.ray`).

Bad input never stops a job: a malformed line, an empty document, a prompt
that fills the model's context, a token budget or context that runs out and a
row that cannot run are each written as that record's error (`ERROR_KINDS`) and
counted in the summary. Only configuration errors (`JobConfigError`: a spec,
option, input or output that cannot be used, a file that cannot be read or
written) stop it, before any record runs.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import importlib
import importlib.util
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from pydantic import BaseModel

import structspec
from structspec.decoding.factory import DRAFT_NAMES
from structspec.errors import PromptError, StructspecError
from structspec.tools.explain import no_pass_tokens
from structspec.tools.outputs import (
    JobConfigError,
    check_output,
    claimed,
    done_keys,
    job_manifest,
    record_keys,
)
from structspec.lm import LM, Prompt
from structspec.result import Result, Stats

ERROR_KINDS = {
    "malformed_input": "the input line or file could not be read as a record",
    "empty_document": "the document text is empty",
    "too_long": "the prompt alone fills the model's context (no forward pass ran)",
    "token_budget": "max_new_tokens ran out; the partial text is kept",
    "max_context": "the model's context filled up during decoding; the partial text is kept",
    "invalid_output": "the output is complete but the schema's validator rejected it; the text is kept",
    "generation_failed": "the record could not run; the message names the error type",
}

DEFAULT_BATCH_SIZE = {"cpu": 8, "cuda": 32}  # rows per target pass, by the model's device type


# ---------------------------------------------------------------- the spec


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


def default_template(spec: Any) -> str:
    """The instruction used without ``--prompt-template``: name the fields (if any), ask for JSON or the value."""
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        fields = list(spec.model_fields)
    elif isinstance(spec, dict):
        fields = list(spec.get("properties", {}))
    else:
        return "Extract the value from the document.\n\nDocument:\n{document}"
    return f"Extract the following fields from the document as JSON: {', '.join(fields)}.\n\nDocument:\n{{document}}"


def read_template(path: str) -> str:
    try:
        template = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise JobConfigError(f"cannot read the prompt template {path}: {e}") from None
    if "{document}" not in template:
        raise JobConfigError(f"the prompt template {path} has no {{document}} placeholder")
    return template


# ---------------------------------------------------------------- input


@dataclass(frozen=True)
class InputRecord:
    """One document, or the reason it could not be read (``error`` then says which `ERROR_KINDS` and why)."""

    id: str
    where: str  # "line 7", "row 7" or a file name: where to look in the input
    text: str = ""
    error: tuple[str, str] | None = None

    @property
    def input_hash(self) -> str:
        """A hash of the id and text: with ``where``, what names the record's line in the output."""
        return hashlib.sha256(json.dumps([self.id, self.text]).encode()).hexdigest()[:16]


def read_inputs(path: str | Path, text_field: str = "text", id_field: str = "id") -> list[InputRecord]:
    """The records of a JSONL file, a CSV file (with a header row) or a folder of ``.txt`` files.

    A record without an id gets ``<line N>`` (``<row N>``) as its id, so reruns
    recognize it. Raises `JobConfigError` only when the input as a whole cannot be read, or its first record
    (CSV: its header) has no ``text_field``.
    """
    p = Path(path)
    try:
        if p.is_dir():
            return _read_folder(p)
        if p.suffix.lower() == ".csv":
            with p.open(encoding="utf-8-sig", newline="") as f:  # newline="": the csv module splits the lines
                return _read_csv(f, text_field, id_field)
        return list(_read_jsonl(p.read_bytes(), text_field, id_field))
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else e
        raise JobConfigError(f"cannot read the input {path} ({reason}): check --input") from None


def input_record(fields: dict[str, Any], where: str, text_field: str = "text", id_field: str = "id") -> InputRecord:
    """The record in ``fields`` (a JSON object, a CSV row, a dataset row), found at ``where``.

    A missing id becomes ``<where>``; a missing, non-string or empty text is the record's error.
    """
    raw_id = fields.get(id_field)
    rid = f"<{where}>" if raw_id in (None, "") else str(raw_id)
    text = fields.get(text_field)
    if not isinstance(text, str):
        reason = f"no {text_field!r} field" if text is None else f"{text_field!r} is not a string"
        return InputRecord(rid, where, error=("malformed_input", f"{where}: {reason}"))
    if not text.strip():
        return InputRecord(rid, where, error=("empty_document", f"{where}: the document is empty"))
    return InputRecord(rid, where, text)


def _read_jsonl(data: bytes, text_field: str, id_field: str) -> Iterator[InputRecord]:
    first = True
    for n, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            fields = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            yield InputRecord(f"<{where}>", where, error=("malformed_input", f"{where}: not JSON ({e})"))
            continue
        if not isinstance(fields, dict):
            yield InputRecord(f"<{where}>", where, error=("malformed_input", f"{where}: not a JSON object"))
            continue
        if first and text_field not in fields:  # every record would fail alike: a wrong --text-field
            raise JobConfigError(f"{where}, the first record, has no {text_field!r} field (its fields: "
                                 f"{', '.join(fields) or 'none'}): pass --text-field with the one that holds the "
                                 "document")
        first = False
        yield input_record(fields, where, text_field, id_field)


def _read_csv(lines: Iterable[str], text_field: str, id_field: str) -> list[InputRecord]:
    reader = csv.DictReader(lines)
    try:
        if text_field not in (reader.fieldnames or []):
            raise JobConfigError(f"the CSV has no {text_field!r} column (columns: "
                                 f"{', '.join(reader.fieldnames or [])}): pass --text-field with the one that holds "
                                 "the document")
        return [input_record(row, f"row {reader.line_num}", text_field, id_field) for row in reader]
    except csv.Error as e:
        raise JobConfigError(f"the CSV is malformed at line {reader.line_num}: {e}") from None


def _read_folder(folder: Path) -> list[InputRecord]:
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise JobConfigError(f"no .txt files in {folder}")
    records = []
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            records.append(InputRecord(f.stem, f.name, error=("malformed_input", f"{f.name}: not UTF-8 ({e})")))
            continue
        records.append(input_record({"id": f.stem, "text": text}, f.name))
    return records


# ---------------------------------------------------------------- output


def stats_record(stats: Stats, sources: list[str]) -> dict[str, Any]:
    """A generation's stats as JSON fields, with ``no_pass_tokens`` counted from the sources."""
    out = {k: v for k, v in dataclasses.asdict(stats).items() if k != "tokens_fed"}
    out["passes_per_token"] = stats.passes_per_token
    out["no_pass_tokens"] = no_pass_tokens(sources)
    return _rounded(out)


def _rounded(value: Any) -> Any:
    """Floats to 4 decimals, inside dicts too: seconds and shares need no more in a JSONL line."""
    if isinstance(value, float):
        return round(value, 4)
    return {k: _rounded(v) for k, v in value.items()} if isinstance(value, dict) else value


def _jsonable(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


# ---------------------------------------------------------------- running


@dataclass(frozen=True)
class JobOptions:
    """How records run: the prompt template (with ``{document}``), `generate_result`'s keywords, and the rows
    decoded together (None: `DEFAULT_BATCH_SIZE` for the model's device)."""

    template: str
    generate: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None

    @property
    def max_new_tokens(self) -> int:
        return self.generate.get("max_new_tokens", 512)  # generate_result's default

    def rows_per_pass(self, lm: LM) -> int:
        """``batch_size``, or the default for ``lm``'s device (does not touch the model)."""
        return default_batch_size(lm) if self.batch_size is None else self.batch_size


def default_batch_size(lm: LM) -> int:
    """The rows per target pass a job uses on ``lm``'s device when none is given (does not touch the model)."""
    return DEFAULT_BATCH_SIZE.get(lm.device.type, DEFAULT_BATCH_SIZE["cpu"])


def build_prompt(lm: LM, template: str, document: str) -> Prompt:
    """The template with the document in; one user message when the tokenizer has a chat template."""
    content = template.replace("{document}", document)  # not str.format: templates may hold JSON braces
    return [{"role": "user", "content": content}] if getattr(lm.tokenizer, "chat_template", None) else content


def output_line(record: InputRecord, result: Result | None, max_new_tokens: int) -> dict[str, Any]:
    """The output line of one record: ``id``, ``input``, ``input_hash`` and either ``value`` or ``error``, plus
    ``stats``.

    ``result`` is None for a record that could not be read (``record.error`` says why): it never ran.
    """
    row: dict[str, Any] = {"id": record.id, "input": record.where, "input_hash": record.input_hash}
    if record.error:
        kind, message = record.error
        return row | {"error": {"kind": kind, "message": message}}
    if result.stop_reason == "error":
        return row | {"error": _row_error(result.error)}
    stats = stats_record(result.stats, result.sources)
    if result.stop_reason == "invalid":
        message = f"{type(result.error.__cause__).__name__}: {result.error}"
        return row | {"error": {"kind": "invalid_output", "message": message, "partial_text": result.text},
                      "stats": stats}
    if not result.complete:  # max_new_tokens or the context ran out; `generate`'s message says which
        message = str(structspec.TokenBudgetExceeded(max_new_tokens, result))
        kind = "max_context" if result.stop_reason == "max_context" else "token_budget"
        return row | {"error": {"kind": kind, "message": message, "partial_text": result.text}, "stats": stats}
    return row | {"value": _jsonable(result.value), "stats": stats}


def _row_error(error: Exception | None) -> dict[str, str]:
    """A row that could not run, as an error field: its kind, and its error's type name and message."""
    # In a job every prompt holds a non-empty document, so a PromptError is a prompt that fills the context.
    kind = "too_long" if isinstance(error, PromptError) else "generation_failed"
    # the batch row in iter_batch's message ("row 3: ...") is an index into the job's own list: not the user's
    message = re.sub(r"^row \d+: ", "", str(error))
    return {"kind": kind, "message": f"{type(error).__name__}: {message}"}


@dataclass
class JobSummary:
    """What a run did: records skipped (done before), written ok, and failed by error kind."""

    total: int = 0
    skipped: int = 0
    ok: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    output_tokens: int = 0
    no_pass_tokens: int = 0
    seconds: float = 0.0

    @property
    def written(self) -> int:
        return self.ok + sum(self.failed.values())

    def describe(self) -> str:
        failed = ", ".join(f"{kind} {n}" for kind, n in sorted(self.failed.items()))
        return (f"{self.total} records: {self.ok} extracted, {sum(self.failed.values())} failed"
                + (f" ({failed})" if failed else "") + f", {self.skipped} already done; "
                f"{self.output_tokens} tokens, {self.no_pass_tokens / max(self.output_tokens, 1):.0%} "
                f"without a forward pass, {self.seconds:.1f} s")


def check_job(lm: LM, spec: Any, options: JobOptions) -> None:
    """Raise `JobConfigError` when ``spec`` cannot be used on ``lm`` or ``options`` are bad, before any record runs.

    Compiles the spec (which fills the compile cache); runs no forward pass.
    """
    try:
        structspec.compile(spec, lm)
    except StructspecError as e:
        raise JobConfigError(f"the schema cannot be used: {e}") from None
    try:  # no prompts: only the options are checked
        list(structspec.iter_batch(lm, spec, [], batch_size=options.rows_per_pass(lm), **options.generate))
    except StructspecError as e:
        raise JobConfigError(str(e)) from None


def record_lines(
    lm: LM, spec: Any, records: list[InputRecord], options: JobOptions
) -> Iterator[tuple[int, Result | None, dict[str, Any]]]:
    """Each record's index in ``records``, `Result` (None for a record that could not be read) and output line:
    records that could not be read first, then the others as their rows finish, decoded
    ``options.rows_per_pass(lm)`` rows per target pass. Run `check_job` first: bad options raise here."""
    todo = [i for i, record in enumerate(records) if not record.error]
    for i, record in enumerate(records):
        if record.error:
            yield i, None, output_line(record, None, options.max_new_tokens)
    if todo:
        prompts = [build_prompt(lm, options.template, records[i].text) for i in todo]
        for k, result in structspec.iter_batch(lm, spec, prompts, batch_size=options.rows_per_pass(lm),
                                               **options.generate):
            yield todo[k], result, output_line(records[todo[k]], result, options.max_new_tokens)


def resume(
    records: list[InputRecord], output: str | Path, retry_errors: bool = False
) -> tuple[JobSummary, list[InputRecord]]:
    """The records of a job that ``output`` has no line for yet, and a summary that counts the others as skipped.

    Changes ``output`` as `structspec.tools.outputs.done_keys` does (cuts a torn last line; drops error lines with
    ``retry_errors``): call it while holding the output's lock.
    """
    done = done_keys(output, retry_errors)
    summary = JobSummary(total=len(records))
    todo: list[InputRecord] = []
    for record in records:
        if done.intersection(record_keys(record.where, record.id, record.input_hash)):
            summary.skipped += 1
        else:
            todo.append(record)
    return summary, todo


@contextmanager
def appending(
    output: str | Path, summary: JobSummary, on_record: Callable[[JobSummary], None] = lambda summary: None
) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Open ``output`` for appending and give ``write(line)``, which appends one record's line and counts it in
    ``summary`` (then calls ``on_record``); the file is closed when the block ends. A file that cannot be
    written is a `JobConfigError`."""
    start = time.perf_counter()
    try:
        fd = os.open(output, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise JobConfigError(f"cannot write --output {output} ({e.strerror}): choose a file you can write") from None

    def write(row: dict[str, Any]) -> None:
        line = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        try:
            written = os.write(fd, line)  # one write: a killed job never leaves half a line
        except OSError as e:
            written = e
        if written != len(line):  # what was written is cut off when the job resumes
            reason = written.strerror if isinstance(written, OSError) else "a short write"
            raise JobConfigError(f"writing to {output} failed ({reason}): free some space, then rerun the same "
                                 "command to resume")
        if "error" in row:
            summary.failed[row["error"]["kind"]] += 1
        else:
            summary.ok += 1
        stats = row.get("stats", {})
        summary.output_tokens += stats.get("output_tokens", 0)
        summary.no_pass_tokens += stats.get("no_pass_tokens", 0)
        summary.seconds = time.perf_counter() - start
        on_record(summary)

    try:
        yield write
    finally:
        os.close(fd)
        summary.seconds = time.perf_counter() - start


@contextmanager
def job_output(
    output: str | Path, manifest: dict[str, Any], records: list[InputRecord], retry_errors: bool = False,
    on_record: Callable[[JobSummary], None] = lambda summary: None,
) -> Iterator[tuple[JobSummary, list[InputRecord], Callable[[dict[str, Any]], None]]]:
    """Claim ``output`` for a job with ``manifest`` (`job_manifest`) and give its summary, the records it has no
    line for yet, and ``write(line)`` (see `appending`); the lock is released when the block ends.

    `JobConfigError`, before anything is written, for an output that is not a job's, is being written by
    another job, or was written with other settings (`structspec.tools.outputs`).
    """
    check_output(output)
    with claimed(output, manifest):
        summary, todo = resume(records, output, retry_errors)
        with appending(output, summary, on_record) as write:
            yield summary, todo, write


def run_job(
    lm: LM,
    spec: Any,
    records: list[InputRecord],
    output: str | Path,
    options: JobOptions,
    on_record: Callable[[JobSummary], None] = lambda summary: None,
    retry_errors: bool = False,
) -> JobSummary:
    """Run every record not already in ``output`` and append its line as it finishes; ``on_record`` sees the
    running summary.

    Checks the spec, the options and the output first (`check_job`, `job_output`), so a bad one raises
    `JobConfigError` before any record runs. Records that could not be read are written first; the
    others are decoded ``options.batch_size`` rows per pass.
    """
    check_job(lm, spec, options)
    manifest = job_manifest(lm.name, spec, options.template, options.generate)
    with job_output(output, manifest, records, retry_errors, on_record) as (summary, todo, write):
        for _, _, row in record_lines(lm, spec, todo, options):
            write(row)
    return summary


def load_model(name: str, device: str = "auto", dtype: str | None = None, kernels: str = "auto") -> LM:
    """`structspec.load` on ``device`` in ``dtype`` (None: the device's default) with ``kernels``; an unknown
    name or a device that is not there is a `JobConfigError`."""
    try:
        return structspec.load(name, device=device, dtype=dtype, kernels=kernels)
    except StructspecError as e:
        raise JobConfigError(str(e)) from None


def resolve_draft(name: str | None, device: str = "auto", dtype: str | None = None) -> Any:
    """``generate_result``'s ``draft=`` for ``--draft NAME``: a drafter's name as is, else a model to load
    (on ``device`` in ``dtype``, as the target)."""
    if name is None or name == "none":
        return None
    if name in DRAFT_NAMES:
        return name
    try:
        return load_model(name, device, dtype)
    except JobConfigError as e:
        raise JobConfigError(f"--draft {name}: {e}") from None
