"""A job's input records: a JSONL file, a CSV file with a header row, or a folder of ``.txt`` files.

A record that cannot be read is still a record, with its error (`structspec.jobs.lines.ERROR_KINDS`), so its
line says why; only an input that cannot be read as a whole is a `JobConfigError`.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structspec.jobs.errors import JobConfigError


@dataclass(frozen=True)
class InputRecord:
    """One document, or the reason it could not be read (``error``: its kind, one of
    `structspec.jobs.lines.ERROR_KINDS`, and why)."""

    id: str
    where: str  # "line 7", "row 7" or a file name: where to look in the input
    text: str = ""
    error: tuple[str, str] | None = None
    expected: Any = field(default=None, compare=False)  # ``expected_field``'s value, for reports that score outputs

    @property
    def input_hash(self) -> str:
        """A hash of the id and text: with ``where``, what names the record's line in the output."""
        return hashlib.sha256(json.dumps([self.id, self.text]).encode()).hexdigest()[:16]


def read_inputs(path: str | Path, text_field: str = "text", id_field: str = "id",
                expected_field: str | None = None) -> list[InputRecord]:
    """The records of a JSONL file, a CSV file (with a header row) or a folder of ``.txt`` files; with
    ``expected_field``, each record's ``expected`` is that field's value (None where it has none), which jobs do
    not read and `structspec compare` scores outputs by.

    A record without an id gets ``<line N>`` (``<row N>``) as its id, so reruns
    recognize it (`unnamed` counts them). A folder's ``.txt`` file that is a job's output (it has a job manifest
    beside it) is not a document: a job never reads its own output. Raises `JobConfigError` only when the input
    as a whole cannot be read, or its first record (CSV: its header) has no ``text_field``.
    """
    p = Path(path)
    fields = (text_field, id_field, expected_field)
    try:
        if p.is_dir():
            if expected_field is not None:
                raise JobConfigError(f"{path} is a folder of .txt files, which hold no {expected_field!r} field: "
                                     "give the documents and their expected values as JSONL or CSV")
            return _read_folder(p)
        if p.suffix.lower() == ".csv":
            with p.open(encoding="utf-8-sig", newline="") as f:  # newline="": the csv module splits the lines
                return _read_csv(f, *fields)
        return list(_read_jsonl(p.read_bytes(), *fields))
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else e
        raise JobConfigError(f"cannot read the input {path} ({reason}): check --input") from None


def input_record(fields: dict[str, Any], where: str, text_field: str = "text", id_field: str = "id",
                 expected_field: str | None = None) -> InputRecord:
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
    unencodable = text_error(text)
    if unencodable is not None:
        return InputRecord(rid, where, error=("unencodable_text", f"{where}: {unencodable}"))
    return InputRecord(rid, where, text, expected=None if expected_field is None else fields.get(expected_field))


def text_error(text: str) -> str | None:
    """Why no tokenizer can take ``text`` (a lone surrogate, ``"\\ud800"`` in JSON: UTF-8 has no such
    character), with the fix; None if it can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return (f"the document holds a lone surrogate (U+{ord(text[e.start]):04X} at character {e.start}), which "
                "UTF-8 cannot encode and no tokenizer takes; fix the input (a \\ud800-\\udfff escape belongs in "
                "a pair)")
    return None


def _read_jsonl(data: bytes, text_field: str, id_field: str, expected_field: str | None) -> Iterator[InputRecord]:
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
        yield input_record(fields, where, text_field, id_field, expected_field)


def _read_csv(lines: Iterable[str], text_field: str, id_field: str, expected_field: str | None) -> list[InputRecord]:
    reader = csv.DictReader(lines)
    try:
        if text_field not in (reader.fieldnames or []):
            raise JobConfigError(f"the CSV has no {text_field!r} column (columns: "
                                 f"{', '.join(reader.fieldnames or [])}): pass --text-field with the one that holds "
                                 "the document")
        return [input_record(row, f"row {reader.line_num}", text_field, id_field, expected_field) for row in reader]
    except csv.Error as e:
        raise JobConfigError(f"the CSV is malformed at line {reader.line_num}: {e}") from None


def unnamed(records: list[InputRecord]) -> int:
    """How many of ``records`` were read but had no id, so are named by where they are (``<line N>``, ``<row N>``);
    a line that could not be read at all is its error's to report."""
    return sum(record.id == f"<{record.where}>" and not record.error for record in records)


def manifest_path(output: str | Path) -> Path:
    """The manifest (and lock) file of ``output`` (`structspec.jobs.manifest`): the same name with ``.job.json``
    added. Here, below the manifest's module, because reading a folder skips a job's own output by it."""
    p = Path(output)
    return p.with_name(p.name + ".job.json")


def _read_folder(folder: Path) -> list[InputRecord]:
    files = sorted(f for f in folder.glob("*.txt") if not manifest_path(f).exists())
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
