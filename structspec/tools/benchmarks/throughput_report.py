"""A throughput run's results and their report: each record's output, each row's measurements, token identity
against plain masked decoding at B = 1, ratios between rows, and the table and JSON made from them. Plain values;
nothing here runs a model."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from structspec.tools.benchmarks.bench import first_difference
from structspec.tools.benchmarks.harness import PLAIN

LOOKUP = "+ prompt lookup"
LOOKAHEAD = "+ lookahead"
DEFAULT = "default"  # generate_batch with no keyword but max_new_tokens, where no other row decodes that way
OUTLINES = "outlines, one batch per schema"  # the peer reference: outlines' own batched generation
OUTLINES_MIXED = "outlines, mixed batch (a processor per row)"
UNCONSTRAINED = "transformers, unconstrained"
PEERS = (OUTLINES, OUTLINES_MIXED, UNCONSTRAINED)


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
    records: int  # records compared: the row's records that have a reference
    of: int  # the row's records
    divergences: list[tuple[str, int]]  # (task id, first differing output token)


def identity(outputs: list[Output], reference: list[Output]) -> Identity:
    """Compare each of ``outputs`` that has a record of the same task in ``reference`` with that record."""
    by_task = {r.task_id: r for r in reference}
    firsts = [(o.task_id, first_difference(o.token_ids, by_task[o.task_id].token_ids))
              for o in outputs if o.task_id in by_task]
    divergences = [(task_id, i) for task_id, i in firsts if i is not None]
    return Identity(len(firsts) - len(divergences), len(firsts), len(outputs), divergences)


@dataclass(frozen=True)
class Ratios:
    """One row's speed over reference rows' (None: the reference did not run)."""

    own_b1: float | None  # records/s over the same method's at B = 1
    plain_same_b: float | None  # records/s over plain masked decoding's at the same B
    best_outlines: float | None  # records/s over the fastest outlines row's (either kind, any B)
    best_unconstrained: float | None  # output tokens/s over transformers unconstrained's at its fastest B


def _over(value: float, reference: float | None) -> float | None:
    return None if reference is None else value / max(reference, 1e-9)


@dataclass(frozen=True)
class Report:
    """A throughput run in one dtype: where it ran and every measured row, structspec's first."""

    model: str
    device: str
    dtype: str
    default_dtype: str  # what structspec.load picks with dtype=None on this device
    threads: int
    max_new_tokens: int
    records: int  # B = 1 rows may decode only the first of them
    default_method: str  # the method that decodes with generate_batch's defaults
    memory: str  # how peak memory was measured
    rows: list[Measured] = field(default_factory=list)
    prefill_seconds: float = 0.0  # every record's prompt prefilled once, alone (`prefill_seconds`): all methods pay it

    def row(self, method: str, batch_size: int | None = None) -> Measured | None:
        """The row of ``method`` at ``batch_size`` (at any batch size: the first); None if it did not run."""
        return next((r for r in self.rows if r.method == method and batch_size in (None, r.batch_size)), None)

    def best_outlines(self) -> Measured | None:
        """The outlines row (one batch per schema or mixed, any B) with the most records/s."""
        return max((r for r in self.rows if r.method in (OUTLINES, OUTLINES_MIXED)),
                   key=lambda r: r.records_per_second, default=None)

    def best_unconstrained(self) -> Measured | None:
        """The transformers unconstrained row with the most output tokens/s."""
        return max((r for r in self.rows if r.method == UNCONSTRAINED), key=lambda r: r.tokens_per_second,
                   default=None)

    def identity(self, row: Measured) -> Identity | None:
        """``row`` against plain masked decoding at B = 1; None for the unconstrained peer."""
        reference = self.row(PLAIN, 1)
        if reference is None or row.method == UNCONSTRAINED:
            return None
        return identity(row.outputs, reference.outputs)

    def ratios(self, row: Measured) -> Ratios:
        """``row``'s speed over its own method at B = 1, plain masked at its B, and the fastest peers."""
        rate = row.records_per_second
        own, plain, outlines = self.row(row.method, 1), self.row(PLAIN, row.batch_size), self.best_outlines()
        unconstrained = self.best_unconstrained()
        return Ratios(_over(rate, own.records_per_second if own else None),
                      _over(rate, plain.records_per_second if plain else None),
                      _over(rate, outlines.records_per_second if outlines else None),
                      _over(row.tokens_per_second, unconstrained.tokens_per_second if unconstrained else None))


HEADERS = ["method", "B", "records/s", "output\ntokens/s", "× own\nB=1", "× plain\nsame B", "× best\noutlines",
           "tokens/s ×\ntransformers", "passes /\nout token", "model\ncalls", "peak\nMiB", "growth\nMiB", "finished",
           "field\naccuracy", "same ids as\nplain B=1"]


def _times(ratio: float | None) -> str:
    return "—" if ratio is None else f"×{ratio:.2f}"


def _same(same: Identity | None) -> str:
    if same is None:
        return "—"
    of = f" (of {same.of})" if same.of != same.records else ""
    return f"{same.identical}/{same.records}{of}" + "".join(f" {task_id}@{i}" for task_id, i in same.divergences)


def method_label(report: Report, method: str) -> str:
    """``method`` as the table names it: marked "(default)" where it decodes with generate_batch's defaults."""
    return f"{method} (default)" if method == report.default_method != DEFAULT else method


def table_rows(report: Report) -> list[list[str]]:
    """The report's rows as table cells, in `HEADERS` order."""
    cells = []
    for r in report.rows:
        ratios = report.ratios(r)
        cells.append([
            method_label(report, r.method), str(r.batch_size), f"{r.records_per_second:.3f}",
            f"{r.tokens_per_second:.1f}", _times(ratios.own_b1), _times(ratios.plain_same_b),
            _times(ratios.best_outlines), _times(ratios.best_unconstrained), f"{r.passes_per_token:.3f}",
            f"{r.model_calls:,}", f"{r.peak_memory_mib:,.0f}", f"{r.memory_growth_mib:,.0f}",
            f"{r.finished}/{len(r.outputs)}", "—" if r.accuracy is None else f"{r.accuracy:.3f}",
            _same(report.identity(r)),
        ])
    return cells


def _named(row: Measured | None, figure: str) -> str:
    if row is None:
        return "did not run"
    value = row.records_per_second if figure == "records/s" else row.tokens_per_second
    return f"{row.method} at B={row.batch_size}, {value:.3f} {figure}"


def print_report(console: Console, report: Report) -> None:
    """The table, then what its columns mean."""
    default = "the default" if report.dtype == report.default_dtype else f"the default is {report.default_dtype}"
    table = Table(title=f"{report.model} on {report.device}, {report.dtype} ({default}): {report.records} records, "
                        f"greedy, max_new_tokens={report.max_new_tokens}, {report.threads} threads",
                  title_justify="left")
    for header in HEADERS:
        table.add_column(header, justify="left" if header == "method" else "right")
    for cells in table_rows(report):
        table.add_row(*cells)
    console.print(table)
    b1 = report.row(PLAIN, 1)
    console.print(
        f"Ran in {report.dtype}; structspec.load's default dtype (dtype=None) resolved to {report.default_dtype}. "
        "records/s and tokens/s: wall clock around each row's calls (compiling paid before). "
        f"B=1: generate_result, one record at a time, on the first {len(b1.outputs) if b1 else 0} records; "
        "B>1: generate_batch. "
        f"{method_label(report, report.default_method)}: what generate_batch does with no keyword but "
        "max_new_tokens. × own B=1: records/s over the same method's at B=1; × plain same B: over "
        f"{PLAIN}'s at the same B; × best outlines: over {_named(report.best_outlines(), 'records/s')}; "
        "tokens/s × transformers: output tokens/s over "
        f"{_named(report.best_unconstrained(), 'output tokens/s')}. passes / out token: per record, target "
        "passes that chose its tokens. model calls: forward calls of the model, each over a batch. Memory: "
        f"{report.memory}; growth is the peak minus what was in use at the row's start. same ids: records "
        f"token-identical to {PLAIN} at B=1 (each record decoded alone), of those it decoded, then task@first "
        f"differing token. {OUTLINES}: outlines takes one regex per batch; at a B that makes the same batches as "
        "a smaller B it does not run again. Load average at the end (other processes skew timings): "
        f"{os.getloadavg()[0]:.2f}.",
        highlight=False,
    )
    if report.prefill_seconds:
        console.print(
            f"Prefill alone: {report.prefill_seconds / report.records:.3f} s a record (each prompt but its last token "
            "in one pass, timed once per record; every method pays it, batched or not): were decoding free, "
            f"{report.records / report.prefill_seconds:.3f} records/s.", highlight=False)


def report_json(report: Report) -> dict[str, Any]:
    """The raw numbers: every row with its derived figures, ratios, identity and per-record outputs, and the
    rows the ratios are taken over."""
    rows = []
    for r in report.rows:
        same = report.identity(r)
        rows.append(asdict(r) | {
            "records_per_second": r.records_per_second, "output_tokens": r.output_tokens,
            "tokens_per_second": r.tokens_per_second, "seconds_per_record": r.seconds_per_record,
            "passes_per_token": r.passes_per_token, "accuracy": r.accuracy, "finished": r.finished,
            "ratios": asdict(report.ratios(r)), "identity": None if same is None else asdict(same),
        })
    best = {"best_outlines": report.best_outlines(), "best_unconstrained": report.best_unconstrained()}
    return asdict(report) | {"rows": rows} | {
        name: None if r is None else {"method": r.method, "batch_size": r.batch_size} for name, r in best.items()}
