"""Throughput benchmark: records per second of batched structspec against outlines' and transformers' batched
generation, one run, one machine, one model, in one dtype or several in turn.

    python -m structspec.tools.benchmarks.throughput [--model qwen2.5-coder-0.5b] [--records 16] [--b1-records N]
        [--batch-sizes 1,8,16] [--peer-batch-sizes 8,32] [--max-new-tokens 256] [--threads N] [--device auto]
        [--dtypes float32,bfloat16] [--json PATH]
    python -m structspec.tools.benchmarks.throughput --bf16-agreement [same options]

Rows: structspec's four greedy modes (`modes`: plain masked, exact fast-forward,
+ prompt lookup, + lookahead; the one that decodes as `generate_batch`'s defaults
marked "(default)", or else a "default" row) at each batch size: B = 1 is
`structspec.generate_result` one record at a time (on the first ``--b1-records``
records), B > 1 is `structspec.generate_batch` with one spec per record (schemas
mixed in a batch, rows refilled as others finish); then, at each
``--peer-batch-sizes``, outlines' processor in ``model.generate`` with one batch
per schema (outlines takes one regex per batch), outlines' processors one per row
in mixed batches, and transformers' unconstrained ``generate``, all left-padded.
Each ``--dtypes`` entry loads the model again and runs every row in it.

Throughput is wall-clock time around each row's calls: a batch's records share
their passes, so no per-record time adds up to what a user waits for. Compiling
is paid before any timing (structspec's FSMs cached in memory, outlines' Indexes
built once), and so is the model's pass-cost curve where none is stored
(`structspec.tools.command.drafting_curve`). Passes per output token count, per record, the passes that chose
its tokens (structspec's `Stats.target_forward_passes`, the peers' tokens plus
EOS); model calls are forward calls of the model body, each over a whole batch.
Every structspec row is checked token for token against plain masked decoding at
B = 1, on the records that ran at B = 1 (greedy: batch shapes change float sums,
so a divergence can only come from a near-tie). Ratios: each row's records/s over
its own method's at B = 1, over plain masked decoding's at the same B and over the
fastest outlines row's; its output tokens/s over transformers unconstrained at its
fastest B. Under the table, the prefill floor: every record's prompt prefilled once,
alone (`structspec.tools.benchmarks.prefill`), the part of each record no method decodes away.

``--bf16-agreement`` instead decodes each record alone with plain masked decoding
in float32, then batched with exact fast-forward and prompt lookup in bfloat16,
and reports the share of records that agree token for token and the float32
masked-logit margin where each first diverges.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import structspec
from structspec.errors import OptionError
from structspec.models.device import resolve_device
from structspec.models.transformers_lm import LM
from structspec.options import GenerateOptions
from structspec.tools.benchmarks.bench import Divergence, divergence
from structspec.tools.arguments import throughput_arguments
from structspec.tools.command import EXIT_CODES, Formatter, drafting_curve, run_command
from structspec.tools.benchmarks.harness import PLAIN, Keywords, judge, methods, spread
from structspec.tools.benchmarks.peak_memory import PeakMemory
from structspec.tools.benchmarks.peers import (PassCounter, PeerBatch, outlines_batch, outlines_index, require_outlines,
                                    unconstrained_batch)
from structspec.tools.benchmarks.prefill import prefill_seconds
from structspec.tools.tasks import Task, extraction_prompt, load_tasks
from structspec.tools.benchmarks.throughput_report import (
    DEFAULT,
    LOOKAHEAD,
    LOOKUP,
    OUTLINES,
    OUTLINES_MIXED,
    UNCONSTRAINED,
    Measured,
    Output,
    Report,
    print_report,
    report_json,
)

MODES = (PLAIN, "fast-forward", LOOKUP, LOOKAHEAD)  # of `harness.methods(trees=True)`: all but the tree

Decode = Callable[[], list[Output]]  # decodes every record, outputs in task order, unjudged


def modes(defaults: GenerateOptions | None = None) -> tuple[dict[str, Keywords], str]:
    """structspec's rows (`MODES`, in order) and the name of the one that decodes as ``defaults`` do (by default
    `GenerateOptions`' defaults, which are `generate_batch`'s); where none does, a `DEFAULT` row with no
    keywords is added and named."""
    rows = {label: keywords for label, keywords in methods(trees=True).items() if label in MODES}
    defaults = defaults or GenerateOptions()
    same = [label for label, keywords in rows.items() if GenerateOptions(**keywords) == defaults]
    return (rows, same[0]) if same else (rows | {DEFAULT: {}}, DEFAULT)


@dataclass(frozen=True)
class Matrix:
    """What a run measures besides the model: structspec's batch sizes (B = 1 runs whatever they say), the
    peers', the token budget, and how many records B = 1 decodes (None: all)."""

    batch_sizes: tuple[int, ...]
    peer_batch_sizes: tuple[int, ...]
    max_new_tokens: int
    b1_records: int | None = None


def measure(lm: LM, tasks: list[Task], method: str, batch_size: int, decode: Decode) -> Measured:
    """Run ``decode`` once under a wall clock, a model-call counter and a memory peak; then judge its outputs."""
    with PeakMemory(lm.device) as memory, PassCounter(lm.model.base_model) as calls:
        start = time.perf_counter()
        outputs = decode()
        seconds = time.perf_counter() - start
    outputs = [replace(o, accuracy=judge(task, o.text).accuracy) for o, task in zip(outputs, tasks)]
    return Measured(method, batch_size, seconds, calls.calls, memory.peak, memory.growth, outputs)


def decode_structspec(lm: LM, tasks: list[Task], keywords: Keywords, batch_size: int, max_new_tokens: int) -> Decode:
    """``generate_batch`` over the tasks with one spec per record; at B = 1, ``generate_result`` record by
    record (the single-row loop: what one record at a time costs a user). A record that cannot run is a bug."""
    def decode() -> list[Output]:
        prompts = [extraction_prompt(t.text, t.schema) for t in tasks]
        options = {"max_new_tokens": max_new_tokens, **keywords}
        if batch_size == 1:
            results = [structspec.generate_result(lm, t.schema, p, **options) for t, p in zip(tasks, prompts)]
        else:
            results = structspec.generate_batch(lm, [t.schema for t in tasks], prompts, batch_size=batch_size,
                                                **options)
        for r in results:
            if r.error is not None:
                raise r.error
        return [Output(t.id, r.token_ids, r.text, r.complete, r.stats.target_forward_passes)
                for t, r in zip(tasks, results)]

    return decode


def decode_peer(tasks: list[Task], batches: list[list[int]], generate: Callable[[list[int]], PeerBatch]) -> Decode:
    """A peer over ``batches`` (lists of task positions), one ``generate`` call per batch."""
    def decode() -> list[Output]:
        outputs: dict[int, Output] = {}
        for batch in batches:
            run = generate(batch)
            for row, i in enumerate(batch):
                outputs[i] = Output(tasks[i].id, run.token_ids[row], run.texts[row], run.chose_eos[row],
                                    run.row_passes(row))
        return [outputs[i] for i in range(len(tasks))]

    return decode


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def by_schema(tasks: list[Task], size: int) -> list[list[int]]:
    """Task positions in batches of at most ``size``, one schema per batch (schemas in order of appearance)."""
    groups: dict[str, list[int]] = {}
    for i, task in enumerate(tasks):
        groups.setdefault(task.schema_name, []).append(i)
    return [batch for group in groups.values() for batch in _chunks(group, size)]


def benchmark(lm: LM, tasks: list[Task], matrix: Matrix, console: Console | None = None) -> Report:
    """Every structspec mode at every batch size (B = 1 always: it is the reference), then the peers at each of
    theirs.

    Compiles every schema and builds outlines' Indexes first, and warms up every
    decoding path, so no row pays a first-call cost.
    """
    console = console or Console(quiet=True)
    rows, default = modes()
    prompt_ids = [lm.encode_prompt(extraction_prompt(t.text, t.schema)) for t in tasks]
    schemas = {t.schema_name: t.schema for t in tasks}
    indexes = {}
    for name, schema in schemas.items():
        structspec.compile(schema, lm)  # cached in memory: every batched row finds it
        indexes[name] = outlines_index(lm, structspec.to_regex(schema))
    # first calls pay one-off costs (outlines' first processor call alone takes seconds)
    prompts = [extraction_prompt(t.text, t.schema) for t in tasks[:2]]
    for keywords in rows.values():
        structspec.generate_result(lm, tasks[0].schema, prompts[0], max_new_tokens=4, **keywords)
        structspec.generate_batch(lm, [t.schema for t in tasks[:2]], prompts, batch_size=2, max_new_tokens=4,
                                  **keywords)
    outlines_batch(lm, [indexes[t.schema_name] for t in tasks[:2]], prompt_ids[:2], 4)
    unconstrained_batch(lm, prompt_ids[:2], 4)

    report = Report(lm.name, str(lm.device), _name(lm.model.dtype), _name(resolve_device(str(lm.device))[1]),
                    torch.get_num_threads(), matrix.max_new_tokens, len(tasks), default, PeakMemory(lm.device).how,
                    prefill_seconds=prefill_seconds(lm, prompt_ids))

    def add(method: str, batch_size: int, decode: Decode, decoded: list[Task]) -> None:
        report.rows.append(row := measure(lm, decoded, method, batch_size, decode))
        console.print(f"{report.dtype}, {method}, B={batch_size}: {row.seconds:.1f} s, "
                      f"{row.records_per_second:.3f} records/s", highlight=False)

    for b in sorted({1, *matrix.batch_sizes}):
        decoded = tasks[:matrix.b1_records] if b == 1 else tasks
        for method, keywords in rows.items():
            add(method, b, decode_structspec(lm, decoded, keywords, b, matrix.max_new_tokens), decoded)

    def outlines(batch: list[int]) -> PeerBatch:
        return outlines_batch(lm, [indexes[tasks[i].schema_name] for i in batch], [prompt_ids[i] for i in batch],
                              matrix.max_new_tokens)

    def unconstrained(batch: list[int]) -> PeerBatch:
        return unconstrained_batch(lm, [prompt_ids[i] for i in batch], matrix.max_new_tokens)

    per_schema_runs: list[list[list[int]]] = []
    for b in matrix.peer_batch_sizes:
        in_order, per_schema = _chunks(list(range(len(tasks))), b), by_schema(tasks, b)
        if per_schema in per_schema_runs:  # B above the largest schema's records: the same batches again
            console.print(f"{OUTLINES}, B={b}: the same batches as a smaller B, not run again", highlight=False)
        else:
            per_schema_runs.append(per_schema)
            add(OUTLINES, b, decode_peer(tasks, per_schema, outlines), tasks)
        add(OUTLINES_MIXED, b, decode_peer(tasks, in_order, outlines), tasks)
        add(UNCONSTRAINED, b, decode_peer(tasks, in_order, unconstrained), tasks)
    return report


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Agreement:
    """bfloat16 batched decoding against float32 single-row decoding, record by record."""

    model: str
    batch_size: int
    records: int
    identical: int
    divergences: list[Divergence]


def agreement(full: LM, half: LM, tasks: list[Task], batch_size: int, max_new_tokens: int) -> Agreement:
    """Decode every record alone with plain masked decoding on ``full`` (float32), then batched with exact
    fast-forward and prompt lookup on ``half`` (bfloat16); compare token ids."""
    prompts = [extraction_prompt(t.text, t.schema) for t in tasks]
    alone = [structspec.generate_result(full, t.schema, p, max_new_tokens=max_new_tokens, fast_forward="off",
                                        draft=None)
             for t, p in zip(tasks, prompts)]
    batched = structspec.generate_batch(half, [t.schema for t in tasks], prompts, batch_size=batch_size,
                                        max_new_tokens=max_new_tokens, fast_forward="exact", draft="prompt_lookup")
    divergences = []
    for task, a, b in zip(tasks, alone, batched):
        if b.error is not None:
            raise b.error
        if (d := divergence(full, task, a.token_ids, b.token_ids)) is not None:
            divergences.append(d)
    return Agreement(full.name, batch_size, len(tasks), len(tasks) - len(divergences), divergences)


def print_agreement(console: Console, result: Agreement) -> None:
    """The share of identical records, then one line per first divergence."""
    console.print(f"[bold]bf16 agreement[/bold] ({result.model}): {result.identical}/{result.records} records "
                  f"({result.identical / max(result.records, 1):.0%}) decoded batched (B={result.batch_size}, exact "
                  "fast-forward + prompt lookup) in bfloat16 are token-identical to their float32 single-row plain "
                  "masked decode.", highlight=False)
    table = Table(title="first divergences: float32 masked-logit margin (top-1 − top-2) there", title_justify="left")
    for header in ("task", "output token", "margin", "float32 chose", "bfloat16 chose"):
        table.add_column(header, justify="left" if header in ("task", "float32 chose", "bfloat16 chose") else "right")
    for d in result.divergences:
        table.add_row(d.task_id, str(d.position), f"{d.margin:.4f}", repr(d.ours), repr(d.theirs))
    if result.divergences:
        console.print(table)


def _sizes(option: str, text: str) -> tuple[int, ...]:
    """``text``, a comma-separated list of batch sizes, sorted without repeats; `OptionError` naming ``option``."""
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise OptionError(f"batch sizes must be whole numbers ≥ 1 separated by commas, got {option} {text}")
    return tuple(sorted({int(part) for part in parts}))


def matrix_of(args: argparse.Namespace) -> Matrix:
    """The `Matrix` the options ask for; `OptionError` for a bad batch size."""
    return Matrix(_sizes("--batch-sizes", args.batch_sizes), _sizes("--peer-batch-sizes", args.peer_batch_sizes),
                  args.max_new_tokens, args.b1_records)


def dtypes_of(args: argparse.Namespace) -> list[str | None]:
    """The dtypes ``--dtypes`` names, in order ([None]: structspec.load's default); `OptionError` for one that
    structspec.load does not take, a repeat, or a device it does not know."""
    if args.dtypes is None:
        return [None]
    names: list[str | None] = [name.strip() for name in args.dtypes.split(",")]
    for name in names:
        resolve_device(args.device, name)
    if len(set(names)) < len(names):
        raise OptionError(f"--dtypes names a dtype twice: {args.dtypes}")
    return names


def run(args: argparse.Namespace) -> int:
    """Run the benchmark (or the bf16 agreement) the options ask for; print it and write ``--json``. A bad
    option or an unknown model raises (`OptionError`, `ModelNotFoundError`) before any model loads."""
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console() if Console().is_terminal else Console(width=220)
    matrix, dtypes = matrix_of(args), dtypes_of(args)  # checked before any model loads
    tasks = spread(load_tasks(), args.records)
    if not args.bf16_agreement:
        require_outlines("structspec throughput")  # a peer: its absence said before the model loads
    if args.bf16_agreement:
        full = structspec.load(args.model, args.device, "float32", kernels=args.kernels)
        half = structspec.load(args.model, args.device, "bfloat16")
        drafting_curve(full, args.calibrate)
        drafting_curve(half, args.calibrate)
        result = agreement(full, half, tasks, max(matrix.batch_sizes), args.max_new_tokens)
        print_agreement(console, result)
        raw: dict[str, Any] = asdict(result)
    else:
        reports = []
        for dtype in dtypes:
            lm = structspec.load(args.model, args.device, dtype, kernels=args.kernels)
            drafting_curve(lm, args.calibrate)  # the timed rows read the curve, never measure it
            reports.append(report := benchmark(lm, tasks, matrix, console))
            print_report(console, report)
            del lm  # freed before the next dtype's copy loads
            gc.collect()
        raw = report_json(reports[0]) if len(reports) == 1 else {"reports": [report_json(r) for r in reports]}
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1), encoding="utf-8")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m structspec.tools.benchmarks.throughput``: parse ``argv`` and `run`, as ``structspec throughput``
    does."""
    parser = argparse.ArgumentParser(prog="python -m structspec.tools.benchmarks.throughput", description=__doc__,
                                     epilog=EXIT_CODES, formatter_class=Formatter, allow_abbrev=False)
    throughput_arguments(parser)
    return run_command("throughput", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
