"""A job's output file: whose it is (its manifest), who writes it (its lock) and which records it holds.

Beside ``out.jsonl`` a job keeps ``out.jsonl.job.json``, its manifest: the
settings the lines were made with (model, spec, prompt template, options) and
the structspec version. A job locks that file (``flock``) while it writes, so a
second job on the same output is refused instead of writing every record again,
and a job whose settings differ from the manifest's is refused, naming what
differs. A file that is not a job's output (a line that is not one a job writes,
no manifest and no job lines) is refused before anything changes it. An output
written before manifests existed (job lines, no manifest) is taken over: its
manifest is written from the settings of the job that resumes it.

A line names its record by where it was in the input (``input``: ``"line 7"``,
``"row 7"``, a file name) and ``input_hash``, a hash of its id and text, so
repeated ids resume right; a line without ``input_hash`` (older outputs) by
where it was and its id.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

import structspec
from structspec.errors import StructspecError

MANIFEST_FORMAT = 1
NOT_OURS = "structspec extract changes only its own outputs: choose another --output"


class JobConfigError(Exception):
    """A job that cannot start: unknown schema, unreadable input, bad template, an output that is not a job's.
    Says what to fix."""


def job_manifest(model: str, spec: Any, template: str, generate: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a job's output: the settings its lines depend on (the model, hashes of the spec and the
    prompt template, the ``generate_result`` options that differ from their defaults) and the structspec
    version (recorded, not compared). The drafter and the batch size are left out: verified drafts and
    batching keep the output. `JobConfigError` for options ``generate_result`` does not take."""
    try:
        chosen = structspec.GenerateOptions.of(generate)
    except StructspecError as e:
        raise JobConfigError(str(e)) from None
    changed = {f.name: getattr(chosen, f.name) for f in dataclasses.fields(chosen)
               if f.name != "draft" and getattr(chosen, f.name) != f.default}
    model_id = str(Path(model).resolve()) if os.path.isdir(model) else model  # a directory, wherever named from
    try:
        version = importlib.metadata.version(importlib.metadata.packages_distributions()["structspec"][0])
    except (KeyError, importlib.metadata.PackageNotFoundError):
        version = "unknown"
    settings = {"model": model_id, "spec": _digest(_spec_text(spec)), "prompt template": _digest(template),
                "options": json.loads(json.dumps(changed))}  # as read back: tuples become lists
    return {"structspec_job": MANIFEST_FORMAT, "structspec": version, "settings": settings}


def _spec_text(spec: Any) -> str:
    """The text a spec is known by: a regex's pattern, a JSON Schema's canonical JSON, a type's JSON Schema."""
    if isinstance(spec, structspec.Regex):
        return "regex " + spec.pattern
    if isinstance(spec, (dict, bool, str)):
        return json.dumps(spec, sort_keys=True)
    try:
        return json.dumps(TypeAdapter(spec).json_schema(), sort_keys=True)
    except Exception:  # a spec Pydantic cannot describe: the job's spec check says why; its repr names it here
        return repr(spec)


def _digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def manifest_path(output: str | Path) -> Path:
    """The manifest (and lock) file of ``output``: the same name with ``.job.json`` added."""
    p = Path(output)
    return p.with_name(p.name + ".job.json")


def check_output(output: str | Path, input_path: str | Path | None = None) -> None:
    """Raise `JobConfigError` unless ``output`` can be a job's output: a file (or none yet) in an existing
    folder, not ``input_path``, and, when it holds anything but has no manifest, only job lines (and at most a
    torn last one). Reads; changes nothing."""
    p = Path(output)
    folder = p.parent
    if p.is_dir():
        raise JobConfigError(f"--output {p} is a folder: give a file in it, e.g. {p / 'out.jsonl'}")
    if not folder.is_dir():
        raise JobConfigError(f"the folder of --output {p} does not exist ({folder}): create it "
                             f"(mkdir -p {folder}) or choose another --output")
    if input_path is not None and p.exists() and os.path.samefile(p, input_path):
        raise JobConfigError(f"--output {p} is the --input file: choose another --output")
    if p.exists() and not _read_manifest(p):
        data = _read(p)
        if data.strip() and not _job_lines(p, data)[0]:
            raise JobConfigError(f"{p} holds no line of a structspec job: {NOT_OURS}")


@contextmanager
def claimed(output: str | Path, manifest: dict[str, Any]) -> Iterator[None]:
    """Hold the lock of ``output`` for the block, with ``manifest`` as its manifest.

    Writes the manifest when ``output`` is missing or empty (a new job), or has job lines and no manifest (an
    older output). `JobConfigError` when another process holds the lock or the output was written with other
    settings; nothing is changed then.
    """
    path = manifest_path(output)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise JobConfigError(f"cannot write {path}, the manifest of --output {output} ({e.strerror}): "
                             "choose an --output in a folder you can write") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JobConfigError(f"another job is writing {output} (it holds the lock on {path}): wait for it to "
                                 "end, or choose another --output") from None
        held = _read_manifest(Path(output))
        if held and _read(Path(output)).strip():
            if held.get("settings") != manifest["settings"]:
                _refuse_other_settings(output, held.get("settings", {}), manifest["settings"])
        elif held != manifest:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(manifest, indent=1) + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _refuse_other_settings(output: str | Path, held: dict[str, Any], settings: dict[str, Any]) -> None:
    """`JobConfigError` naming each setting that differs between the manifest's and this job's."""
    differ = []
    for name in sorted(held.keys() | settings.keys()):
        there, here = held.get(name), settings.get(name)
        if there == here:
            continue
        if isinstance(there, dict) and isinstance(here, dict) and name == "options":
            differ += [f"{name}.{k} {there.get(k)!r} there, {here.get(k)!r} now"
                       for k in sorted(there.keys() | here.keys()) if there.get(k) != here.get(k)]
        elif name == "model":
            differ.append(f"model {there!r} there, {here!r} now")
        else:
            differ.append(f"the {name} differs")
    raise JobConfigError(f"{output} was written with other settings ({'; '.join(differ)}; see "
                         f"{manifest_path(output)}): rerun with those settings to resume, or choose another --output")


def _read_manifest(output: Path) -> dict[str, Any] | None:
    """The manifest of ``output``; None when there is none (or it is empty: its job had not started)."""
    path = manifest_path(output)
    if not path.exists():
        return None
    text = _read(path).strip()
    if not text:
        return None
    try:
        manifest = json.loads(text)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("structspec_job") != MANIFEST_FORMAT:
        raise JobConfigError(f"{path} is not the manifest of a structspec job: remove it, or choose another --output")
    return manifest


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise JobConfigError(f"cannot read {path} ({e.strerror}): make it readable, or choose another --output") \
            from None


def done_keys(output: str | Path, retry_errors: bool = False) -> set[tuple[str, str]]:
    """The keys (`record_keys`) of the records ``output`` has a line for; none when it is missing.

    Cuts off a torn last line (what a power cut mid-write leaves), and with
    ``retry_errors`` drops the error lines (through a temp file and a rename), so
    those records run again. Call it while holding the lock (`claimed`). A line
    that is not a job's raises `JobConfigError` and nothing is changed.
    """
    p = Path(output)
    if not p.exists():
        return set()
    data = _read(p)
    lines, rows = _job_lines(p, data)
    if retry_errors:
        lines, rows = [line for line, row in zip(lines, rows) if "error" not in row], \
            [row for row in rows if "error" not in row]
    kept = b"".join(line + b"\n" for line in lines)
    if kept != data:
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_bytes(kept)
        os.replace(tmp, p)
    return {_line_key(row) for row in rows}


def record_keys(where: str, record_id: str, input_hash: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """The keys a record's line may be found under: its ``input_hash``, or (an older output's line) its id."""
    return (where, "hash " + input_hash), (where, "id " + record_id)


def _line_key(row: dict[str, Any]) -> tuple[str, str]:
    return (row["input"], "hash " + row["input_hash"]) if "input_hash" in row else (row["input"], "id " + row["id"])


LINE_START = b'{"id": '  # how every line a job writes starts (json.dumps of a row whose first key is "id")


def _job_lines(path: Path, data: bytes) -> tuple[list[bytes], list[dict[str, Any]]]:
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
