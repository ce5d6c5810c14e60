"""The savings report: forward passes structspec saves against unconstrained decoding, on one model.

    structspec compare [--limit N] [--batch-size B] [--out compare-report]
    structspec compare --schema file.py:Model --input docs.jsonl    # your own documents, as extract takes them
        [--prompt-template prompt.txt] [--expected-field expected]

Every method gets the same prompt on each task (`harness.task_prompt`: one that
names the schema's fields and asks for JSON, or ``--prompt-template``'s). The
unconstrained row is what a user would do without structspec: plain greedy
``model.generate``, then parse the text as JSON. The
other rows are `generate_result` with the keywords in `harness.methods`, run by
the harness that `bench` uses too; with ``--batch-size B`` (B > 1) each of them
runs again through `generate_batch`, B records per target pass, as a row
labelled ", batch B" (its records/s is the column to read). Numbers come from
each run's `Stats` (structspec) or `PeerRun` (unconstrained); wall time is
decoding time (model, constraint and drafter time, a batched record's share of
each shared pass; the whole ``generate`` call for the peer), with compilation
excluded because it is cached per schema. Seconds per valid record is the
number to compare methods by: a method that finishes nothing, or writes nothing
valid, is flagged as such instead of given a speed.

Writes ``compare.png`` (forward passes per record by method), ``compare.html``
(the table, the chart, and every output's tokens colored by how they were
produced) and ``compare.json`` (every run's numbers) into ``--out``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import html
import importlib.util
import io
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from structspec.jobs.errors import JobConfigError
from structspec.jobs.prompts import read_template
from structspec.jobs.records import InputRecord, read_inputs
from structspec.models.transformers_lm import LM
from structspec.tools.command import drafting_curve, load_model
from structspec.tools.explain import html_page, legend_html, tokens_html, token_views
from structspec.tools.benchmarks.harness import Method, Run, Summary, batched, methods, run_tasks, spread, summarize
from structspec.tools.benchmarks.peers import PeerRun, unconstrained_greedy
from structspec.tools.tasks import Task, load_spec, load_tasks

UNCONSTRAINED = "unconstrained"


def rows(draft_model: LM | None = None, batch_size: int = 1) -> dict[str, Method]:
    """The report's rows in table order: the unconstrained peer, structspec's `harness.methods`, then (with
    ``batch_size`` > 1) those methods batched."""
    own = methods(draft_model)
    return {UNCONSTRAINED: _unconstrained} | own | (batched(own, batch_size) if batch_size > 1 else {})


def _unconstrained(lm: LM, task: Task, prompt_ids: list[int], max_new_tokens: int) -> PeerRun:
    """What a user would run without structspec: plain greedy ``model.generate`` on the prompt asking for JSON."""
    return unconstrained_greedy(lm, prompt_ids, max_new_tokens)


HEADERS = ["method", "forward\npasses", "passes /\nout token", "output\ntokens", "tokens\nw/o pass", "wall s",
           "records/s", "s / valid\nrecord", "tokens/s vs\nunconstr.", "valid\nJSON %", "schema-\nvalid %",
           "field\naccuracy"]
NOTHING_FINISHED = "finished none"  # a method whose every record ran out of budget: it has no speed to compare


def flat(header: str) -> str:
    """A two-line terminal header on one line."""
    return header.replace("-\n", "-").replace("\n", " ")


def valid_records(s: Summary) -> int:
    """How many of the method's records are schema-valid."""
    return round(s.schema_valid * s.records)


def seconds_per_valid_record(s: Summary) -> float | None:
    """Decoding seconds per schema-valid record (None: no record is valid)."""
    n = valid_records(s)
    return s.seconds / n if n else None


def flag(s: Summary) -> str | None:
    """What makes the method's speed meaningless, or None: it finished nothing, or nothing it wrote is valid."""
    if s.unfinished == s.records:
        return NOTHING_FINISHED
    return "none valid" if valid_records(s) == 0 else None


def table_rows(summaries: list[Summary]) -> list[list[str]]:
    """The report table's cells, one row per method, in `HEADERS` order (the first summary is the baseline).

    A method that finished nothing gets its flag instead of a tokens/s ratio (so does every row when the
    baseline finished nothing), and no seconds per valid record when none is valid."""
    base = summaries[0]
    return [[
        s.method, f"{s.forward_passes:,}", f"{s.passes_per_token:.3f}", f"{s.output_tokens:,}",
        f"{s.no_pass_tokens / max(s.output_tokens, 1):.0%}", f"{s.seconds:.1f}", f"{s.records_per_second:.3g}",
        "—" if seconds_per_valid_record(s) is None else f"{seconds_per_valid_record(s):.3g}",
        _ratio(s, base), f"{100 * s.valid_json:.0f}", f"{100 * s.schema_valid:.0f}",
        "—" if s.accuracy is None else f"{s.accuracy:.3f}",
    ] for s in summaries]


def _ratio(s: Summary, base: Summary) -> str:
    """``s``'s tokens/s over the baseline's, or why there is none."""
    if flag(s) == NOTHING_FINISHED:
        return NOTHING_FINISHED
    if flag(base) == NOTHING_FINISHED:
        return f"— ({base.method} {NOTHING_FINISHED})"
    return f"×{s.tokens_per_second / base.tokens_per_second:.2f}"


def rich_table(title: str, summaries: list[Summary]) -> Table:
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(HEADERS):
        table.add_column(header, justify="left" if i == 0 else "right", style="bold" if i == 0 else None)
    for row in table_rows(summaries):
        table.add_row(*row)
    return table


def require_matplotlib() -> None:
    """Raise `JobConfigError` naming the install when matplotlib, which draws the chart, is not importable (the
    ``plots`` extra; structspec itself does not need it). Changes nothing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise JobConfigError("structspec compare draws its chart with matplotlib, which is not installed; "
                             "pip install 'structspec-lm[plots]' (or 'matplotlib>=3.7')")


def chart_png(by_method: dict[str, list[Run]]) -> bytes:
    """A grouped bar chart of forward passes per record, one color per method, as PNG bytes; `JobConfigError`
    without matplotlib (`require_matplotlib`)."""
    require_matplotlib()
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
        {"title": title, "summaries": [_record(s) for s in summaries],
         "runs": [_record(r) for runs in by_method.values() for r in runs]}, ensure_ascii=False), encoding="utf-8")
    return paths


def _record(x: Run | Summary) -> dict:
    """A run or summary as JSON fields, with its decoding time in ``seconds``; a summary also with its seconds
    per valid record and its `flag`."""
    extra = ({"seconds_per_valid_record": seconds_per_valid_record(x), "flag": flag(x)}
             if isinstance(x, Summary) else {})
    return asdict(x) | {"seconds": x.seconds} | extra


def load_compare_tasks(args: argparse.Namespace) -> list[Task]:
    """The tasks ``args`` name (``--schema`` with ``--input``, and ``--expected-field``, else ``--tasks`` with
    ``--schemas``), at most ``--limit``; a `JobConfigError` saying what to fix when they cannot be read."""
    if (args.schema is None) != (args.input is None):
        raise JobConfigError("--schema and --input go together (your documents, one model); pass both, or "
                             "neither for --tasks")
    if args.expected_field is not None and args.input is None:
        raise JobConfigError("--expected-field names a field of --input records: pass --schema and --input too "
                             "(--tasks files hold theirs in 'expected')")
    if args.schema is not None:
        tasks = input_tasks(args.schema, args.input, args.text_field, args.id_field, args.expected_field)
    else:
        try:
            tasks = load_tasks(args.tasks, args.schemas)
        except (OSError, KeyError, ValueError, JobConfigError) as e:
            raise JobConfigError(f"cannot load the tasks: {e}") from None
    if not tasks:
        raise JobConfigError(f"{args.input or args.tasks} has no records")
    return spread(tasks, args.limit)


def input_tasks(schema: str, path: str, text_field: str = "text", id_field: str = "id",
                expected_field: str | None = None) -> list[Task]:
    """One task per record of ``path`` (read as an extraction job's input), each extracting the Pydantic model
    ``schema`` names (as ``extract --schema`` names it), its expected value the record's ``expected_field`` (a
    JSON object, or a CSV cell holding one; a record without it is not scored). `JobConfigError` for a spec that
    is not a Pydantic model (outputs are judged by its validation), a record that cannot be read, an expected
    value that is not an object, or an ``expected_field`` no record has."""
    spec = load_spec(schema)
    if not (isinstance(spec, type) and issubclass(spec, BaseModel)):
        raise JobConfigError(f"--schema {schema}: compare judges outputs with a Pydantic model's validation; "
                             "name one as package.module:Model or path/to/file.py:Model")
    records = read_inputs(path, text_field, id_field, expected_field)
    tasks = []
    for record in records:
        if record.error:
            raise JobConfigError(f"--input {path}: {record.error[1]}; fix or remove that record")
        tasks.append(Task(record.id, schema.rpartition(":")[2], spec, record.text, _expected(record, expected_field)))
    if expected_field is not None and all(task.expected is None for task in tasks):
        raise JobConfigError(f"--expected-field {expected_field!r}: no record of --input {path} has it; name the "
                             "field that holds each record's expected values")
    return tasks


def _expected(record: InputRecord, field: str | None) -> dict[str, Any] | None:
    """``record``'s expected value as an object (a CSV cell's JSON text read), None where it has none."""
    value = record.expected
    if isinstance(value, str) and value.strip():  # a CSV cell: JSON text
        with contextlib.suppress(ValueError):  # not JSON: refused below, naming the record
            value = json.loads(value)
    if value is None or value == "":
        return None
    if not isinstance(value, dict):
        raise JobConfigError(f"--expected-field {field!r} of {record.where} is not a JSON object ({value!r:.60}): "
                             "give the expected fields as an object, e.g. {\"total\": 12.5}")
    return value


def main(args: argparse.Namespace) -> int:
    """``structspec compare``: run every method on every task, print the table, write PNG, HTML and JSON.

    The tasks, the options and matplotlib (`require_matplotlib`) are checked before any model loads."""
    require_matplotlib()
    tasks = load_compare_tasks(args)
    template = read_template(args.prompt_template) if args.prompt_template else None
    lm = load_model(args)
    drafting_curve(lm, args.calibrate)  # the timed records read the curve, never measure it
    draft = load_model(args, args.draft_model) if args.draft_model else None
    console = Console() if Console().is_terminal else Console(width=170)
    progress = Console(quiet=True) if args.quiet else console
    by_method = run_tasks(lm, tasks, rows(draft, args.batch_size), args.max_new_tokens, progress, template)

    summaries = [summarize(runs) for runs in by_method.values()]
    title = (f"{lm.name} ({lm.device.type}, {str(lm.model.dtype).removeprefix('torch.')}): {len(tasks)} records, "
             f"greedy, max_new_tokens={args.max_new_tokens}")
    batch_note = (f" Rows labelled 'batch {args.batch_size}' decode {args.batch_size} records per target pass: "
                  "their forward passes count each shared pass once per record, their wall time is each "
                  "record's share of the shared passes." if args.batch_size > 1 else "")
    prompt = f"the prompt template {args.prompt_template}" if template else "a prompt naming the schema's fields"
    note = (f"{torch.get_num_threads()} CPU threads, {datetime.now():%Y-%m-%d %H:%M}. Every method gets {prompt}. "
            "Wall time is decoding time "
            "(compilation is cached per schema and excluded)." + batch_note + " Field accuracy: mean over records "
            "with expected values; output that is not a JSON object scores 0. Unfinished (max_new_tokens ran out): "
            + ", ".join(f"{s.method} {s.unfinished}" for s in summaries) + ".")
    console.print(rich_table(title, summaries))
    console.print(note, highlight=False)
    paths = write_report(Path(args.out), title, note, tasks, by_method, lm)
    console.print("wrote " + ", ".join(map(str, paths)), highlight=False)
    return 0
