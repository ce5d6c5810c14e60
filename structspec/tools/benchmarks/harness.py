"""The measuring harness that `bench` and `compare` share: methods, one runner, one summary.

A method is a row of a report: structspec's are `generate_result` keywords
(`methods`), or `generate_batch` keywords with a ``batch_size`` (`batched`:
every task in one batched call); a peer is a function that decodes the same
prompt its own way (`structspec.tools.benchmarks.peers`). `run_tasks` runs every method on
every task with the same prompt (`task_prompt`: `tasks.extraction_prompt`, or a
template of the user's) and judges each
output as a user would read it (`judge`); `summarize` adds one method's runs up.
structspec's numbers come from its `Stats` (a batched row's share of each shared
pass), a peer's from its `PeerRun`: the harness times nothing.

Typical use::

    by_method = run_tasks(lm, spread(load_tasks(), 6), methods() | batched(methods(), 8), 200, Console())
    summaries = [summarize(runs) for runs in by_method.values()]
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rich.console import Console

import structspec
from structspec.decoding.drafters.factory import SelfDraft, Staged
from structspec.decoding.drafters.tree import TreeDrafter
from structspec.models.transformers_lm import LM
from structspec.result import no_pass_tokens
from structspec.tools.benchmarks.peers import PeerRun, unconstrained_greedy
from structspec.tools.tasks import Task, extraction_prompt, field_accuracy

PLAIN = "plain masked"  # plain masked decoding: the row every speed-up must match token for token

Keywords = dict[str, Any]  # `generate_result`'s keywords; with "batch_size", `generate_batch`'s
Peer = Callable[[LM, Task, list[int], int], PeerRun]  # (lm, task, prompt ids, max_new_tokens) → its run
Method = Keywords | Peer


def methods(draft_model: LM | None = None, self_draft: bool = False, trees: bool = False) -> dict[str, Keywords]:
    """structspec's rows in table order: plain masked decoding, fast-forward, then drafting on top of it.

    ``trees`` adds token trees and lookahead decoding after prompt lookup; ``self_draft`` adds the
    drafters built from the target's own first layers (self-draft, staged
    self-draft, threshold, auto); ``draft_model`` adds the draft-model rows,
    plain and staged.
    """
    drafts: dict[str, Any] = {"prompt lookup": "prompt_lookup"} | (
        {"tree": TreeDrafter(), "lookahead": "lookahead"} if trees else {})
    if self_draft:
        drafts |= {"self-draft": SelfDraft(), "staged self-draft": Staged(), "threshold": SelfDraft(threshold=True),
                   "auto": "auto"}
    if draft_model is not None:
        drafts |= {"draft model": draft_model, "staged draft model": Staged(draft_model)}
    return {
        PLAIN: {"fast_forward": "off", "draft": None},
        "fast-forward": {"fast_forward": "exact", "draft": None},
    } | {f"+ {name}": {"fast_forward": "exact", "draft": draft} for name, draft in drafts.items()}


def batched(rows: Mapping[str, Keywords], batch_size: int) -> dict[str, Keywords]:
    """``rows`` again, each decoding every task ``batch_size`` rows per target pass (one `generate_batch` call),
    labelled ", batch N" (a "+ ..." row is named with the fast-forward it builds on)."""
    return {f"{'fast-forward ' if label.startswith('+ ') else ''}{label}, batch {batch_size}":
            keywords | {"batch_size": batch_size} for label, keywords in rows.items()}


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
class Run:
    """One method on one task: its tokens and their sources, its cost, and how good the output is."""

    method: str
    task_id: str
    token_ids: list[int]
    sources: list[str]  # per token, as in `Result.sources`; a peer's tokens all count as "model"
    text: str
    finished: bool  # False: max_new_tokens ran out
    forward_passes: int  # of the target
    model_seconds: float
    constraint_seconds: float  # for a peer: inside its logits processor
    draft_passes: int
    draft_seconds: float
    drafts: tuple[tuple[str, int, int], ...]  # (source, drafted, accepted)
    valid_json: bool
    schema_valid: bool
    accuracy: float | None  # None: the task has no expected value

    @property
    def seconds(self) -> float:
        """Decoding time: model, constraint and drafter (a peer's whole ``generate`` call)."""
        return self.model_seconds + self.constraint_seconds + self.draft_seconds


@dataclass(frozen=True)
class Verdict:
    """How a user would judge an output: is it JSON, does it fit the schema, how many fields are right."""

    valid_json: bool
    schema_valid: bool
    accuracy: float | None  # None: the task has no expected value


def parse_json(text: str) -> Any:
    """``text`` as JSON, as a user would read a model's answer: outer whitespace and a ``` fence removed.

    Raises ValueError when it is not JSON.
    """
    fenced = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", text, re.DOTALL)
    return json.loads(fenced.group(1) if fenced else text)


def judge(task: Task, text: str) -> Verdict:
    """Check ``text`` against ``task``: valid JSON, valid against the schema, field accuracy."""
    try:
        value = parse_json(text)
        valid_json = True
    except ValueError:
        value, valid_json = None, False
    schema_valid = valid_json and _validates(task, value)
    accuracy = None
    if task.expected:  # fields of any JSON object count, so an almost-right peer answer gets partial credit
        accuracy = field_accuracy(value, task.expected) if isinstance(value, dict) else 0.0
    return Verdict(valid_json, schema_valid, accuracy)


def _validates(task: Task, value: Any) -> bool:
    try:
        task.schema.model_validate(value, strict=False)
    except ValueError:  # pydantic.ValidationError
        return False
    return True


def task_prompt(task: Task, template: str | None = None) -> list[dict[str, str]]:
    """The chat messages every method gets for ``task``: `tasks.extraction_prompt`, or ``template`` with the
    task's document in place of ``{document}``."""
    if template is None:
        return extraction_prompt(task.text, task.schema)
    return [{"role": "user", "content": template.replace("{document}", task.text)}]  # templates may hold braces


def run_structspec(lm: LM, task: Task, label: str, keywords: Keywords, max_new_tokens: int,
                   template: str | None = None) -> Run:
    """``generate_result`` with ``keywords`` on the task's prompt (`task_prompt`); a run out of budget keeps its
    partial output."""
    r = structspec.generate_result(lm, task.schema, task_prompt(task, template), max_new_tokens=max_new_tokens,
                                   **keywords)
    return _run_of(label, task, r)


def run_batched(lm: LM, tasks: list[Task], label: str, keywords: Keywords, max_new_tokens: int,
                template: str | None = None) -> list[Run]:
    """``generate_batch`` with ``keywords`` (``batch_size`` among them) on every task's prompt (`task_prompt`), in
    task order.

    A row that could not run raises its error, as ``generate_result`` would have.
    """
    results = structspec.generate_batch(lm, [t.schema for t in tasks], [task_prompt(t, template) for t in tasks],
                                        max_new_tokens=max_new_tokens, **keywords)
    for r in results:
        if r.error is not None:
            raise r.error
    return [_run_of(label, task, r) for task, r in zip(tasks, results)]


def _run_of(label: str, task: Task, r: structspec.Result) -> Run:
    s = r.stats
    return Run(method=label, task_id=task.id, token_ids=r.token_ids, sources=r.sources, text=r.text,
               finished=r.complete, forward_passes=s.target_forward_passes, model_seconds=s.model_seconds,
               constraint_seconds=s.constraint_seconds, draft_passes=s.draft_passes, draft_seconds=s.draft_seconds,
               drafts=tuple((name, d.drafted, d.accepted) for name, d in s.drafts.items()),
               **asdict(judge(task, r.text)))


def run_peer(lm: LM, task: Task, label: str, peer: Peer, prompt_ids: list[int], max_new_tokens: int) -> Run:
    """A peer on the task's prompt ids; it finished if it stopped before ``max_new_tokens``."""
    p = peer(lm, task, prompt_ids, max_new_tokens)
    return Run(method=label, task_id=task.id, token_ids=p.token_ids, sources=["model"] * len(p.token_ids),
               text=p.text, finished=len(p.token_ids) < max_new_tokens, forward_passes=p.forward_passes,
               model_seconds=p.seconds - p.mask_seconds, constraint_seconds=p.mask_seconds, draft_passes=0,
               draft_seconds=0.0, drafts=(), **asdict(judge(task, p.text)))


def run_tasks(lm: LM, tasks: list[Task], rows: Mapping[str, Method], max_new_tokens: int,
              console: Console, template: str | None = None) -> dict[str, list[Run]]:
    """Every method on every task, in ``rows`` order, on the same prompt (`task_prompt` with ``template``): task
    by task, then each batched method on all tasks at once; a progress line per task and per batched method."""
    unconstrained_greedy(lm, lm.encode_prompt("warm-up"), 2)  # first-call overheads out of the way
    by_method: dict[str, list[Run]] = {label: [] for label in rows}
    one_by_one = {label: m for label, m in rows.items() if not (isinstance(m, dict) and "batch_size" in m)}
    for n, task in enumerate(tasks, 1):
        prompt_ids = lm.encode_prompt(task_prompt(task, template))
        for label, method in one_by_one.items():
            run = (run_structspec(lm, task, label, method, max_new_tokens, template) if isinstance(method, dict)
                   else run_peer(lm, task, label, method, prompt_ids, max_new_tokens))
            by_method[label].append(run)
        line = " · ".join(f"{label} {by_method[label][-1].forward_passes}"
                          + ("" if by_method[label][-1].finished else " (budget ran out)") for label in one_by_one)
        console.print(f"[{n}/{len(tasks)}] {task.id}: forward passes {line}", highlight=False)
    for label, method in rows.items():
        if label not in one_by_one:
            by_method[label] = runs = run_batched(lm, tasks, label, method, max_new_tokens, template)
            console.print(f"{label}: {len(runs)} tasks, forward passes "
                          f"{sum(r.forward_passes for r in runs)} (each shared pass counted once per row), budget "
                          f"ran out on {sum(not r.finished for r in runs)}", highlight=False)
    return by_method


@dataclass(frozen=True)
class Summary:
    """One method over all tasks, finished or out of budget."""

    method: str
    records: int
    forward_passes: int
    output_tokens: int
    no_pass_tokens: int
    model_seconds: float
    constraint_seconds: float
    draft_passes: int
    draft_seconds: float
    valid_json: float  # share of all tasks
    schema_valid: float  # share of all tasks
    accuracy: float | None  # mean over the tasks with an expected value; None: no task has one
    unfinished: int

    @property
    def seconds(self) -> float:
        return self.model_seconds + self.constraint_seconds + self.draft_seconds

    @property
    def passes_per_token(self) -> float:
        return self.forward_passes / max(self.output_tokens, 1)

    @property
    def tokens_per_second(self) -> float:
        return self.output_tokens / max(self.seconds, 1e-9)

    @property
    def records_per_second(self) -> float:
        return self.records / max(self.seconds, 1e-9)

    @property
    def constraint_ms_per_pass(self) -> float:
        return 1000 * self.constraint_seconds / max(self.forward_passes, 1)

    @property
    def model_ms_per_pass(self) -> float:
        return 1000 * self.model_seconds / max(self.forward_passes, 1)


def summarize(runs: list[Run]) -> Summary:
    """One method's runs added up (``runs`` all of one method)."""
    scored = [r.accuracy for r in runs if r.accuracy is not None]
    return Summary(
        method=runs[0].method,
        records=len(runs),
        forward_passes=sum(r.forward_passes for r in runs),
        output_tokens=sum(len(r.token_ids) for r in runs),
        no_pass_tokens=sum(no_pass_tokens(r.sources) for r in runs),
        model_seconds=sum(r.model_seconds for r in runs),
        constraint_seconds=sum(r.constraint_seconds for r in runs),
        draft_passes=sum(r.draft_passes for r in runs),
        draft_seconds=sum(r.draft_seconds for r in runs),
        valid_json=sum(r.valid_json for r in runs) / len(runs),
        schema_valid=sum(r.schema_valid for r in runs) / len(runs),
        accuracy=sum(scored) / len(scored) if scored else None,
        unfinished=sum(not r.finished for r in runs),
    )
