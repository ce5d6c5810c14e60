"""A job's output as a job writes it: which records it already holds (resume), each new line appended with one
write, and the run's summary.

Each line is written with a single ``write`` to a file opened for appending, so a killed job leaves whole lines
behind; on start a torn last line (power loss) is cut off, and every input record that already has a line is
skipped. Rerunning the same job after Ctrl-C or ``kill -9`` therefore writes each record exactly once, whatever
order its rows finished in. All of it happens under the output's lock (`structspec.jobs.manifest.claimed`).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structspec.cache import writing
from structspec.jobs.errors import JobConfigError
from structspec.jobs.lines import job_lines, line_key, record_keys
from structspec.jobs.manifest import check_output, claimed, read_bytes
from structspec.jobs.records import InputRecord


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
    data = read_bytes(p)
    lines, rows = job_lines(p, data)
    if retry_errors:
        lines, rows = [line for line, row in zip(lines, rows) if "error" not in row], \
            [row for row in rows if "error" not in row]
    kept = b"".join(line + b"\n" for line in lines)
    if kept != data:  # through a temp file of this process's own beside it (`writing`), with the output's mode
        with writing(p) as f:
            os.fchmod(f.fileno(), p.stat().st_mode & 0o7777)
            f.write(kept)
    return {line_key(row) for row in rows}


def resume(
    records: list[InputRecord], output: str | Path, retry_errors: bool = False
) -> tuple[JobSummary, list[InputRecord]]:
    """The records of a job that ``output`` has no line for yet, and a summary that counts the others as skipped.

    Changes ``output`` as `done_keys` does (cuts a torn last line; drops error lines with
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
    """Claim ``output`` for a job with ``manifest`` (`structspec.jobs.manifest.job_manifest`) and give its
    summary, the records it has no line for yet, and ``write(line)`` (see `appending`); the lock is released
    when the block ends.

    `JobConfigError`, before anything is written, for an output that is not a job's, is being written by
    another job, or was written with other settings that change its lines (`structspec.jobs.manifest`).
    """
    check_output(output)
    with claimed(output, manifest, retry_errors):
        summary, todo = resume(records, output, retry_errors)
        with appending(output, summary, on_record) as write:
            yield summary, todo, write
