"""The savings report: forward passes structspec saves against unconstrained decoding, on one model.

    structspec compare [--limit N] [--out compare-report]

Every method gets the same prompt (`tasks.extraction_prompt`, which asks for
JSON) on each task. The unconstrained row is what a user would do without
structspec: plain greedy ``model.generate``, then parse the text as JSON. The
other rows are `generate_result` with the keywords in `methods`. Numbers come
from each run's `Stats` (structspec) or `PeerRun` (unconstrained); wall time is
decoding time (model, constraint and drafter time; the whole ``generate`` call
for the peer),
with compilation excluded because it is cached per schema.

Writes ``compare.png`` (forward passes per record by method), ``compare.html``
(the table, the chart, and every output's tokens colored by how they were
produced) and ``compare.json`` (every run's numbers) into ``--out``.
"""

from __future__ import annotations

import argparse
import base64
import html
import io
import json
import re
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

import structspec
from structspec.tools.bench import spread
from structspec.tools.explain import html_page, legend_html, no_pass_tokens, tokens_html, token_views
from structspec.tools.jobs import JobConfigError, load_model
from structspec.lm import LM
from structspec.tools.peers import unconstrained_greedy
from structspec.tools.tasks import Task, extraction_prompt, field_accuracy, load_tasks

UNCONSTRAINED = "unconstrained"
Method = tuple[str, dict[str, Any]]  # (label, generate_result keywords)


def methods(draft_model: LM | None = None) -> list[Method]:
    """structspec's rows in table order, after the unconstrained one: plain masked decoding, then the speed-ups."""
    rows: list[Method] = [
        ("plain masked", {"fast_forward": "off"}),
        ("fast-forward", {"fast_forward": "exact"}),
        ("fast-forward canonical", {"fast_forward": "canonical"}),
        ("+ prompt lookup", {"fast_forward": "exact", "draft": "prompt_lookup"}),
    ]
    if draft_model is not None:
        rows.append(("+ draft model", {"fast_forward": "exact", "draft": draft_model}))
    return rows


@dataclass(frozen=True)
class Run:
    """One method on one task: its tokens and their sources, its cost, and how good the output is."""

    method: str
    task_id: str
    token_ids: list[int]
    sources: list[str]
    text: str
    finished: bool  # False: max_new_tokens ran out
    forward_passes: int
    seconds: float
    valid_json: bool
    schema_valid: bool
    accuracy: float | None  # None: the task has no expected value


def parse_json(text: str) -> Any:
    """``text`` as JSON, as a user would read a model's answer: outer whitespace and a ``` fence removed.

    Raises ValueError when it is not JSON.
    """
    fenced = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", text, re.DOTALL)
    return json.loads(fenced.group(1) if fenced else text)


def judge(method: str, task: Task, token_ids: list[int], sources: list[str], text: str, finished: bool,
          forward_passes: int, seconds: float) -> Run:
    """A `Run` with the output checked: valid JSON, valid against the task's schema, field accuracy."""
    try:
        value = parse_json(text)
        valid_json = True
    except ValueError:
        value, valid_json = None, False
    schema_valid = valid_json and _validates(task, value)
    accuracy = None
    if task.expected:  # fields of any JSON object count, so an almost-right peer answer gets partial credit
        accuracy = field_accuracy(value, task.expected) if isinstance(value, dict) else 0.0
    return Run(method, task.id, token_ids, sources, text, finished, forward_passes, seconds, valid_json,
               schema_valid, accuracy)


def _validates(task: Task, value: Any) -> bool:
    try:
        task.schema.model_validate(value, strict=False)
    except ValueError:  # pydantic.ValidationError
        return False
    return True


def run_unconstrained(lm: LM, task: Task, max_new_tokens: int) -> Run:
    prompt_ids = lm.encode_prompt(extraction_prompt(task.text, task.schema))
    p = unconstrained_greedy(lm, prompt_ids, max_new_tokens)
    finished = p.forward_passes > p.output_tokens  # the last pass produced EOS
    return judge(UNCONSTRAINED, task, p.token_ids, ["model"] * len(p.token_ids), p.text, finished,
                 p.forward_passes, p.seconds)


def run_structspec(lm: LM, task: Task, method: Method, max_new_tokens: int) -> Run:
    label, keywords = method
    prompt = extraction_prompt(task.text, task.schema)
    try:
        r = structspec.generate_result(lm, task.schema, prompt, max_new_tokens=max_new_tokens, **keywords)
        ids, sources, text, stats, finished = r.token_ids, r.sources, r.text, r.stats, True
    except structspec.TokenBudgetExceeded as e:  # the partial output still counts its passes
        ids, sources, text, stats, finished = e.token_ids, e.sources, e.text, e.stats, False
    return judge(label, task, ids, sources, text, finished, stats.target_forward_passes,
                 stats.model_seconds + stats.constraint_seconds + stats.draft_seconds)


@dataclass(frozen=True)
class Summary:
    """One method over all tasks."""

    method: str
    forward_passes: int
    output_tokens: int
    no_pass_tokens: int
    seconds: float
    valid_json: float
    schema_valid: float
    accuracy: float | None
    unfinished: int

    @property
    def passes_per_token(self) -> float:
        return self.forward_passes / max(self.output_tokens, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / max(self.seconds, 1e-9)


def summarize(runs: list[Run]) -> Summary:
    scored = [r.accuracy for r in runs if r.accuracy is not None]
    return Summary(
        method=runs[0].method,
        forward_passes=sum(r.forward_passes for r in runs),
        output_tokens=sum(len(r.token_ids) for r in runs),
        no_pass_tokens=sum(no_pass_tokens(r.sources) for r in runs),
        seconds=sum(r.seconds for r in runs),
        valid_json=sum(r.valid_json for r in runs) / len(runs),
        schema_valid=sum(r.schema_valid for r in runs) / len(runs),
        accuracy=sum(scored) / len(scored) if scored else None,
        unfinished=sum(not r.finished for r in runs),
    )


HEADERS = ["method", "forward\npasses", "passes /\nout token", "output\ntokens", "tokens\nw/o pass", "wall s",
           "tokens/s vs\nunconstr.", "valid\nJSON %", "schema-\nvalid %", "field\naccuracy"]


def flat(header: str) -> str:
    """A two-line terminal header on one line."""
    return header.replace("-\n", "-").replace("\n", " ")


def table_rows(summaries: list[Summary]) -> list[list[str]]:
    """The report table's cells, one row per method, in `HEADERS` order (the first summary is the baseline)."""
    base = summaries[0].tokens_per_second
    return [[
        s.method, f"{s.forward_passes:,}", f"{s.passes_per_token:.3f}", f"{s.output_tokens:,}",
        f"{s.no_pass_tokens / max(s.output_tokens, 1):.0%}", f"{s.seconds:.1f}", f"×{s.tokens_per_second / base:.2f}",
        f"{100 * s.valid_json:.0f}", f"{100 * s.schema_valid:.0f}",
        "—" if s.accuracy is None else f"{s.accuracy:.3f}",
    ] for s in summaries]


def rich_table(title: str, summaries: list[Summary]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right", style="bold" if i == 0 else None)
    for row in table_rows(summaries):
        table.add_row(*row)
    return table


def chart_png(by_method: dict[str, list[Run]]) -> bytes:
    """A grouped bar chart of forward passes per record, one color per method, as PNG bytes."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    from matplotlib.patches import Patch

    names = list(by_method)
    task_ids = [r.task_id for r in by_method[names[0]]]
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(9.0, 0.11 * len(task_ids) * len(names) + 2), 5.8), dpi=110)
    handles = []
    for i, name in enumerate(names):
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(task_ids))]
        bars = ax.bar(xs, [r.forward_passes for r in by_method[name]], width)
        for bar, run in zip(bars, by_method[name]):
            if not run.finished:
                bar.set_hatch("///")
        total = sum(r.forward_passes for r in by_method[name])
        handles.append(Patch(color=bars.patches[0].get_facecolor(), label=f"{name} ({total:,} in all)"))
    handles.append(Patch(facecolor="white", edgecolor="black", hatch="///", label="max_new_tokens ran out"))
    ax.set_xticks(range(len(task_ids)), task_ids, rotation=60, ha="right", fontsize=8)
    ax.set_xlim(-0.6, len(task_ids) - 0.4)
    ax.set_ylabel("target forward passes")
    ax.grid(axis="y", alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
    # The legend sits above the plot: inside it would cover the tallest bars.
    ax.legend(handles=handles, frameon=False, fontsize=9, ncols=3, loc="lower left", bbox_to_anchor=(0, 1.0))
    fig.suptitle("Forward passes per record, by method (fewer is better)", x=0.01, ha="left", fontsize=12)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def report_html(title: str, note: str, summaries: list[Summary], png: bytes, tasks: list[Task],
                by_method: dict[str, list[Run]], lm: LM) -> str:
    """The whole report as one self-contained page: table, chart, then each task's outputs as token views."""
    head = "".join(f"<th>{html.escape(flat(h))}</th>" for h in HEADERS)
    rows = "".join(
        "<tr>" + "".join(f'<td{"" if i == 0 else " class=num"}>{html.escape(c)}</td>' for i, c in enumerate(row))
        + "</tr>" for row in table_rows(summaries))
    parts = [
        f"<h1>{html.escape(title)}</h1>", f'<p class="muted">{html.escape(note)}</p>',
        f"<table><tr>{head}</tr>{rows}</table>",
        f'<img alt="forward passes per record" style="max-width:100%" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">',
        "<h2>Outputs</h2><p>Each output token is colored by how it was produced; hover a token for its position, "
        "id, source and bytes. Unconstrained output is all <i>model</i>: one forward pass per token.</p>",
    ]
    for i, task in enumerate(tasks):
        parts.append(f"<h3>{html.escape(task.id)} <span class=muted>({html.escape(task.schema_name)})</span></h3>")
        parts.append(f"<details><summary>document</summary><p>{html.escape(task.text)}</p></details>")
        if task.expected:
            parts.append(f"<details><summary>expected</summary><pre>{html.escape(json.dumps(task.expected))}"
                         "</pre></details>")
        for name, runs in by_method.items():
            r = runs[i]
            views = token_views(lm.vocab.token_bytes, r.token_ids, r.sources)
            verdict = "schema-valid" if r.schema_valid else "valid JSON, not schema-valid" if r.valid_json \
                else "not valid JSON"
            stats = (f"{r.forward_passes} forward passes · {len(r.token_ids)} tokens · {verdict}"
                     + ("" if r.accuracy is None else f" · field accuracy {r.accuracy:.2f}")
                     + ("" if r.finished else " · max_new_tokens ran out"))
            parts.append(f"<h4>{html.escape(name)} <span class=muted>{html.escape(stats)}</span></h4>")
            parts.append(legend_html(views) + tokens_html(views))
    return html_page(title, "\n".join(parts))


def run_methods(lm: LM, tasks: list[Task], rows: list[Method], max_new_tokens: int,
                console: Console) -> dict[str, list[Run]]:
    """Every method on every task, the unconstrained peer first; a progress line per task."""
    unconstrained_greedy(lm, lm.encode_prompt("warm-up"), 2)  # first-call overheads out of the way
    by_method: dict[str, list[Run]] = {UNCONSTRAINED: []} | {label: [] for label, _ in rows}
    for n, task in enumerate(tasks, 1):
        by_method[UNCONSTRAINED].append(run_unconstrained(lm, task, max_new_tokens))
        for method in rows:
            by_method[method[0]].append(run_structspec(lm, task, method, max_new_tokens))
        line = " · ".join(f"{name} {runs[-1].forward_passes}" for name, runs in by_method.items())
        console.print(f"[{n}/{len(tasks)}] {task.id}: forward passes {line}", highlight=False)
    return by_method


def write_report(out: Path, title: str, note: str, tasks: list[Task], by_method: dict[str, list[Run]],
                 lm: LM) -> list[Path]:
    """Write compare.png, compare.html and compare.json into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    summaries = [summarize(runs) for runs in by_method.values()]
    png = chart_png(by_method)
    paths = [out / "compare.png", out / "compare.html", out / "compare.json"]
    paths[0].write_bytes(png)
    paths[1].write_text(report_html(title, note, summaries, png, tasks, by_method, lm), encoding="utf-8")
    paths[2].write_text(json.dumps(
        {"title": title, "summaries": [asdict(s) for s in summaries],
         "runs": [asdict(r) for runs in by_method.values() for r in runs]}, ensure_ascii=False), encoding="utf-8")
    return paths


def main(args: argparse.Namespace) -> int:
    """``structspec compare``: run every method on every task, print the table, write PNG, HTML and JSON."""
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        tasks = spread(load_tasks(args.tasks, args.schemas), args.limit)
    except (OSError, KeyError, ValueError) as e:
        raise JobConfigError(f"cannot load the tasks: {e}") from None
    if not tasks:
        raise JobConfigError(f"{args.tasks} has no tasks")
    draft = load_model(args.draft) if args.draft else None
    lm = load_model(args.model)
    console = Console() if Console().is_terminal else Console(width=170)
    by_method = run_methods(lm, tasks, methods(draft), args.max_new_tokens, console)

    summaries = [summarize(runs) for runs in by_method.values()]
    title = f"{lm.name}: {len(tasks)} records, greedy, max_new_tokens={args.max_new_tokens}"
    note = (f"{torch.get_num_threads()} CPU threads, {datetime.now():%Y-%m-%d %H:%M}. Wall time is decoding time "
            "(compilation is cached per schema and excluded). Field accuracy: mean over records with expected "
            "values; output that is not a JSON object scores 0. Unfinished (max_new_tokens ran out): "
            + ", ".join(f"{s.method} {s.unfinished}" for s in summaries) + ".")
    console.print(rich_table(title, summaries))
    console.print(note, highlight=False)
    paths = write_report(Path(args.out), title, note, tasks, by_method, lm)
    console.print("wrote " + ", ".join(map(str, paths)), highlight=False)
    return 0
