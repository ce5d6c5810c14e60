"""Benchmark: structspec against outlines and transformers on the extraction tasks, same model, same prompts.

    structspec bench [--model smollm2-135m] [--draft-model NAME] [--limit N] [--max-new-tokens 200]

(``python -m structspec.tools.benchmarks.bench`` takes the same options.) The runs come from
the shared `harness`: structspec's rows are its `methods`, the peers here are
outlines (the oracle for plain masked decoding) and transformers' own greedy,
prompt-lookup and assisted decoding. Measuring and printing are separate:
`measure_compile` and the harness return plain records, `print_report` renders
them. structspec's numbers come from its `Stats`; the bench times nothing of
structspec itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

import structspec
from structspec.cache import cache_dir
from structspec.jobs.runner import load_model
from structspec.models.transformers_lm import LM
from structspec.testing import divergence_margin
from structspec.tools.arguments import bench_arguments
from structspec.tools.command import EXIT_CODES, Formatter, run_command
from structspec.tools.command import drafting_curve
from structspec.tools.benchmarks.harness import PLAIN, Method, Run, methods, run_tasks, spread, summarize
from structspec.tools.benchmarks.peers import (
    OUTLINES_REQUIREMENT,
    hf_assisted,
    hf_prompt_lookup,
    outlines_backend,
    outlines_greedy,
    unconstrained_greedy,
)
from structspec.tools.tasks import Task, extraction_prompt, load_tasks

PEER = "outlines"  # plain masked decoding in both PLAIN and PEER: the oracle pair


def rows(draft_model: LM | None = None, outlines: bool = True) -> dict[str, Method]:
    """The compared methods, in table order: plain masked decoding and outlines first (the oracle pair; outlines
    only with ``outlines``), then structspec's speed-ups, then transformers' own (unconstrained) greedy and
    speculative decoding."""
    own = methods(draft_model, self_draft=True, trees=True)
    out: dict[str, Method] = {PLAIN: own.pop(PLAIN)}
    if outlines:
        out[PEER] = lambda lm, task, ids, n: outlines_greedy(lm, structspec.to_regex(task.schema), ids, n)
    out |= own
    out |= {
        "HF greedy (unconstrained)": lambda lm, task, ids, n: unconstrained_greedy(lm, ids, n),
        "HF prompt lookup (unconstrained)": lambda lm, task, ids, n: hf_prompt_lookup(lm, ids, n),
        "HF assisted, self-draft (unconstrained)": lambda lm, task, ids, n: hf_assisted(lm, lm.early_exit(), ids, n),
    }
    if draft_model is not None:
        out[f"HF assisted, {draft_model.name} (unconstrained)"] = (
            lambda lm, task, ids, n: hf_assisted(lm, draft_model, ids, n))
    return out


@dataclass(frozen=True)
class CompileTimes:
    """Seconds to get a schema's constraint ready: structspec cold, and again as a later process (read from its
    disk cache, or built again where that is quicker than storing it: `structspec.automaton.fsm.DISK_MIN_SECONDS`),
    outlines' Index (None: outlines is not installed)."""

    cold: float
    cached: float
    outlines_index: float | None


def measure_compile(lm: LM, tasks: list[Task], outlines: bool = True) -> dict[str, CompileTimes]:
    """Compile each schema cold, then again as a later process would (from structspec's disk cache, or built
    again if it was quicker to build than to store), and build outlines' Index (with ``outlines``).

    Clears structspec's in-memory FSM cache before each compile. Cold needs
    ``STRUCTSPEC_CACHE`` to point at an empty directory (see `main`).
    """
    backend = outlines_backend(lm) if outlines else None  # its vocabulary is built once per LM, not per schema
    out = {}
    for name, schema in {t.schema_name: t.schema for t in tasks}.items():
        structspec.clear_cache()
        cold = structspec.compile(schema, lm).fsm.info
        structspec.clear_cache()
        cached = structspec.compile(schema, lm).fsm.info
        if cold.source != "compiled" or cached.source == "memory":
            raise RuntimeError(f"{name}: expected a cold compile, then a disk load or a build, got {cold.source}, "
                               f"{cached.source}")
        index = None
        if backend is not None:
            regex = structspec.to_regex(schema)
            start = time.perf_counter()
            backend.get_regex_logits_processor(regex)
            index = time.perf_counter() - start
        out[name] = CompileTimes(cold.seconds, cached.seconds, index)
    return out


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (or where one ends), None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@dataclass(frozen=True)
class Divergence:
    """Where another decode of a task first leaves ours, and why: a near-tie, or a token our mask forbids."""

    task_id: str
    position: int  # first differing output token
    margin: float  # our masked logits there (one plain pass): top-1 minus top-2
    ours: str  # what each chose there ("" where it had stopped)
    theirs: str
    theirs_allowed: bool  # False: our FSM forbids their token there (a mask or vocabulary difference)


def divergence(lm: LM, task: Task, ours: list[int], theirs: list[int]) -> Divergence | None:
    """The first divergence of ``theirs`` from ``ours`` (token ids of the task's output under ``lm``), None if
    they are equal. Runs one forward pass over the common prefix; changes nothing."""
    i = first_difference(ours, theirs)
    if i is None:
        return None
    fsm = structspec.compile(task.schema, lm).fsm
    prompt_ids = lm.encode_prompt(extraction_prompt(task.text, task.schema))
    margin = divergence_margin(lm, fsm, prompt_ids, ours, theirs)
    state = fsm.walk(fsm.initial_state, ours[:i])[-1] if i else fsm.initial_state
    allowed = i >= len(theirs) or fsm.next_state(state, theirs[i]) is not None or theirs[i] in fsm.eos_token_ids
    return Divergence(task.id, i, margin, lm.vocab.decode(ours[i:i + 1]), lm.vocab.decode(theirs[i:i + 1]), allowed)


# A masked-logit margin below this can flip with float rounding (another pass shape or kernel). bfloat16
# logits of 16 to 64 are spaced 0.125 to 0.25 apart, so a margin of one or two of those steps is a tie there.
NEAR_TIE = {torch.float32: 0.1, torch.bfloat16: 0.5, torch.float16: 0.1}
GREEDY = "HF greedy (unconstrained)"  # the headline ratios are against transformers' own greedy decoding

_COLUMNS = [  # header, format
    ("s /\nrecord", "{:.2f}"), ("records/s", "{:.3f}"), ("tokens/s", "{:.1f}"), ("forward\npasses", "{:,}"),
    ("passes /\nout token", "{:.3f}"), ("floor /\nout token", "{:.3f}"), ("draft\npasses", "{:,}"),
    ("output\ntokens", "{:,}"), ("constraint\nms/step", "{:.3f}"), ("model\nms/pass", "{:.1f}"),
    ("compile\ncold s", "{:.3f}"), ("compile\ncached s", "{:.3f}"), ("valid %", "{:.1f}"),
    ("field\naccuracy", "{:.3f}"),
]


def _row(runs: list[Run], compile_seconds: tuple[float | None, float | None]) -> list[float | None]:
    """A method's values in `_COLUMNS` order (None: not applicable). The floor counts the output tokens
    that neither the FSM nor a drafter predicted: each needed a pass of its own."""
    s = summarize(runs)
    cold, cached = compile_seconds
    floor = (s.output_tokens - s.no_pass_tokens) / max(s.output_tokens, 1)
    return [s.seconds / max(s.records, 1), s.records_per_second, s.tokens_per_second, s.forward_passes,
            s.passes_per_token, floor, s.draft_passes, s.output_tokens, s.constraint_ms_per_pass,
            s.model_ms_per_pass, cold, cached, 100 * s.schema_valid, s.accuracy]


def print_report(console: Console, lm: LM, compared: Mapping[str, Method], by_method: dict[str, list[Run]],
                 compile_times: dict[str, CompileTimes], max_new_tokens: int,
                 divergences: Mapping[str, list[Divergence]]) -> None:
    """Print the table, acceptance per draft source, compile times and the oracle checks (``divergences``: per
    method, where its output first leaves plain masked decoding's)."""
    names = list(by_method)
    structspec_rows = [n for n in names if isinstance(compared[n], dict)]  # they share structspec's compile
    task_ids = [r.task_id for r in by_method[names[0]]]
    times = list(compile_times.values())
    compiles = {name: (_mean([t.cold for t in times]), _mean([t.cached for t in times])) for name in structspec_rows}
    if PEER in by_method:
        compiles[PEER] = (_mean([t.outlines_index for t in times]), None)
    values = {name: _row(runs, compiles.get(name, (None, None))) for name, runs in by_method.items()}

    table = Table(title=f"{lm.name}: {len(task_ids)} tasks, greedy, max_new_tokens={max_new_tokens}, "
                        f"{torch.get_num_threads()} CPU threads",
                  title_justify="left")
    table.add_column("method", style="bold")
    for header, _ in _COLUMNS:
        table.add_column(header, justify="right")
    per_record, per_token = (_COLUMNS.index(c) for c in (("records/s", "{:.3f}"), ("tokens/s", "{:.1f}")))
    ratios = [("per record\n× HF greedy", GREEDY, per_record), ("tokens/s\n× HF greedy", GREEDY, per_token),
              (f"per record\n× {PEER}", PEER, per_record)]  # (header, against, column): higher is faster
    for header, _, _ in ratios:
        table.add_column(header, justify="right")
    for name in names:
        cells = ["—" if v is None else fmt.format(v) for v, (_, fmt) in zip(values[name], _COLUMNS)]
        for _, against, column in ratios:
            base = values.get(against)
            cells.append("—" if base is None else f"×{values[name][column] / base[column]:.2f}")
        table.add_row(name, *cells)
    console.print(table)

    accept = Table(title="drafts per source: accepted / drafted (acceptance rate)", title_justify="left")
    accept.add_column("method", style="bold")
    sources = sorted({d[0] for runs in by_method.values() for r in runs for d in r.drafts})
    for source in sources:
        accept.add_column(source, justify="right")
    for name, runs in by_method.items():
        totals = {src: [0, 0] for src in sources}
        for r in runs:
            for src, drafted, accepted in r.drafts:
                totals[src][0] += drafted
                totals[src][1] += accepted
        if any(d for d, _ in totals.values()):
            accept.add_row(name, *(f"{a:,} / {d:,} ({a / d:.0%})" if d else "—" for d, a in totals.values()))
    console.print(accept)

    budget = [task_id for i, task_id in enumerate(task_ids) if not all(runs[i].finished for runs in by_method.values())]
    console.print(
        f"Speed columns: all {len(task_ids)} tasks"
        + (f" (max_new_tokens ran out on {', '.join(budget)})." if budget else ".")
        + f" structspec: its Stats; {PEER}: generate() time outside / inside its logits processor."
        f" Compile: mean over {len(compile_times)} schemas; {PEER} builds its Index on every call (no cache)."
        + ("" if PEER in by_method else f" {PEER}: not installed, skipped.")
        + f" Load average at the end (other processes skew timings): {os.getloadavg()[0]:.2f}.",
        highlight=False,
    )

    per_schema = Table(title="compile time per schema (s)", title_justify="left")
    for header in ("schema", "structspec cold", "structspec cached", f"{PEER} Index"):
        per_schema.add_column(header, justify="left" if header == "schema" else "right")
    for name, c in compile_times.items():
        index = "—" if c.outlines_index is None else f"{c.outlines_index:.3f}"
        per_schema.add_row(name, f"{c.cold:.3f}", f"{c.cached:.3f}", index)
    console.print(per_schema)

    reference = by_method.get(PLAIN)
    if reference is None:
        return
    tie = NEAR_TIE.get(lm.model.dtype, 0.1)
    if PEER in by_method:
        console.print(f"[bold]Oracle:[/bold] {PLAIN} and {PEER} produced the same token ids on "
                      f"{len(task_ids) - len(divergences.get(PEER, []))}/{len(task_ids)} tasks.", highlight=False)
        _print_divergences(console, PEER, divergences.get(PEER, []), tie)
    for name in structspec_rows:
        if name != PLAIN:
            same_ids = sum(r.token_ids == ref.token_ids for r, ref in zip(by_method[name], reference))
            same_text = sum(r.text == ref.text for r, ref in zip(by_method[name], reference))
            console.print(f"{name}: same token ids as {PLAIN} on {same_ids}/{len(task_ids)} tasks, "
                          f"same text on {same_text}/{len(task_ids)}.", highlight=False)
            _print_divergences(console, name, divergences.get(name, []), tie)


def _print_divergences(console: Console, name: str, divergences: list[Divergence], tie: float) -> None:
    """One line per task where ``name`` first leaves plain masked decoding: a near-tie (a margin under ``tie``),
    or a mask difference."""
    for d in divergences:
        why = (f"masked-logit margin {d.margin:.3f}, "
               + ("a near-tie" if d.margin < tie else f"not a tie: {name}'s mask or logits differ")
               if d.theirs_allowed else f"our mask forbids {name}'s token there")
        console.print(f"  {d.task_id}: first difference at output token {d.position}: {PLAIN} {d.ours!r} vs "
                      f"{name} {d.theirs!r}: {why}", highlight=False)


def main(args: argparse.Namespace) -> int:
    """``structspec bench``: compile times, then every method on every task, then the report."""
    if args.threads:
        torch.set_num_threads(args.threads)
    console = Console() if Console().is_terminal else Console(width=160)
    outlines = importlib.util.find_spec("outlines") is not None
    if not outlines:  # said before the model loads; structspec's own rows need no outlines
        print(f"structspec bench: outlines is not installed, so its row and its Index compile times are skipped; "
              f"pip install '{OUTLINES_REQUIREMENT}' to compare with it", file=sys.stderr)
    # before moving the cache: the converted model stays
    lm = load_model(args.model, args.device, args.dtype, args.kernels)
    drafting_curve(lm, args.calibrate)  # the timed records read the curve, never measure it
    draft_model = load_model(args.draft_model, args.device, args.dtype, args.kernels) if args.draft_model else None
    tasks = spread(load_tasks(), args.limit)
    compared = rows(draft_model, outlines)
    if args.only:
        words = args.only.split(",")
        compared = {n: m for n, m in compared.items() if n in (PLAIN, PEER) or any(w in n for w in words)}
    saved = os.environ.get("STRUCTSPEC_CACHE")
    curves = cache_dir("pass-cost")
    with tempfile.TemporaryDirectory(prefix="structspec-bench-") as cache:
        os.environ["STRUCTSPEC_CACHE"] = cache  # an empty FSM cache, so the first compile is cold
        # the stored pass-cost curves stay: drafting reads them as it does in the user's own runs
        shutil.copytree(curves, cache_dir("pass-cost"), dirs_exist_ok=True)
        try:
            compile_times = measure_compile(lm, tasks, outlines)
            by_method = run_tasks(lm, tasks, compared, args.max_new_tokens, console)
        finally:
            os.environ.pop("STRUCTSPEC_CACHE")
            if saved is not None:
                os.environ["STRUCTSPEC_CACHE"] = saved
    # where each other row first leaves plain masked decoding, with the masked-logit margin there
    divergences = {name: [d for task, ours, theirs in zip(tasks, by_method[PLAIN], runs)
                          if (d := divergence(lm, task, ours.token_ids, theirs.token_ids)) is not None]
                   for name, runs in by_method.items()
                   if name == PEER or (name != PLAIN and isinstance(compared[name], dict))}
    print_report(console, lm, compared, by_method, compile_times, args.max_new_tokens, divergences)
    return 0


if __name__ == "__main__":  # python -m structspec.tools.benchmarks.bench: the same as `structspec bench`
    command = argparse.ArgumentParser(prog="structspec bench", epilog=EXIT_CODES, formatter_class=Formatter,
                                      allow_abbrev=False)
    bench_arguments(command)
    sys.exit(run_command("bench", main, command.parse_args()))
