"""Whose a job's output is: its manifest, its lock, and the refusal of files that are not a job's.

Beside ``out.jsonl`` a job keeps ``out.jsonl.job.json``, its manifest: the
settings the lines were made with (model, spec, prompt template, options) and
the structspec version. A job locks that file (``flock``) while it writes, so a
second job on the same output is refused instead of writing every record again,
and a job whose settings differ from the manifest's is refused, naming what
differs. A file that is not a job's output (a line that is not one a job writes,
no manifest and no job lines) is refused before anything changes it. An output
written before manifests existed (job lines, no manifest) is taken over: its
manifest is written from the settings of the job that resumes it.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.metadata
import json
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

import structspec
from structspec.errors import StructspecError
from structspec.jobs.errors import JobConfigError
from structspec.jobs.lines import NOT_OURS, job_lines
from structspec.jobs.records import manifest_path

MANIFEST_FORMAT = 1


def job_manifest(
    model: str, spec: Any, template: str, generate: dict[str, Any], engine: str = "structspec"
) -> dict[str, Any]:
    """The manifest of a job's output: the settings its lines depend on (the model, hashes of the spec and the
    prompt template, the options of ``generate`` (``iter_batch``'s keywords, compile options too) that differ from
    their defaults, and the engine when it is not structspec's own loop) and the structspec version (recorded, not
    compared). The drafter and the batch size are left out: verified drafts and batching keep the output.
    `JobConfigError` for options ``iter_batch`` does not take. Loads no model."""
    changed = changed_options(generate)
    model_id = str(Path(model).resolve()) if os.path.isdir(model) else model  # a directory, wherever named from
    try:
        version = importlib.metadata.version(importlib.metadata.packages_distributions()["structspec"][0])
    except (KeyError, importlib.metadata.PackageNotFoundError):
        version = "unknown"
    settings = {"model": model_id, "spec": _digest(_spec_text(spec)), "prompt template": _digest(template),
                "options": json.loads(json.dumps(changed))}  # as read back: tuples become lists
    if engine != "structspec":  # (left out for structspec's loop: the manifests written before engines existed)
        settings["engine"] = engine
    return {"structspec_job": MANIFEST_FORMAT, "structspec": version, "settings": settings}


def changed_options(generate: dict[str, Any]) -> dict[str, Any]:
    """The options of ``generate`` (``iter_batch``'s keywords, the draft left out: a name of a draft model too)
    that differ from their defaults; `JobConfigError` naming an option ``iter_batch`` does not take or a bad
    value. Loads nothing."""
    compile_names = {f.name for f in dataclasses.fields(structspec.CompileOptions)}
    generate = {k: v for k, v in generate.items() if k != "draft"}
    try:
        chosen = [structspec.GenerateOptions.of({k: v for k, v in generate.items() if k not in compile_names}),
                  structspec.CompileOptions.of({k: v for k, v in generate.items() if k in compile_names})]
    except StructspecError as e:
        raise JobConfigError(str(e)) from None
    return {f.name: getattr(options, f.name) for options in chosen for f in dataclasses.fields(options)
            if f.name != "draft" and getattr(options, f.name) != f.default}


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


def check_output(output: str | Path, input_path: str | Path | None = None) -> None:
    """Raise `JobConfigError` unless ``output`` can be a job's output: a file (or none yet) in an existing
    folder, whose manifest is not ``input_path`` nor it itself, and, when it holds anything but has no manifest,
    only job lines (and at most a torn last one). Reads; changes nothing."""
    p = Path(output)
    folder = p.parent
    if p.is_dir():
        raise JobConfigError(f"--output {p} is a folder: give a file in it, e.g. {p / 'out.jsonl'}")
    if not folder.is_dir():
        raise JobConfigError(f"the folder of --output {p} does not exist ({folder}): create it "
                             f"(mkdir -p {folder}) or choose another --output")
    if input_path is not None and p.exists() and os.path.samefile(p, input_path):
        raise JobConfigError(f"--output {p} is the --input file: choose another --output")
    manifest = manifest_path(p)
    if input_path is not None and manifest.exists() and os.path.samefile(manifest, input_path):
        raise JobConfigError(f"--input {input_path} is the manifest of --output {p}: give the documents as --input")
    if p.exists() and not _read_manifest(p):
        data = read_bytes(p)
        if data.strip() and not job_lines(p, data)[0]:
            raise JobConfigError(f"{p} holds no line of a structspec job: {NOT_OURS}")


def check_settings(output: str | Path, manifest: dict[str, Any], retry_errors: bool = False) -> bool:
    """Raise `JobConfigError` when ``output`` was written with settings other than ``manifest``'s that would
    change a line it keeps; whether ``manifest`` must be written (a new job, an older output, a new budget).

    Settings may differ only in the token budget (``max_new_tokens`` bounds the work, not the output), and only
    where every line kept (all of them; with ``retry_errors`` those that are not errors) reads the same under the
    new budget: a ``token_budget`` line never does, a line whose record stopped within the new budget does. Call
    it before the model loads, and again under the lock (`claimed`). Reads; changes nothing."""
    p = Path(output)
    held = _read_manifest(p)
    data = read_bytes(p) if p.exists() else b""
    if not held or not data.strip():
        return held != manifest
    there, here = held.get("settings", {}), manifest["settings"]
    if there == here:
        return False
    budget = "max_new_tokens"
    options = there.get("options", {}), here.get("options", {})
    if _without(there, budget) != _without(here, budget):
        _refuse_other_settings(output, there, here)
    default = structspec.GenerateOptions.max_new_tokens  # the manifest lists the options set otherwise
    old, new = (o.get(budget, default) for o in options)
    rows = [row for row in job_lines(p, data)[1] if not (retry_errors and "error" in row)]
    changed = [row for row in rows if _changed_by_budget(row, new)]
    if changed:
        kinds = ", ".join(f"{kind} {n}" for kind, n in sorted(Counter(_kind(row) for row in changed).items()))
        retry = "" if retry_errors or any("error" not in row for row in changed) else \
            f"add --retry-errors to run them again with --max-new-tokens {new}, "
        raise JobConfigError(f"{output} was written with --max-new-tokens {old}, and {len(changed)} of its lines "
                             f"({kinds}) would read otherwise with {new} (see {manifest_path(output)}): {retry}"
                             f"rerun with --max-new-tokens {old} to resume, or choose another --output")
    return True


def _without(settings: dict[str, Any], option: str) -> dict[str, Any]:
    """``settings`` without ``option`` among its options."""
    return settings | {"options": {k: v for k, v in settings.get("options", {}).items() if k != option}}


def _changed_by_budget(row: dict[str, Any], budget: int) -> bool:
    """Whether ``row``, a line read back, would read otherwise had its record run with ``budget`` new tokens:
    a record stopped by the budget would stop elsewhere; one that ended (complete, or the context full) after
    more tokens than ``budget`` would stop earlier. A line without stats never ran the model."""
    if _kind(row) == "token_budget":
        return True
    tokens = row.get("stats", {}).get("output_tokens", 0)
    # a full context stops a record before its last token could be the budget's: at the budget it stops there
    return tokens >= budget if _kind(row) == "max_context" else tokens > budget


def _kind(row: dict[str, Any]) -> str:
    return row["error"]["kind"] if "error" in row else "extracted"


@contextmanager
def claimed(output: str | Path, manifest: dict[str, Any], retry_errors: bool = False) -> Iterator[None]:
    """Hold the lock of ``output`` for the block, with ``manifest`` as its manifest.

    Writes the manifest when ``output`` is missing or empty (a new job), has job lines and no manifest (an
    older output), or `check_settings` takes a new token budget. `JobConfigError` when another process holds
    the lock or the output was written with other settings (`check_settings`); nothing is changed then.
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
        if check_settings(output, manifest, retry_errors):
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
    text = read_bytes(path).strip()
    if not text:
        return None
    try:
        manifest = json.loads(text)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict) or manifest.get("structspec_job") != MANIFEST_FORMAT:
        raise JobConfigError(f"{path} is not the manifest of a structspec job: remove it, or choose another --output")
    return manifest


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path`` (an output or its manifest); a `JobConfigError` that says what to do when it cannot
    be read. Changes nothing."""
    try:
        return path.read_bytes()
    except OSError as e:
        raise JobConfigError(f"cannot read {path} ({e.strerror}): make it readable, or choose another --output") \
            from None
