"""A job's output line, written and read back: one JSON object per record, on one line.

A line holds ``id``, ``input`` (where the record was: ``"line 7"``, ``"row 7"``, a file name), ``input_hash``
(a hash of its id and text) and either ``value`` or ``error`` (one of `ERROR_KINDS`), plus ``stats`` for a
record that ran. A line names its record by ``input`` and ``input_hash``, so repeated ids resume right; a line
without ``input_hash`` (older outputs) by ``input`` and its id.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import structspec
from structspec.errors import PromptError
from structspec.jobs.errors import JobConfigError
from structspec.jobs.records import InputRecord
from structspec.result import Result, Stats, no_pass_tokens

ERROR_KINDS = {
    "malformed_input": "the input line or file could not be read as a record",
    "empty_document": "the document text is empty",
    "unencodable_text": "the document holds text no tokenizer can encode (a lone surrogate such as \\ud800)",
    "too_long": "the prompt alone fills the model's context (no forward pass ran)",
    "token_budget": "--max-new-tokens ran out; the partial text is kept (--retry-errors with a larger budget reruns "
                    "it)",
    "max_context": "the model's context filled up during decoding; the partial text is kept",
    "invalid_output": "the output is complete but the schema's validator rejected it; the text is kept",
    "generation_failed": "the record could not run; the message names the error type",
}

NOT_OURS = "structspec extract changes only its own outputs: choose another --output"
LINE_START = b'{"id": '  # how every line a job writes starts (json.dumps of a row whose first key is "id")


def output_line(record: InputRecord, result: Result | None, max_new_tokens: int,
                cli_words: bool = False) -> dict[str, Any]:
    """The output line of one record: ``id``, ``input``, ``input_hash`` and either ``value`` or ``error``, plus
    ``stats``.

    ``result`` is None for a record that could not be read (``record.error`` says why): it never ran. With
    ``cli_words``, an error's fix names ``structspec extract``'s options, not `generate_result`'s keywords.
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
        if cli_words and kind == "token_budget":  # as --engine vllm's lines say it (`structspec.jobs.vllm`)
            message = (f"the output is incomplete: --max-new-tokens ({max_new_tokens}) ran out; rerun with a larger "
                       "--max-new-tokens and --retry-errors")
        return row | {"error": {"kind": kind, "message": message, "partial_text": result.text}, "stats": stats}
    return row | {"value": _jsonable(result.value), "stats": stats}


def _row_error(error: Exception | None) -> dict[str, str]:
    """A row that could not run, as an error field: its kind, and its error's type name and message."""
    # In a job every prompt holds a non-empty document, so a PromptError is a prompt that fills the context.
    kind = "too_long" if isinstance(error, PromptError) else "generation_failed"
    # the batch row in iter_batch's message ("row 3: ...") is an index into the job's own list: not the user's
    message = re.sub(r"^row \d+: ", "", str(error))
    return {"kind": kind, "message": f"{type(error).__name__}: {message}"}


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


def record_keys(where: str, record_id: str, input_hash: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The keys a record's line may be found under: its ``input_hash``, or (an older output's line) its id."""
    return (where, "hash " + input_hash), (where, "id " + record_id)


def line_key(row: dict[str, Any]) -> tuple[str, str]:
    """The key ``row``, a line read back, names its record by: one of its record's `record_keys`."""
    return (row["input"], "hash " + row["input_hash"]) if "input_hash" in row else (row["input"], "id " + row["id"])


def job_lines(path: Path, data: bytes) -> tuple[list[bytes], list[dict[str, Any]]]:
    """The job lines of ``data`` (blank lines and a torn last line left out) and their rows; `JobConfigError`
    naming the first line a job does not write."""
    end = data.rfind(b"\n") + 1
    lines, rows = [], []
    for n, line in enumerate(data[:end].split(b"\n")[:-1], 1):
        if not line.strip():
            continue
        row = _row(line)
        if row is None:
            raise JobConfigError(f"{path} line {n} is not a line of a structspec job ({line[:60]!r}): {NOT_OURS}")
        lines.append(line)
        rows.append(row)
    tail = data[end:]
    if tail and not (tail.startswith(LINE_START) or LINE_START.startswith(tail)):
        raise JobConfigError(f"{path} ends in text that is not a line of a structspec job ({tail[:60]!r}): "
                             f"{NOT_OURS}")
    return lines, rows


def _row(line: bytes) -> dict[str, Any] | None:
    """The row of a line a job writes (``id``, ``input``, and ``value`` or ``error``); None for any other line."""
    try:
        row = json.loads(line)
    except ValueError:  # not JSON, or not UTF-8
        return None
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not isinstance(row.get("input"), str):
        return None
    if not ("value" in row or isinstance(row.get("error"), dict)) or not isinstance(row.get("input_hash", ""), str):
        return None
    return row
