"""structspec against vLLM's CPU build, one model and the same prompts: the engine benchmark.

    python -m structspec.tools.benchmarks.vllmbench [--records N] [--batch-size 32] [--tasks both] [--configs NAME,...]
    python -m structspec.tools.benchmarks.vllmbench --prefix-job

Run it from vLLM's venv (``.ci/vllm-check`` builds ``.venv-vllm``), alone on the machine. The configurations
(`CONFIGS`, in table order; each ratio is against the first one run): vLLM + xgrammar, vLLM + xgrammar + n-gram
speculation, vLLM + the structspec backend, vLLM + structspec + its proposer (where
``structspec.integrations.vllm_proposer`` is installed), and structspec's own loop. On the extraction tasks
(``examples/tasks.jsonl``) and the tool-call set (``examples/toolcalls.jsonl``), each prints seconds per record
at B = 1 (a call per record, one after another), records/s at B = ``--batch-size`` (one call per batch), engine
steps per output token, the forced share, draft acceptance and the share of outputs that validate.

Every prompt is the own loop's token ids (the chat template, with the tools for a tool call), sent to vLLM as
they are; greedy. A tool call goes to vLLM as ``vllm serve`` sends it: ``tool_choice="required"`` and a named
function constrained by the JSON Schema vLLM builds for them (`get_json_schema_from_tools`), ``auto``
unconstrained and parsed as Qwen's template writes calls; the own loop decodes its `structspec.ToolCalls`.
Each configuration runs in a fresh worker process of its own, one after another (`run_worker`). vLLM's steps
are counted exactly: its engine core runs in the worker's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) and its
scheduler's ``update_from_output`` is wrapped (`count_steps`); the own loop's come from its `Stats`.

``--prefix-job`` runs issue 53's peer instead: the extraction job of
`structspec.tools.benchmarks.prefix_reuse.job_prompts` through vLLM + xgrammar at B = 1, with vLLM's automatic prefix
caching on, then off (an engine each).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import jsonschema

from structspec.tools.command import DEFAULT_MAX_NEW_TOKENS, positive
from structspec.tools.tasks import extraction_prompt, load_tasks
from structspec.tools.benchmarks.toolbench import Conversation, load_conversations, parse_text_calls

PROPOSER_MODULE, PROPOSER_CLASS = "structspec.integrations.vllm_proposer", "GrammarProposer"
JOB_MAX_NEW_TOKENS = 300  # the prefix job's budget, as `structspec.tools.benchmarks.prefix_reuse` runs it


@dataclass(frozen=True)
class Config:
    """One compared configuration: a vLLM engine (its structured-output backend and speculation) or, with
    ``backend`` None, structspec's own loop."""

    label: str
    backend: str | None = None
    speculation: str | None = None  # "ngram" or "proposer" (structspec's, `PROPOSER_MODULE`)


CONFIGS = {
    "xgrammar": Config("vLLM + xgrammar", "xgrammar"),
    "xgrammar-ngram": Config("vLLM + xgrammar + ngram", "xgrammar", "ngram"),
    "structspec": Config("vLLM + structspec", "structspec"),
    "structspec-proposer": Config("vLLM + structspec + proposer", "structspec", "proposer"),
    "own": Config("structspec own loop"),
}
TASK_SETS = ("extraction", "toolcalls")


def config_names(text: str) -> list[str]:
    """A ``--configs`` value: comma-separated names of `CONFIGS`, in the order given (argparse's ``type``)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if unknown := [name for name in names if name not in CONFIGS]:
        raise argparse.ArgumentTypeError(f"unknown configuration {', '.join(unknown)}; choose among "
                                         f"{', '.join(CONFIGS)}, comma-separated")
    if not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"name each configuration once, comma-separated, got {text!r}")
    return names


def arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line's options; a bad one exits 2 naming it, before anything loads."""
    parser = argparse.ArgumentParser(prog="python -m structspec.tools.benchmarks.vllmbench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a shipped model name or a model directory")
    parser.add_argument("--records", type=positive, metavar="N",
                        help="N records of each task set (extraction: the first, its schemas in turn; tool calls: "
                             "spread over the file, so each choice is in; default all)")
    parser.add_argument("--batch-size", type=positive, default=32, metavar="B",
                        help="records per call in the batched run (default 32)")
    parser.add_argument("--tasks", choices=[*TASK_SETS, "both"], default="both")
    parser.add_argument("--configs", type=config_names, default=list(CONFIGS), metavar="NAME,...",
                        help=f"the configurations, in table order (default all: {','.join(CONFIGS)})")
    parser.add_argument("--max-new-tokens", type=positive, metavar="N",
                        help=f"output tokens per record (default {DEFAULT_MAX_NEW_TOKENS}; --prefix-job: "
                             f"{JOB_MAX_NEW_TOKENS}, as prefix_reuse's job)")
    parser.add_argument("--draft-tokens", type=positive, default=5, metavar="K",
                        help="vLLM's num_speculative_tokens for n-gram and the proposer (default 5)")
    parser.add_argument("--compact", action="store_true",
                        help="vLLM's disable_any_whitespace=True (the own loop's layout) instead of its default")
    parser.add_argument("--max-model-len", type=positive, default=2048, metavar="N")
    parser.add_argument("--preload", choices=["auto", "none"], default="auto",
                        help="auto: vLLM's engines get the LD_PRELOAD vLLM's CPU guide asks for (tcmalloc where "
                             "installed, the venv's libiomp5); none: the environment's as it is")
    parser.add_argument("--prefix-job", action="store_true",
                        help="issue 53's peer instead: prefix_reuse.job_prompts() on vLLM + xgrammar at B = 1, "
                             "prefix caching on, then off")
    # a worker process's options (`run_worker`): one configuration, its job file and its results file
    for option in ("--worker", "--job", "--out"):
        parser.add_argument(option, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # what a worker process is started with
    if args.prefix_job and (args.records or args.tasks != "both" or args.configs != list(CONFIGS)):
        parser.error("--prefix-job runs its own job: drop --records, --tasks and --configs")
    if args.max_new_tokens is None:
        args.max_new_tokens = JOB_MAX_NEW_TOKENS if args.prefix_job else DEFAULT_MAX_NEW_TOKENS
    return args


# ---- what is measured, and the report's arithmetic -------------------------------------------------------------

@dataclass
class Tally:
    """One configuration's totals over one task set at one batch size."""

    records: int = 0
    seconds: float = 0.0  # wall time of the calls, warm-up excluded
    output_tokens: int = 0  # without the final EOS
    steps: int = 0  # forward passes each record took part in, summed (vLLM: engine steps; own loop: Stats)
    engine_steps: int = 0  # vLLM: steps the engine ran (a batched step counts once); own loop: 0
    forced: int | None = None  # forced tokens (own loop's Stats); None where the configuration does not say
    drafted: int = 0
    accepted: int = 0
    valid: int = 0
    invalid: list[str] = field(default_factory=list)  # each invalid output: its record, why it stopped, its start
    expected_calls: int | None = None  # tool calls: turns whose calls are the expected ones (`judge_calls`)
    prompt_tokens: int = 0  # the prefix job's prompts' tokens
    cached_prompt_tokens: int = 0  # vLLM: prompt tokens its prefix cache supplied


def seconds_per_record(t: Tally) -> float:
    return t.seconds / t.records if t.records else float("nan")


def records_per_second(t: Tally) -> float:
    return t.records / t.seconds if t.seconds else float("nan")


def share(part: int | None, whole: int) -> float | None:
    """``part / whole``; None where ``part`` is unknown or ``whole`` is 0."""
    return None if part is None or not whole else part / whole


def speedup(value: float, base: float, lower_is_faster: bool) -> float:
    """How many times faster ``value`` is than ``base``: base / value for seconds, value / base for a rate."""
    return base / value if lower_is_faster else value / base


HEADER = ["configuration", "s / record (B=1)", "× first", "records/s (B={batch})", "× first",
          "steps / output token", "forced share", "draft acceptance", "valid (B=1)", "valid (B={batch})"]


def _cell(value: float | None, fmt: str) -> str:
    return "–" if value is None or value != value else fmt.format(value)  # (value != value: NaN)


def table_rows(tallies: dict[str, tuple[Tally | None, Tally | None]], skipped: dict[str, str]) -> list[list[str]]:
    """The table's rows: per configuration (label → its B = 1 and batched tallies, None where not run), the
    cells of `HEADER`; ratios against the first configuration with both tallies. ``skipped``: label → why."""
    base = next(((one, many) for one, many in tallies.values() if one and many), (None, None))
    rows = []
    for label, (one, many) in tallies.items():
        if label in skipped:
            rows.append([label, f"skipped: {skipped[label]}", *["–"] * (len(HEADER) - 2)])
            continue
        cells = [label]
        for t, rate, base_t in ((one, seconds_per_record, base[0]), (many, records_per_second, base[1])):
            value = rate(t) if t else None
            cells.append(_cell(value, "{:.3f}"))
            ratio = speedup(value, rate(base_t), rate is seconds_per_record) if value and base_t else None
            cells.append(_cell(ratio, "×{:.2f}"))
        steps_from = one or many
        cells.append(_cell(share(steps_from.steps, steps_from.output_tokens) if steps_from else None, "{:.3f}"))
        cells.append(_cell(share(steps_from.forced, steps_from.output_tokens) if steps_from else None, "{:.1%}"))
        drafted = sum(t.drafted for t in (one, many) if t)
        accepted = sum(t.accepted for t in (one, many) if t)
        cells.append(f"{accepted / drafted:.1%} of {drafted:,}" if drafted else "–")
        cells += [f"{t.valid}/{t.records}" if t else "–" for t in (one, many)]
        rows.append(cells)
    return rows


def markdown(title: str, tallies: dict[str, tuple[Tally | None, Tally | None]], skipped: dict[str, str],
             batch_size: int) -> str:
    """One task set's table in Markdown, under ``title``, then the output tokens and steps behind it."""
    header = [h.format(batch=batch_size) for h in HEADER]
    lines = [f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(tallies, skipped)]
    lines.append("")
    for label, (one, many) in tallies.items():
        if label in skipped:
            continue
        parts = [f"{name}: {t.output_tokens:,} output tokens, {t.steps:,} record-steps"
                 + (f", {t.engine_steps:,} engine steps" if t.engine_steps else "") + f", {t.seconds:.1f} s"
                 + ("" if t.expected_calls is None else f", the expected calls in {t.expected_calls}/{t.records}")
                 for name, t in (("B=1", one), (f"B={batch_size}", many)) if t]
        lines.append(f"- {label}: " + "; ".join(parts))
        lines += [f"    - invalid at {name}: {why}" for name, t in (("B=1", one), (f"B={batch_size}", many)) if t
                  for why in t.invalid]
    return "\n".join(lines)


# ---- the records ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Item:
    """One record of a task set: its chat messages, the own loop's spec, and (tool calls) its conversation."""

    id: str
    messages: list[dict[str, str]]
    spec: Any  # a Pydantic model (extraction) or a `structspec.ToolCalls`
    schema: dict[str, Any] | None = None  # extraction: the JSON Schema every output must validate against
    conversation: Conversation | None = None


def evenly(items: list[Any], n: int | None) -> list[Any]:
    """``n`` of ``items`` spread evenly over the list, in order (all without ``n``)."""
    if n is None or n >= len(items):
        return items
    return [items[i * len(items) // n] for i in range(n)]


def extraction_items(n: int | None = None) -> list[Item]:
    """The shipped extraction tasks (the first ``n``, their schemas in turn), with `extraction_prompt`."""
    from structspec.tools.benchmarks.harness import spread

    return [Item(t.id, extraction_prompt(t.text, t.schema), t.schema, t.schema.model_json_schema())
            for t in spread(load_tasks(), n)]


def toolcall_items(n: int | None = None) -> list[Item]:
    """The shipped tool-call conversations (``n`` spread over the file, so each ``choice`` is in)."""
    return [Item(c.id, c.messages, c.spec(), conversation=c) for c in evenly(load_conversations(), n)]


def vllm_tool_schema(conversation: Conversation) -> dict[str, Any] | None:
    """The JSON Schema ``vllm serve`` constrains a tool call's output with: ``required`` (all calls, parallel or
    not) and a named function; None for ``auto`` (vLLM leaves it unconstrained). Imports vLLM."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    tools = [ChatCompletionToolsParam.model_validate(t) for t in conversation.tools]
    choice: Any = conversation.choice
    if choice not in ("auto", "required", "none"):
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionNamedToolChoiceParam

        choice = ChatCompletionNamedToolChoiceParam.model_validate({"type": "function", "function": {"name": choice}})
    schema = get_json_schema_from_tools(choice, tools, parallel_tool_calls=conversation.parallel)
    return json.loads(schema) if isinstance(schema, str) else schema


def vllm_calls(conversation: Conversation, text: str, schema: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    """The calls in a vLLM output (``schema``: `vllm_tool_schema`'s), None where it does not parse or validate:
    ``required`` writes ``[{"name", "parameters"}, ...]``, a named function its arguments, ``auto`` free text
    (`parse_text_calls`)."""
    if schema is None:
        return parse_text_calls(text, conversation.tools)
    try:
        value = json.loads(text)
        jsonschema.validate(value, schema)
    except (ValueError, jsonschema.ValidationError):
        return None
    if conversation.choice == "required":
        return [{"name": call["name"], "arguments": call["parameters"]} for call in value]
    return [{"name": conversation.choice, "arguments": value}]


def valid_json(text: str, schema: dict[str, Any]) -> bool:
    """Whether ``text`` is JSON that validates against ``schema``."""
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def invalid(record: str, stop: str | None, tokens: int, text: str) -> str:
    """How the report names an invalid output: its record, why it stopped, its length and its start."""
    return f"{record} (stopped: {stop}, {tokens} tokens): {text[:100]!r}"


Verdict = tuple[bool, bool | None]
"""How an output is judged: whether it is valid, and (tool calls; None for extraction) whether its calls are the
expected ones."""


def judge_calls(conversation: Conversation, calls: list[dict[str, Any]] | None) -> Verdict:
    """A turn is valid when its calls (None: some did not parse or validate) all parse and validate (an ``auto``
    turn may answer in text, without calls); its calls are as expected when they name the expected tools, as
    many times."""
    if calls is None:
        return False, False
    return True, sorted(c["name"] for c in calls) == sorted(c["name"] for c in conversation.expected)


def score(tally: Tally, record: str, verdict: Verdict, stop: str | None, tokens: int, text: str) -> None:
    """Count one output's ``verdict`` into ``tally``, naming it among the invalid ones where it is. Changes
    ``tally``."""
    valid, expected = verdict
    tally.valid += valid
    if expected is not None:
        tally.expected_calls = (tally.expected_calls or 0) + expected
    if not valid:
        tally.invalid.append(invalid(record, stop, tokens, text))


# ---- vLLM -------------------------------------------------------------------------------------------------------

@dataclass
class StepCounts:
    """What an engine's scheduler saw, counted as vLLM's own spec-decoding stats count it."""

    engine_steps: int = 0  # steps that ran the model
    request_steps: int = 0  # (request, step) pairs: the steps each request took part in, summed
    drafted: int = 0  # draft tokens scheduled for verification (grammar-invalid ones excluded)
    accepted: int = 0
    per_request: dict[str, int] = field(default_factory=dict)  # request id → its steps


def observe(counts: StepCounts, scheduler_output: Any, model_output: Any, sampled_per_step: int) -> None:
    """Count one step's ``scheduler_output`` and ``model_output`` (vLLM's ``SchedulerOutput`` and
    ``ModelRunnerOutput``) into ``counts``: as ``Scheduler.update_from_output`` counts drafts and accepted
    tokens. Changes ``counts``."""
    scheduled = scheduler_output.num_scheduled_tokens
    if not scheduler_output.total_num_scheduled_tokens:
        return
    counts.engine_steps += 1
    refused = scheduler_output.num_invalid_spec_tokens or {}  # drafts the grammar refused (async scheduling)
    for request_id in scheduled:
        counts.request_steps += 1
        counts.per_request[request_id] = counts.per_request.get(request_id, 0) + 1
        drafts = scheduler_output.scheduled_spec_decode_tokens.get(request_id)
        index = model_output.req_id_to_index.get(request_id)
        sampled = model_output.sampled_token_ids[index] if index is not None and model_output.sampled_token_ids \
            else []
        if drafts and sampled:
            counts.drafted += len(drafts) - refused.get(request_id, 0)
            counts.accepted += max(len(sampled) - sampled_per_step, 0)


def count_steps(llm: Any) -> StepCounts:
    """Counts that every later step of ``llm`` (a ``vllm.LLM`` whose engine core runs in this process) adds to.
    Wraps its scheduler's ``update_from_output`` (an instance attribute: the class is unchanged)."""
    core = getattr(llm.llm_engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("vllmbench counts steps in the engine core, which runs apart: set "
                           "VLLM_ENABLE_V1_MULTIPROCESSING=0 before vLLM starts")
    scheduler = core.scheduler
    counts = StepCounts()
    update = scheduler.update_from_output

    def counted(scheduler_output: Any, model_output: Any) -> Any:
        observe(counts, scheduler_output, model_output, scheduler.num_sampled_tokens_per_step)
        return update(scheduler_output, model_output)

    scheduler.update_from_output = counted
    return counts


def proposer(llm: Any) -> Any:
    """The engine's structspec proposer (its ``stats`` count the forced text drafted), None where it has none."""
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner
    drafter = getattr(runner, "drafter", None)
    return drafter if type(drafter).__module__ == PROPOSER_MODULE else None


def proposer_config(k: int) -> dict[str, Any] | None:
    """structspec's proposer as vLLM's ``speculative_config`` (drafting up to ``k`` tokens), as a user writes it
    (tools do not import the integrations: vLLM loads the class by its path); None where `PROPOSER_MODULE` is
    not installed. Imports nothing of it."""
    if importlib.util.find_spec(PROPOSER_MODULE) is None:
        return None
    return {"method": "custom_class", "model": f"{PROPOSER_MODULE}.{PROPOSER_CLASS}", "num_speculative_tokens": k}


def speculative(config: Config, k: int) -> dict[str, Any] | None:
    if config.speculation == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": k, "prompt_lookup_min": 2}
    if config.speculation == "proposer":
        return proposer_config(k)
    return None


def start_engine(model_dir: str, dtype: str, backend: str, args: argparse.Namespace,
                 speculative_config: dict[str, Any] | None, prefix_caching: bool = True) -> Any:
    """A ``vllm.LLM`` over ``model_dir`` in this process: ``backend`` for structured outputs, greedy-ready,
    eager, ``--max-model-len``. Registers structspec's backend first, through vLLM's plugin loader (vLLM checks
    the name before it loads its plugins in this process)."""
    from vllm import LLM

    if backend == "structspec":
        from structspec.jobs.vllm import register_backend

        register_backend()
    return LLM(model_dir, dtype=dtype, enforce_eager=True, max_model_len=args.max_model_len, seed=0,
               enable_prefix_caching=prefix_caching, speculative_config=speculative_config,
               structured_outputs_config={"backend": backend, "disable_any_whitespace": args.compact})


def stop_engine(llm: Any) -> None:
    """Shut ``llm``'s engine core down and collect it, so its memory is back before the next engine starts."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


@dataclass(frozen=True)
class Request:
    """One record as vLLM gets it: the prompt's token ids, the structured-output keywords (None:
    unconstrained) and how its text is judged."""

    id: str
    prompt_ids: list[int]
    structured: dict[str, Any] | None
    judge: Callable[[str], Verdict]


def vllm_request(item: Item, prompt_ids: list[int]) -> Request:
    """``item`` as vLLM gets it (imports vLLM for a tool call's schema)."""
    if item.conversation is None:
        schema = item.schema
        return Request(item.id, prompt_ids, {"json": schema}, lambda text: (valid_json(text, schema), None))
    conversation = item.conversation
    tool_schema = vllm_tool_schema(conversation)
    return Request(item.id, prompt_ids, None if tool_schema is None else {"json": tool_schema},
                   lambda text: judge_calls(conversation, vllm_calls(conversation, text, tool_schema)))


def output_tokens(output: Any) -> int:
    """A vLLM output's tokens without the EOS that ended it (the own loop does not count it either): vLLM keeps
    EOS in ``token_ids`` and says it stopped there by ``finish_reason="stop"`` with no ``stop_reason``."""
    return len(output.token_ids) - (output.finish_reason == "stop" and output.stop_reason is None
                                    and len(output.token_ids) > 0)


def run_vllm(llm: Any, counts: StepCounts, requests: list[Request], batch_size: int, max_new_tokens: int) -> Tally:
    """Decode ``requests`` greedily, ``batch_size`` per ``llm.generate`` call, one call after another; their
    tally. Resets vLLM's prefix cache (and structspec's proposer's stats, where it drafts) first, so only this
    run's own prompts are reused."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    params = [SamplingParams(temperature=0, max_tokens=max_new_tokens, structured_outputs=None
                             if r.structured is None else StructuredOutputsParams(**r.structured)) for r in requests]
    llm.reset_prefix_cache()
    drafter = proposer(llm)
    if drafter is not None:
        drafter.reset_stats()
    before = StepCounts(counts.engine_steps, counts.request_steps, counts.drafted, counts.accepted)
    tally = Tally()
    start = time.perf_counter()
    outputs = []
    for i in range(0, len(requests), batch_size):
        prompts = [TokensPrompt(prompt_token_ids=r.prompt_ids) for r in requests[i:i + batch_size]]
        outputs += llm.generate(prompts, params[i:i + batch_size], use_tqdm=False)
    tally.seconds = time.perf_counter() - start
    tally.records = len(requests)
    tally.output_tokens = sum(output_tokens(o.outputs[0]) for o in outputs)
    tally.cached_prompt_tokens = sum(o.num_cached_tokens or 0 for o in outputs)
    if drafter is not None:  # structspec's proposer: the forced text it drafted
        tally.forced = drafter.stats.forced_drafted
    for r, o in zip(requests, outputs):
        out = o.outputs[0]
        valid, expected = r.judge(out.text)
        if out.finish_reason != "stop":  # cut by the budget: not valid, whatever the text so far reads as
            valid, expected = False, expected and False
        score(tally, r.id, (valid, expected), out.finish_reason, len(out.token_ids), out.text)
    tally.steps = counts.request_steps - before.request_steps
    tally.engine_steps = counts.engine_steps - before.engine_steps
    tally.drafted = counts.drafted - before.drafted
    tally.accepted = counts.accepted - before.accepted
    return tally


def warm_up(llm: Any, requests: list[Request]) -> None:
    """Two tokens of each distinct structured request, so grammars compile before the clock runs."""
    from vllm import SamplingParams, TokensPrompt
    from vllm.sampling_params import StructuredOutputsParams

    seen: dict[str, Request] = {}
    for r in requests:
        seen.setdefault(json.dumps(r.structured, sort_keys=True), r)
    llm.generate([TokensPrompt(prompt_token_ids=r.prompt_ids) for r in seen.values()],
                 [SamplingParams(temperature=0, max_tokens=2, structured_outputs=None if r.structured is None
                                 else StructuredOutputsParams(**r.structured)) for r in seen.values()],
                 use_tqdm=False)


# ---- structspec's own loop ----------------------------------------------------------------------------------------

def own_tally(items: list[Item], results: list[Any], seconds: float) -> Tally:
    """The tally of the own loop's ``results`` (one per item) from their `Stats`: steps are target and prefill
    passes; drafts every source but the FSM's forced splices (as toolbench counts them)."""
    tally = Tally(records=len(items), seconds=seconds, forced=0)
    for item, r in zip(items, results):
        s = r.stats
        tally.output_tokens += s.output_tokens
        tally.steps += s.target_forward_passes + s.prefill_passes
        tally.forced = (tally.forced or 0) + s.forced_tokens
        tally.drafted += sum(d.drafted for name, d in s.drafts.items() if name != "forced")
        tally.accepted += sum(d.accepted for name, d in s.drafts.items() if name != "forced")
        if item.conversation is None:
            verdict: Verdict = (r.complete and valid_json(r.text, item.schema), None)
        else:  # the text checked on its own, as vLLM's: its calls parsed and validated against their tools
            tools = item.conversation.tools
            verdict = judge_calls(item.conversation, parse_text_calls(r.text, tools) if r.complete else None)
        score(tally, item.id, verdict, r.stop_reason, s.output_tokens, r.text)
    return tally


def run_own(lm: Any, items: list[Item], batch_size: int, max_new_tokens: int) -> Tally:
    """The own loop over ``items`` with default options: each alone (``batch_size`` 1) or `generate_batch`.
    Clears the held prompt chunks first, so only this run's own prompts are reused."""
    import structspec
    from structspec.models.prefix_cache import clear_prefix_caches

    clear_prefix_caches()
    start = time.perf_counter()
    if batch_size == 1:
        results = [structspec.generate_result(lm, item.spec, item.messages, max_new_tokens=max_new_tokens)
                   for item in items]
    else:
        results = structspec.generate_batch(lm, [item.spec for item in items], [item.messages for item in items],
                                            batch_size=batch_size, max_new_tokens=max_new_tokens)
    return own_tally(items, results, time.perf_counter() - start)


# ---- the run ----------------------------------------------------------------------------------------------------

def machine() -> str:
    """The CPU's model name and core count, from /proc/cpuinfo where there is one."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            name = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), name)
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} logical CPUs"


def load_average() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def header(args: argparse.Namespace, dtype: str, model_dir: str) -> str:
    """The run's date, command, machine, dtype and versions, and the load average now."""
    import torch
    import vllm

    waits = ", ".join(f"{k}={os.environ[k]}" for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "LD_PRELOAD")
                      if k in os.environ) or "none set"
    return "\n".join([
        f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
        "command: " + shlex.join([os.path.basename(sys.executable), "-m", "structspec.tools.benchmarks.vllmbench",
                                  *sys.argv[1:]]),
        f"machine: {machine()}",
        f"model: {args.model} ({model_dir}), dtype {dtype} (structspec.load's default here; vLLM gets it too)",
        f"vLLM {vllm.__version__}, torch {torch.__version__}, python {platform.python_version()}; OpenMP: {waits}; "
        f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')}, max_model_len={args.max_model_len}, "
        f"enforce_eager, greedy, max_new_tokens={args.max_new_tokens}, JSON layout in vLLM: "
        + ("compact (disable_any_whitespace)" if args.compact else "any whitespace (vLLM's default)"),
        "LD_PRELOAD of vLLM's engines: " + ((vllm_preload(dict(os.environ)) or "none found") if args.preload == "auto"
                                           else os.environ.get("LD_PRELOAD", "none")),
        f"load average before: {load_average()}",
    ])


def prepare_environment() -> None:
    """vLLM's settings for this benchmark, before vLLM is imported (its worker processes inherit them): the
    engine core in the worker's process (its steps are counted there), a 1 GiB KV cache unless set, vLLM's log
    on stderr (stdout is the report). Changes ``os.environ``."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


def vllm_preload(environ: dict[str, str]) -> str:
    """The ``LD_PRELOAD`` vLLM's CPU build asks for (its warning "libtcmalloc / libiomp is not found in
    LD_PRELOAD"): tcmalloc where the system has it, this venv's Intel OpenMP where it has one, then ``environ``'s
    own. Changes nothing."""
    import ctypes.util

    found = [ctypes.util.find_library("tcmalloc_minimal") or ctypes.util.find_library("tcmalloc"),
             next((p for p in [os.path.join(sys.prefix, "lib", "libiomp5.so")] if os.path.exists(p)), None),
             environ.get("LD_PRELOAD")]
    return ":".join(p for p in found if p)


def run_worker(name: str, args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    """Run one configuration (`CONFIGS`' ``name``) in a process of its own, as ``job`` (`engine_benchmark`'s)
    describes it: a fresh process per engine, since vLLM 0.32 fails to start an engine in a process that
    started one with n-gram speculation (numba's import leaves a module its kernel scan cannot read), and an
    engine binds the process's OpenMP threads. Returns the worker's results; raises where it failed."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vllmbench-") as folder:
        job_file, out_file = os.path.join(folder, "job.json"), os.path.join(folder, "out.json")
        with open(job_file, "w", encoding="utf-8") as f:
            json.dump(job, f)
        command = [sys.executable, "-m", "structspec.tools.benchmarks.vllmbench", *args.argv, "--worker", name, "--job",
                   job_file, "--out", out_file]
        env = dict(os.environ)
        if name != "own" and args.preload == "auto":
            env["LD_PRELOAD"] = vllm_preload(env)
        done = subprocess.run(command, check=False, env=env)
        if done.returncode != 0 or not os.path.exists(out_file):
            raise RuntimeError(f"the {name} worker failed (exit code {done.returncode}; its log is above on stderr)")
        with open(out_file, encoding="utf-8") as f:
            return json.load(f)


def worker(args: argparse.Namespace) -> int:
    """A worker process's run: one configuration over the job's task sets (or one prefix-job engine); writes
    its results as JSON to ``--out``."""
    with open(args.job, encoding="utf-8") as f:
        job = json.load(f)
    sets = {name: task_items(name, args.records) for name in job["sets"]}
    if args.worker in ("prefix-on", "prefix-off"):
        out: dict[str, Any] = {"tally": asdict(prefix_run(args, job, args.worker == "prefix-on"))}
    elif args.worker == "own":
        import structspec

        lm = structspec.load(args.model)
        out = {"sets": {name: [asdict(t) for t in own_runs(lm, items, args)] for name, items in sets.items()}}
    else:
        config = CONFIGS[args.worker]
        spec = speculative(config, args.draft_tokens)
        start = time.perf_counter()
        llm = start_engine(job["model_dir"], job["dtype"], config.backend, args, spec)
        out = {"startup": time.perf_counter() - start, "speculative_config": spec, "sets": {}}
        counts = count_steps(llm)
        for name, items in sets.items():
            requests = [vllm_request(item, job["prompt_ids"][name][item.id]) for item in items]
            warm_up(llm, requests)
            out["sets"][name] = [asdict(run_vllm(llm, counts, requests, size, args.max_new_tokens))
                                 for size in (1, args.batch_size)]
        stop_engine(llm)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f)
    return 0


def task_items(name: str, n: int | None) -> list[Item]:
    return extraction_items(n) if name == "extraction" else toolcall_items(n)


def engine_benchmark(args: argparse.Namespace) -> int:
    """Every configuration of ``args`` on every task set, each in a worker process of its own (`run_worker`),
    one at a time; prints the header, a line as each configuration ends, and the tables. Loads the model here
    only for the prompts' token ids and its default dtype."""
    import structspec
    from structspec.events import chat_prompt_ids
    from structspec.models.shipped import model_path

    lm = structspec.load(args.model)
    sets = {name: task_items(name, args.records) for name in TASK_SETS if args.tasks in (name, "both")}
    job = {"dtype": str(lm.dtype).removeprefix("torch."), "model_dir": model_path(args.model), "sets": list(sets),
           "prompt_ids": {name: {item.id: chat_prompt_ids(lm, item.messages,
                                                          item.conversation and item.spec.chat_tools())
                                 for item in items} for name, items in sets.items()}}
    del lm
    gc.collect()
    print(header(args, job["dtype"], job["model_dir"]), flush=True)
    if too_long := [f"{key} ({len(ids)} tokens)" for by_id in job["prompt_ids"].values() for key, ids in by_id.items()
                    if len(ids) + args.max_new_tokens > args.max_model_len]:
        print(f"note: prompt + max_new_tokens exceed max_model_len={args.max_model_len} for {', '.join(too_long)}")
    results: dict[str, dict[str, tuple[Tally | None, Tally | None]]] = {name: {} for name in sets}
    skipped: dict[str, str] = {}
    for name in args.configs:
        config = CONFIGS[name]
        if config.speculation == "proposer" and proposer_config(args.draft_tokens) is None:
            skipped[config.label] = f"{PROPOSER_MODULE} is not installed here"
            continue
        start = time.perf_counter()
        out = run_worker(name, args, job)
        for set_name, (one, many) in out["sets"].items():
            results[set_name][config.label] = (Tally(**one), Tally(**many))
        engine = (f"engine up in {out['startup']:.0f} s, speculative_config={out['speculative_config']}; "
                  if "startup" in out else "")
        print(f"{config.label}: {engine}{time.perf_counter() - start:.0f} s in all (load {load_average()})",
              flush=True)
    labels = [CONFIGS[name].label for name in args.configs]
    print()
    for set_name, by_label in results.items():
        title = (f"{set_name}: {len(sets[set_name])} records, {args.model}, {job['dtype']}, ratios against "
                 f"{next((label for label in labels if label not in skipped), '–')}")
        print(markdown(title, {label: by_label.get(label, (None, None)) for label in labels}, skipped,
                       args.batch_size), "\n")
    print(NOTES)
    print(f"load average after: {load_average()}")
    return 0


NOTES = ("Steps / output token: the forward passes each record took part in over its output tokens (EOS not "
         "counted): vLLM's engine steps that scheduled the request (its prefill included), the own loop's target "
         "and prefill passes (from B = 1). Forced share: the own loop's forced tokens; vLLM + structspec + "
         "proposer: the forced text its proposer drafted. Draft acceptance: accepted / drafted tokens over both "
         "runs (vLLM: as its spec-decoding stats count them; own loop: every draft source but forced splices). "
         "Valid: outputs that validate against their JSON Schema (tool calls: every call parses and validates "
         "against its tool; an auto turn may answer in text; vLLM leaves choice=auto unconstrained, as vllm serve "
         "does); the totals say in how many turns the calls were the expected ones. Each distinct schema is "
         "warmed up (two tokens, not timed); prefix caches are emptied before each run. Each configuration runs "
         "in a fresh process.")


def own_runs(lm: Any, items: list[Item], args: argparse.Namespace) -> tuple[Tally, Tally]:
    """The own loop's B = 1 and batched tallies over ``items``, after two tokens of each distinct spec."""
    import structspec

    distinct = {json.dumps(i.conversation.tools if i.conversation else i.schema, sort_keys=True): i for i in items}
    for item in distinct.values():
        structspec.generate_result(lm, item.spec, item.messages, max_new_tokens=2)
    return run_own(lm, items, 1, args.max_new_tokens), run_own(lm, items, args.batch_size, args.max_new_tokens)


def prefix_run(args: argparse.Namespace, job: dict[str, Any], caching: bool) -> Tally:
    """The prefix job's records through vLLM + xgrammar, one after another, prefix caching on or off: their
    tally (``cached_prompt_tokens``: what vLLM's cache supplied). Starts an engine and stops it."""
    from structspec.tools.benchmarks.prefix_reuse import job_prompts

    schema, prompts = job_prompts()
    llm = start_engine(job["model_dir"], job["dtype"], "xgrammar", args, None, prefix_caching=caching)
    counts = count_steps(llm)
    tokenizer = llm.get_tokenizer()
    requests = [Request(f"record {i}", chat_ids(tokenizer, p), {"json": schema},
                        lambda text: (valid_json(text, schema), None)) for i, p in enumerate(prompts)]
    warm = chat_ids(tokenizer, [{"role": "user", "content": "warm-up"}])  # compiles the grammar, caches no job text
    warm_up(llm, [Request("warm-up", warm, {"json": schema}, lambda text: (True, None))])
    tally = run_vllm(llm, counts, requests, 1, args.max_new_tokens)
    tally.prompt_tokens = sum(len(r.prompt_ids) for r in requests)
    stop_engine(llm)
    return tally


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of chat ``messages`` through ``tokenizer``'s template, as `LM.encode_prompt` makes them."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def prefix_job(args: argparse.Namespace) -> int:
    """Issue 53's peer: `job_prompts`' extraction job through vLLM + xgrammar, the records one after another
    (B = 1), with vLLM's automatic prefix caching on (its default), then off, an engine each in a worker
    process; prints seconds per record and the prompt tokens vLLM took from its cache."""
    import torch

    from structspec.models.device import default_dtype
    from structspec.models.shipped import model_path
    from structspec.tools.benchmarks.prefix_reuse import job_prompts

    job = {"dtype": str(default_dtype(torch.device("cpu"))).removeprefix("torch."),
           "model_dir": model_path(args.model), "sets": []}
    print(header(args, job["dtype"], job["model_dir"]), flush=True)
    print(f"job: structspec.tools.benchmarks.prefix_reuse.job_prompts(), {len(job_prompts()[1])} records under one "
          "schema, vLLM + xgrammar, one record per call\n", flush=True)
    seconds = {}
    for caching in (True, False):
        t = Tally(**run_worker("prefix-on" if caching else "prefix-off", args, job)["tally"])
        seconds[caching] = seconds_per_record(t)
        print(f"prefix caching {'on' if caching else 'off'}: {seconds[caching]:.3f} s / record, "
              f"{t.cached_prompt_tokens:,} of {t.prompt_tokens:,} prompt tokens from vLLM's cache, "
              f"{t.output_tokens:,} output tokens, {share(t.steps, t.output_tokens) or 0:.3f} steps / output token, "
              f"valid {t.valid}/{t.records} (load {load_average()})", flush=True)
    print(f"prefix caching on: ×{speedup(seconds[True], seconds[False], True):.2f} against off, per record")
    print(f"load average after: {load_average()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """The command: the engine benchmark, or ``--prefix-job``; a worker process's run under ``--worker``."""
    args = arguments(argv)
    prepare_environment()
    if args.worker:
        return worker(args)
    return prefix_job(args) if args.prefix_job else engine_benchmark(args)


if __name__ == "__main__":
    sys.exit(main())
