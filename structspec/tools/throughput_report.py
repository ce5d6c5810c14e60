"""A throughput run's results and their report: each record's output, each row's measurements, token identity
against plain masked decoding at B = 1, and the table and JSON made from them. Plain values; nothing here runs a
model."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from structspec.tools.bench import first_difference
from structspec.tools.harness import PLAIN

LOOKUP = "+ prompt lookup"  # the speed reference at B = 1
OUTLINES = "outlines, one batch per schema"  # the peer reference: outlines' own batched generation
OUTLINES_MIXED = "outlines, mixed batch (a processor per row)"
UNCONSTRAINED = "transformers, unconstrained"


@dataclass(frozen=True)
class Output:
    """One record's output under one method."""

    task_id: str
    token_ids: list[int]
    text: str
    finished: bool  # False: max_new_tokens ran out
    row_passes: int  # target passes that chose this record's tokens (its EOS included)
    accuracy: float | None = None  # field accuracy; None: the task has no expected value


@dataclass(frozen=True)
class Measured:
    """One method at one batch size over every record: wall-clock time, passes, memory and outputs."""

    method: str
    batch_size: int
    seconds: float
    model_calls: int  # forward calls of the model body, each over a whole batch
    peak_memory_mib: float
    memory_growth_mib: float  # peak minus what was in use when the row started
    outputs: list[Output]

    @property
    def records_per_second(self) -> float:
        return len(self.outputs) / max(self.seconds, 1e-9)

    @property
    def output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / max(self.seconds, 1e-9)

    @property
    def seconds_per_record(self) -> float:
        return self.seconds / max(len(self.outputs), 1)

    @property
    def passes_per_token(self) -> float:
        return sum(o.row_passes for o in self.outputs) / max(self.output_tokens, 1)

    @property
    def accuracy(self) -> float | None:
        scored = [o.accuracy for o in self.outputs if o.accuracy is not None]
        return sum(scored) / len(scored) if scored else None

    @property
    def finished(self) -> int:
        return sum(o.finished for o in self.outputs)


@dataclass(frozen=True)
class Identity:
    """How many records a method decoded token-identical to the reference, and where the others first differ."""

    identical: int
    records: int
    divergences: list[tuple[str, int]]  # (task id, first differing output token)


def identity(outputs: list[Output], reference: list[Output]) -> Identity:
    """Compare ``outputs`` with ``reference`` record by record (both in task order)."""
    firsts = [(o.task_id, first_difference(o.token_ids, r.token_ids)) for o, r in zip(outputs, reference)]
    divergences = [(task_id, i) for task_id, i in firsts if i is not None]
    return Identity(len(outputs) - len(divergences), len(outputs), divergences)


@dataclass(frozen=True)
class Report:
    """A throughput run: where it ran and every measured row, structspec's first."""

    model: str
    device: str
    dtype: str
    threads: int
    max_new_tokens: int
    memory: str  # how peak memory was measured
    rows: list[Measured] = field(default_factory=list)

    def row(self, method: str, batch_size: int | None = None) -> Measured | None:
        """The row of ``method`` at ``batch_size`` (at any batch size: the first); None if it did not run."""
        return next((r for r in self.rows if r.method == method and batch_size in (None, r.batch_size)), None)

    def identity(self, row: Measured) -> Identity | None:
        """``row`` against plain masked decoding at B = 1; None for the unconstrained peer."""
        reference = self.row(PLAIN, 1)
        if reference is None or row.method == UNCONSTRAINED:
            return None
        return identity(row.outputs, reference.outputs)


HEADERS = ["method", "B", "records/s", f"÷ {LOOKUP}\nB=1", "÷ outlines\nper schema", "output\ntokens/s",
           "s/record", "passes /\nout token", "model\ncalls", "peak\nMiB", "growth\nMiB", "finished", "field\naccuracy",
           "same ids as\nplain B=1"]


def _ratio(value: float, reference: Measured | None) -> str:
    return f"×{value / reference.records_per_second:.2f}" if reference else "—"


def table_rows(report: Report) -> list[list[str]]:
    """The report's rows as table cells, in `HEADERS` order."""
    lookup, outlines = report.row(LOOKUP, 1), report.row(OUTLINES)
    cells = []
    for r in report.rows:
        same = report.identity(r)
        cells.append([
            r.method, str(r.batch_size), f"{r.records_per_second:.3f}", _ratio(r.records_per_second, lookup),
            _ratio(r.records_per_second, outlines), f"{r.tokens_per_second:.1f}", f"{r.seconds_per_record:.2f}",
            f"{r.passes_per_token:.3f}", f"{r.model_calls:,}", f"{r.peak_memory_mib:,.0f}",
            f"{r.memory_growth_mib:,.0f}", f"{r.finished}/{len(r.outputs)}",
            "—" if r.accuracy is None else f"{r.accuracy:.3f}",
            "—" if same is None else f"{same.identical}/{same.records}"
            + "".join(f" {task_id}@{i}" for task_id, i in same.divergences),
        ])
    return cells


def print_report(console: Console, report: Report) -> None:
    """The table, then what its columns mean."""
    records = len(report.rows[0].outputs) if report.rows else 0
    table = Table(title=f"{report.model} on {report.device}, {report.dtype}: {records} records, greedy, "
                        f"max_new_tokens={report.max_new_tokens}, {report.threads} threads", title_justify="left")
    for header in HEADERS:
        table.add_column(header, justify="left" if header == "method" else "right")
    for cells in table_rows(report):
        table.add_row(*cells)
    console.print(table)
    console.print(
        "records/s and tokens/s: wall clock around each row's calls (compiling paid before). passes / out token: "
        "per record, target passes that chose its tokens. model calls: forward calls of the model, each over a "
        f"batch. Memory: {report.memory}; growth is the peak minus what was in use at the row's start. "
        f"B=1: generate_result, one record at a time; B>1: generate_batch. same ids: records token-identical "
        f"to {PLAIN} at B=1 (each record decoded alone), then task@first differing token. "
        f"{OUTLINES}: outlines takes one regex per batch. Load average at the end (other processes skew "
        f"timings): {os.getloadavg()[0]:.2f}.",
        highlight=False,
    )


def report_json(report: Report) -> dict[str, Any]:
    """The raw numbers: every row with its derived figures, identity and per-record outputs."""
    rows = []
    for r in report.rows:
        same = report.identity(r)
        rows.append(asdict(r) | {
            "records_per_second": r.records_per_second, "output_tokens": r.output_tokens,
            "tokens_per_second": r.tokens_per_second, "seconds_per_record": r.seconds_per_record,
            "passes_per_token": r.passes_per_token, "accuracy": r.accuracy, "finished": r.finished,
            "identity": None if same is None else asdict(same),
        })
    return asdict(report) | {"rows": rows}
