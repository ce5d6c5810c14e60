"""Benchmark: structspec against outlines and transformers on the extraction tasks, same model, same prompts.

    python -m structspec.tools.bench [--model smollm2-135m] [--draft-model NAME] [--limit N] [--max-new-tokens 200]

Measuring and printing are separate: `run_tasks` and `measure_compile` return
plain records, `print_report` renders them. A method is a function
``(lm, task, prompt_ids) -> MethodRun``; add one to `methods` and it becomes a
row. structspec's numbers come from its `Stats`; the bench times nothing of
structspec itself.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import torch
from rich.console import Console
from rich.table import Table

import structspec
from structspec.automaton import fsm
from structspec.decoding.fastforward import FastForward
from structspec.lm import DEFAULT_MODEL, LM
from structspec.decoding.drafters import early_exit
from structspec.tools.peers import (
    PeerRun,
    hf_assisted,
    hf_prompt_lookup,
    outlines_backend,
    outlines_greedy,
    unconstrained_greedy,
)
from structspec.tools.tasks import Task, extraction_prompt, field_accuracy, load_tasks

REFERENCE, PEER = "structspec", "outlines"  # plain masked decoding in both: the oracle pair


@dataclass(frozen=True)
class MethodRun:
    """One method on one task (a run out of budget still reports its passes and times)."""

    token_ids: list[int]
    text: str
    finished: bool  # False: max_new_tokens ran out
    forward_passes: int
    model_seconds: float = 0.0
    constraint_seconds: float = 0.0  # for peers: inside their logits processor
    draft_passes: int = 0
    draft_seconds: float = 0.0
    drafts: tuple[tuple[str, int, int], ...] = ()  # (source, drafted, accepted)


Method = Callable[[LM, Task, list[int]], MethodRun]


def methods(max_new_tokens: int, draft_model: LM | None = None) -> dict[str, Method]:
    """The compared methods, in table order: plain masked decoding first (the oracle pair), then speed-ups,
    then transformers' own (unconstrained) speculative decoding."""

    def structspec_method(fast_forward: FastForward, draft: Any = None) -> Method:
        def run(lm: LM, task: Task, prompt_ids: list[int]) -> MethodRun:
            return _run_structspec(lm, task, max_new_tokens, fast_forward, draft)
        return run

    def peer(generate: Callable[[LM, Task, list[int]], PeerRun]) -> Method:
        def run(lm: LM, task: Task, prompt_ids: list[int]) -> MethodRun:
            p = generate(lm, task, prompt_ids)
            finished = len(p.token_ids) < max_new_tokens
            return MethodRun(p.token_ids, p.text, finished, p.forward_passes, p.seconds - p.mask_seconds,
                             p.mask_seconds)
        return run

    rows = {
        REFERENCE: structspec_method("off"),
        PEER: peer(lambda lm, task, ids: outlines_greedy(lm, structspec.to_regex(task.schema), ids, max_new_tokens)),
        "structspec ff-exact": structspec_method("exact"),
        "structspec ff-canonical": structspec_method("canonical"),
        "structspec ff + prompt lookup": structspec_method("exact", "prompt_lookup"),
        "structspec ff + self-draft": structspec_method("exact", "self"),
        "structspec ff + threshold": structspec_method("exact", "threshold"),
        "structspec ff + auto": structspec_method("exact", "auto"),
    }
    if draft_model is not None:
        rows[f"structspec ff + draft {draft_model.name}"] = structspec_method("exact", draft_model)
    rows |= {
        "HF greedy (unconstrained)": peer(lambda lm, task, ids: unconstrained_greedy(lm, ids, max_new_tokens)),
        "HF prompt lookup (unconstrained)": peer(lambda lm, task, ids: hf_prompt_lookup(lm, ids, max_new_tokens)),
        "HF assisted, self-draft (unconstrained)": peer(
            lambda lm, task, ids: hf_assisted(lm, early_exit(lm), ids, max_new_tokens)),
    }
    if draft_model is not None:
        rows[f"HF assisted, {draft_model.name} (unconstrained)"] = peer(
            lambda lm, task, ids: hf_assisted(lm, draft_model, ids, max_new_tokens))
    return rows


def _run_structspec(lm: LM, task: Task, max_new_tokens: int, fast_forward: FastForward, draft: Any) -> MethodRun:
    """structspec greedy on the task's prompt; its numbers are its own `Stats`."""
    try:
        r = structspec.generate_result(lm, task.schema, extraction_prompt(task.text, task.schema),
                                       max_new_tokens=max_new_tokens, fast_forward=fast_forward, draft=draft)
        ids, text, finished, s = r.token_ids, r.text, True, r.stats
    except structspec.TokenBudgetExceeded as e:  # the partial output and its stats
        ids, text, finished, s = e.token_ids, e.text, False, e.stats
    drafts = tuple((name, d.drafted, d.accepted) for name, d in s.drafts.items())
    return MethodRun(ids, text, finished, s.target_forward_passes, s.model_seconds, s.constraint_seconds,
                     s.draft_passes, s.draft_seconds, drafts)


def spread(tasks: list[Task], limit: int | None) -> list[Task]:
    """The first ``limit`` tasks taking one of each schema in turn (all tasks, in file order, without a limit)."""
    if limit is None:
        return tasks
    by_schema: dict[str, list[Task]] = {}
    for task in tasks:
        by_schema.setdefault(task.schema_name, []).append(task)
    turns = [group[i] for i in range(len(tasks)) for group in by_schema.values() if i < len(group)]
    return turns[:limit]


@dataclass(frozen=True)
class TaskRun:
    task: Task
    runs: dict[str, MethodRun]


def run_tasks(lm: LM, tasks: list[Task], methods: dict[str, Method], console: Console) -> list[TaskRun]:
    """Run every method on every task, one after the other, printing a line per task."""
    unconstrained_greedy(lm, lm.encode_prompt("warm-up"), 2)  # first-call overheads out of the way
    out = []
    for i, task in enumerate(tasks, 1):
        prompt_ids = lm.encode_prompt(extraction_prompt(task.text, task.schema))
        runs = {name: method(lm, task, prompt_ids) for name, method in methods.items()}
        line = "  ".join(f"{name} {_describe(r)}" for name, r in runs.items())
        console.print(f"[{i}/{len(tasks)}] {task.id}: {line}", highlight=False)
        out.append(TaskRun(task, runs))
    return out


def _describe(r: MethodRun) -> str:
    passes = f"{r.forward_passes} passes {r.model_seconds + r.constraint_seconds:.1f} s"
    return f"{len(r.token_ids)} tok, {passes}" + ("" if r.finished else ", budget ran out")


@dataclass(frozen=True)
class CompileTimes:
    """Seconds to get a schema's constraint ready: structspec cold and from its disk cache, outlines' Index."""

    cold: float
    cached: float
    outlines_index: float


def measure_compile(lm: LM, tasks: list[Task]) -> dict[str, CompileTimes]:
    """Compile each schema cold, then again from structspec's disk cache, and build outlines' Index.

    Cold needs ``STRUCTSPEC_CACHE`` to point at an empty directory (see `main`).
    """
    backend = outlines_backend(lm)  # its vocabulary is built once per LM, not per schema
    out = {}
    for name, schema in {t.schema_name: t.schema for t in tasks}.items():
        fsm._MEMORY.clear()
        cold = structspec.compile(schema, lm).fsm.info
        fsm._MEMORY.clear()
        cached = structspec.compile(schema, lm).fsm.info
        if (cold.source, cached.source) != ("compiled", "disk"):
            raise RuntimeError(f"{name}: expected a cold compile then a disk load, got {cold.source}, {cached.source}")
        regex = structspec.to_regex(schema)
        start = time.perf_counter()
        backend.get_regex_logits_processor(regex)
        out[name] = CompileTimes(cold.seconds, cached.seconds, time.perf_counter() - start)
    return out


@dataclass(frozen=True)
class Summary:
    """One method over all the tasks, finished or out of budget."""

    forward_passes: int
    output_tokens: int
    model_seconds: float
    constraint_seconds: float
    draft_passes: int
    draft_seconds: float
    valid: float  # share of all tasks whose output validates against the schema
    accuracy: float  # mean field accuracy over tasks with an expected value (invalid output: 0)

    @property
    def passes_per_token(self) -> float:
        return self.forward_passes / max(self.output_tokens, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / max(self.model_seconds + self.constraint_seconds + self.draft_seconds, 1e-9)

    @property
    def constraint_ms_per_pass(self) -> float:
        return 1000 * self.constraint_seconds / max(self.forward_passes, 1)

    @property
    def model_ms_per_pass(self) -> float:
        return 1000 * self.model_seconds / max(self.forward_passes, 1)


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def parse(task: Task, text: str) -> dict | None:
    """The output as a dict if it validates against the task's schema, else None."""
    try:
        task.schema.model_validate_json(text)
    except pydantic.ValidationError:
        return None
    return json.loads(text)


def summarize(task_runs: list[TaskRun], name: str) -> Summary:
    speed = [tr.runs[name] for tr in task_runs]
    values = [(tr.task, parse(tr.task, tr.runs[name].text)) for tr in task_runs]
    scored = [field_accuracy(v, t.expected) if v is not None else 0.0 for t, v in values if t.expected]
    return Summary(
        forward_passes=sum(r.forward_passes for r in speed),
        output_tokens=sum(len(r.token_ids) for r in speed),
        model_seconds=sum(r.model_seconds for r in speed),
        constraint_seconds=sum(r.constraint_seconds for r in speed),
        draft_passes=sum(r.draft_passes for r in speed),
        draft_seconds=sum(r.draft_seconds for r in speed),
        valid=sum(v is not None for _, v in values) / max(len(values), 1),
        accuracy=_mean(scored),
    )


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where ``a`` and ``b`` differ (or where one ends), None if equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


_COLUMNS = [  # header, format
    ("forward\npasses", "{:,}"), ("passes /\nout token", "{:.3f}"), ("draft\npasses", "{:,}"), ("output\ntokens", "{:,}"),
    ("tokens/s", "{:.1f}"), ("constraint\nms/step", "{:.3f}"), ("model\nms/pass", "{:.1f}"),
    ("compile\ncold s", "{:.3f}"), ("compile\ncached s", "{:.3f}"), ("valid %", "{:.1f}"),
    ("field\naccuracy", "{:.3f}"),
]


def _row(s: Summary, compile_seconds: tuple[float | None, float | None]) -> list[float | None]:
    """A method's values in `_COLUMNS` order (None: not applicable)."""
    cold, cached = compile_seconds
    return [s.forward_passes, s.passes_per_token, s.draft_passes, s.output_tokens, s.tokens_per_second, s.constraint_ms_per_pass,
            s.model_ms_per_pass, cold, cached, 100 * s.valid, s.accuracy]


def print_report(console: Console, lm: LM, task_runs: list[TaskRun], compile_times: dict[str, CompileTimes],
                 max_new_tokens: int) -> None:
    names = list(task_runs[0].runs)
    structspec_rows = [n for n in names if n.startswith(REFERENCE)]  # they share structspec's compile
    times = list(compile_times.values())
    compiles = {name: (_mean([t.cold for t in times]), _mean([t.cached for t in times])) for name in structspec_rows}
    compiles[PEER] = (_mean([t.outlines_index for t in times]), None)
    values = {name: _row(summarize(task_runs, name), compiles.get(name, (None, None))) for name in names}

    table = Table(title=f"{lm.name}: {len(task_runs)} tasks, greedy, max_new_tokens={max_new_tokens}, "
                        f"{torch.get_num_threads()} CPU threads",
                  title_justify="left")
    table.add_column("method", style="bold")
    for header, _ in _COLUMNS:
        table.add_column(header, justify="right")
    table.add_column(f"tokens/s\n÷ {PEER}", justify="right")
    speed = _COLUMNS.index(("tokens/s", "{:.1f}"))
    for name in names:
        cells = ("—" if v is None else fmt.format(v) for v, (_, fmt) in zip(values[name], _COLUMNS))
        ratio = values[name][speed] / values[PEER][speed] if PEER in values else None
        table.add_row(name, *cells, "—" if ratio is None else f"×{ratio:.2f}")
    console.print(table)

    accept = Table(title="drafts per source: accepted / drafted (acceptance rate)", title_justify="left")
    accept.add_column("method", style="bold")
    sources = sorted({d[0] for tr in task_runs for r in tr.runs.values() for d in r.drafts})
    for source in sources:
        accept.add_column(source, justify="right")
    for name in names:
        totals = {src: [0, 0] for src in sources}
        for tr in task_runs:
            for src, drafted, accepted in tr.runs[name].drafts:
                totals[src][0] += drafted
                totals[src][1] += accepted
        if any(d for d, _ in totals.values()):
            accept.add_row(name, *(f"{a:,} / {d:,} ({a / d:.0%})" if d else "—" for d, a in totals.values()))
    console.print(accept)

    budget = [tr.task.id for tr in task_runs if not all(r.finished for r in tr.runs.values())]
    console.print(
        f"Speed columns: all {len(task_runs)} tasks"
        + (f" (max_new_tokens ran out on {', '.join(budget)})." if budget else ".")
        + f" structspec: its Stats; {PEER}: generate() time outside / inside its logits processor."
        f" Compile: mean over {len(compile_times)} schemas; {PEER} builds its Index on every call (no cache)."
        f" Load average at the end (other processes skew timings): {os.getloadavg()[0]:.2f}.",
        highlight=False,
    )

    per_schema = Table(title="compile time per schema (s)", title_justify="left")
    for header in ("schema", "structspec cold", "structspec cached", f"{PEER} Index"):
        per_schema.add_column(header, justify="left" if header == "schema" else "right")
    for name, c in compile_times.items():
        per_schema.add_row(name, f"{c.cold:.3f}", f"{c.cached:.3f}", f"{c.outlines_index:.3f}")
    console.print(per_schema)

    if REFERENCE in names and PEER in names:
        diffs = [(tr, first_difference(tr.runs[REFERENCE].token_ids, tr.runs[PEER].token_ids)) for tr in task_runs]
        mismatched = [(tr, i) for tr, i in diffs if i is not None]
        console.print(f"[bold]Oracle:[/bold] {REFERENCE} and {PEER} produced the same token ids on "
                      f"{len(task_runs) - len(mismatched)}/{len(task_runs)} tasks.", highlight=False)
        for tr, i in mismatched:
            a, b = tr.runs[REFERENCE].token_ids, tr.runs[PEER].token_ids
            console.print(
                f"  {tr.task.id}: first difference at output token {i}: {REFERENCE} {a[i:i + 3]} "
                f"{lm.vocab.decode(a[i:i + 3])!r} vs {PEER} {b[i:i + 3]} {lm.vocab.decode(b[i:i + 3])!r}"
                f" after {lm.vocab.decode(a[:i])[-40:]!r}",
                highlight=False,
            )
    for name in structspec_rows[1:]:
        same_ids = sum(tr.runs[name].token_ids == tr.runs[REFERENCE].token_ids for tr in task_runs)
        same_text = sum(tr.runs[name].text == tr.runs[REFERENCE].text for tr in task_runs)
        console.print(f"{name}: same token ids as {REFERENCE} on {same_ids}/{len(task_runs)} tasks, "
                      f"same text on {same_text}/{len(task_runs)}.", highlight=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m structspec.tools.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--draft-model", default=None,
                        help="a shipped model or local dir as draft model (another tokenizer is translated through text)")
    parser.add_argument("--limit", type=int, default=None, help="run N tasks, taken in turn from each schema")
    parser.add_argument("--only", default=None,
                        help="run only methods whose name contains one of these comma-separated words "
                             f"(plus {REFERENCE!r} and {PEER!r})")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 keeps timings sane when other processes share the cores)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    console = Console() if Console().is_terminal else Console(width=160)
    lm = structspec.load(args.model)  # before moving the cache: the converted model stays where it is
    draft_model = structspec.load(args.draft_model) if args.draft_model else None
    tasks = spread(load_tasks(), args.limit)
    saved = os.environ.get("STRUCTSPEC_CACHE")
    with tempfile.TemporaryDirectory(prefix="structspec-bench-") as cache:
        os.environ["STRUCTSPEC_CACHE"] = cache  # an empty FSM cache, so the first compile is cold
        try:
            compile_times = measure_compile(lm, tasks)
            rows = methods(args.max_new_tokens, draft_model)
            if args.only:
                words = args.only.split(",")
                rows = {n: m for n, m in rows.items() if n in (REFERENCE, PEER) or any(w in n for w in words)}
            task_runs = run_tasks(lm, tasks, rows, console)
        finally:
            os.environ.pop("STRUCTSPEC_CACHE")
            if saved is not None:
                os.environ["STRUCTSPEC_CACHE"] = saved
    print_report(console, lm, task_runs, compile_times, args.max_new_tokens)


if __name__ == "__main__":
    main()
