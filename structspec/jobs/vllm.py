"""Extraction jobs on vLLM: ``structspec extract --engine vllm`` (the ``vllm`` extra).

The job is structspec's own (`structspec.jobs.runner.run_lines`): the same manifest, resume, per-record errors
and output lines; only the decoding moves into a ``vllm.LLM`` under the ``structspec`` structured-output backend
(`structspec.integrations.vllm`, which this module reaches as vLLM does, through vLLM's plugin loader: jobs stand
below integrations). Records go to ``LLM.generate`` ``batch_size`` at a time, which vLLM's continuous batching
schedules together; each chunk's lines are written when its call returns, so a killed job loses at most one
chunk's work. Importing this module imports vLLM.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import jsonschema
from pydantic import TypeAdapter

import structspec
from structspec.errors import StructspecError
from structspec.jobs.errors import JobConfigError
from structspec.jobs.lines import output_line
from structspec.jobs.manifest import job_manifest
from structspec.jobs.output import JobSummary
from structspec.jobs.records import InputRecord
from structspec.jobs.runner import VLLM_BATCH_SIZE, JobOptions, run_lines
from structspec.models.shipped import model_path
from structspec.schema.validated import ValidatedJsonSchema
from structspec.schema.validation import validator

from vllm import LLM, SamplingParams
from vllm.config.structured_outputs import StructuredOutputsConfig
from vllm.plugins import load_general_plugins
from vllm.sampling_params import StructuredOutputsParams

ENGINE = "vllm"
BACKEND = "structspec"  # the backend's name, as `structspec.integrations.vllm` registers it
SAMPLING = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
            "seed": "seed", "repetition_penalty": "repetition_penalty"}
"""The job options (`JobOptions.generate`'s keys) an engine's request takes, and their `SamplingParams` names."""


@dataclass(frozen=True)
class Request:
    """One spec as vLLM requests it: the structured-output keyword, and how an output's text becomes its value
    (raising ``ValueError`` for a text the spec's validator rejects)."""

    structured: dict[str, Any]
    parse: Callable[[str], Any]


def request_of(spec: Any) -> Request:
    """The vLLM request of ``spec``: a JSON Schema or a Pydantic model (``json=``), or a `structspec.Regex`
    (``regex=``). `JobConfigError` for anything else. Loads no model."""
    if isinstance(spec, structspec.Regex):
        return Request({"regex": spec.pattern}, lambda text: text)
    if isinstance(spec, (dict, bool)):
        check = validator(spec)

        def parse_json(text: str) -> Any:
            value = json.loads(text)
            check.validate(value)
            return value

        return Request({"json": spec}, parse_json)
    try:
        adapter = TypeAdapter(spec)
        schema = adapter.json_schema(schema_generator=ValidatedJsonSchema)  # (its types as the model validates)
    except Exception as e:  # whatever Pydantic refuses to describe: its message says what
        raise JobConfigError(f"--engine vllm takes a JSON Schema, a Pydantic model or a regex, and {spec!r} is "
                             f"none ({type(e).__name__}: {e}); use --engine structspec for it") from None
    return Request({"json": schema}, lambda text: adapter.dump_python(adapter.validate_json(text), mode="json"))


def sampling_params(spec: Any, options: JobOptions) -> SamplingParams:
    """The `SamplingParams` of every record of a job: its spec under the structspec backend, ``max_tokens`` from
    ``max_new_tokens`` (default 512), greedy unless ``temperature`` is given. `JobConfigError` naming an option
    vLLM refuses or one it has no use for. Loads no model."""
    if unused := sorted(k for k in options.generate if k not in SAMPLING):
        raise JobConfigError(f"--engine vllm: {', '.join(unused)} are options of structspec's own loop; drop them "
                             "or use --engine structspec")
    chosen = {SAMPLING[k]: v for k, v in options.generate.items() if k in SAMPLING and v is not None}
    chosen.setdefault("max_tokens", options.max_new_tokens)
    chosen.setdefault("temperature", 0.0)
    try:
        return SamplingParams(structured_outputs=StructuredOutputsParams(**request_of(spec).structured), **chosen)
    except (ValueError, TypeError) as e:
        raise JobConfigError(f"--engine vllm: {e}") from None


def register_backend() -> None:
    """Run vLLM's general plugins in this process (vLLM's processes run them themselves, but vLLM checks the
    backend's name before it does in the process that builds ``LLM``), which registers structspec's backend
    through its ``vllm.general_plugins`` entry point. `JobConfigError` when that did not register it. Patches
    vLLM's classes, once."""
    load_general_plugins()
    if BACKEND not in get_args(StructuredOutputsConfig.__dataclass_fields__["backend"].type):
        raise JobConfigError("structspec's vLLM backend is not registered (vLLM's log above says why where it "
                             "failed to load): install structspec with its vllm extra, pip install "
                             "'./structspec[vllm]' from a clone, so vLLM finds its vllm.general_plugins entry point, "
                             "and leave VLLM_PLUGINS unset or name structspec in it")


def load_engine(model: str, dtype: str | None = None, **engine_args: Any) -> LLM:
    """A ``vllm.LLM`` of ``model`` (a shipped name, converted on first use, or a model directory or hub id as
    `structspec.load` finds it) under the structspec backend (vLLM's JSON layout: any whitespace between
    tokens). ``engine_args`` go to ``LLM`` as they are. Registers the backend in this process."""
    register_backend()
    try:
        path = model_path(model)
    except StructspecError as e:
        raise JobConfigError(f"--model {model}: {e}") from None
    return LLM(path, dtype=dtype or "auto", structured_outputs_config={"backend": BACKEND}, **engine_args)


def record_lines(llm: LLM, spec: Any, records: list[InputRecord], options: JobOptions) -> Iterator[dict[str, Any]]:
    """The output line of each record: records that could not be read first, then the others, ``batch_size``
    (default `VLLM_BATCH_SIZE`) per ``llm.generate`` call, in the input's order. A prompt that fills the
    model's context, a budget that runs out, an output the spec's validator rejects and a request vLLM fails are
    that record's error line, as is a document the tokenizer cannot encode (the rest of its chunk runs). Runs the
    engine."""
    params = sampling_params(spec, options)
    parse = request_of(spec).parse
    tokenizer = llm.get_tokenizer()
    context = llm.llm_engine.model_config.max_model_len
    for record in records:
        if record.error:
            yield output_line(record, None, options.max_new_tokens)
    todo = [record for record in records if not record.error]
    size = options.batch_size or VLLM_BATCH_SIZE
    for start in range(0, len(todo), size):
        chunk = todo[start:start + size]
        lines: list[dict[str, Any] | None] = [None] * len(chunk)
        prompts = []
        for k, record in enumerate(chunk):
            try:
                prompt = _prompt(tokenizer, options.template, record.text)
                n = len(tokenizer.encode(prompt))
            except Exception as e:  # noqa: BLE001 (one record's text must not stop its chunk: its line says why)
                lines[k] = _row(record) | {"error": {"kind": "unencodable_text", "message": (
                    f"{type(e).__name__}: the tokenizer cannot encode the prompt ({e}); fix the document")}}
                continue
            if n >= context:
                lines[k] = _row(record) | {"error": {"kind": "too_long", "message": (
                    f"PromptError: the prompt is {n} tokens and the model's context {context}; shorten the document "
                    "or the prompt template")}}
            else:
                prompts.append((k, prompt))
        for (k, _), result in zip(prompts, _generate(llm, [prompt for _, prompt in prompts], params)):
            lines[k] = _line(chunk[k], result, parse, options.max_new_tokens, context)
        yield from lines


def _prompt(tokenizer: Any, template: str, document: str) -> str:
    """The prompt text of one document, as `structspec.jobs.prompts.build_prompt` makes it: one user message
    through the chat template where the tokenizer has one."""
    content = template.replace("{document}", document)  # not str.format: templates may hold JSON braces
    if not getattr(tokenizer, "chat_template", None):
        return content
    return tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False,
                                         add_generation_prompt=True)


def _generate(llm: LLM, prompts: list[str], params: SamplingParams) -> list[Any]:
    """``llm.generate``'s output per prompt; where the call fails, each prompt again alone, so only the one
    that fails gets its error (as ``{"error": ...}``)."""
    if not prompts:
        return []
    try:
        return list(llm.generate(prompts, params, use_tqdm=False))
    except Exception as e:  # noqa: BLE001 (a record's request must not stop the job: its line says why)
        if len(prompts) > 1:
            return [out for prompt in prompts for out in _generate(llm, [prompt], params)]
        return [{"error": {"kind": "generation_failed", "message": f"{type(e).__name__}: {e}"}}]


def _row(record: InputRecord) -> dict[str, Any]:
    """The fields every line of ``record`` starts with."""
    return {"id": record.id, "input": record.where, "input_hash": record.input_hash}


def _line(record: InputRecord, result: Any, parse: Callable[[str], Any], budget: int, context: int
          ) -> dict[str, Any]:
    """One record's line from vLLM's ``RequestOutput`` (or ``{"error": ...}`` for a request that failed)."""
    row = _row(record)
    if isinstance(result, dict):
        return row | result
    out = result.outputs[0]
    prompt_tokens = len(result.prompt_token_ids or ())
    # every token is a forward pass of vLLM's (the structspec proposer would draft forced tokens)
    stats = {"output_tokens": len(out.token_ids), "prompt_tokens": prompt_tokens, "no_pass_tokens": 0}
    if out.finish_reason == "length":
        full = prompt_tokens + len(out.token_ids) >= context
        kind, why = ("max_context", f"the model's context ({context} tokens) filled up") if full else \
            ("token_budget", f"max_new_tokens ({budget}) ran out; rerun with a larger --max-new-tokens and "
                             "--retry-errors")
        return row | {"error": {"kind": kind, "message": f"the output is incomplete: {why}",
                                "partial_text": out.text}, "stats": stats}
    try:
        value = parse(out.text)
    except (ValueError, jsonschema.ValidationError) as e:  # (Pydantic's ValidationError is a ValueError)
        return row | {"error": {"kind": "invalid_output", "message": f"{type(e).__name__}: {e}",
                                "partial_text": out.text}, "stats": stats}
    return row | {"value": value, "stats": stats}


def run_job(
    llm: LLM,
    model: str,
    spec: Any,
    records: list[InputRecord],
    output: str | Path,
    options: JobOptions,
    on_record: Callable[[JobSummary], None] = lambda summary: None,
    retry_errors: bool = False,
) -> JobSummary:
    """`structspec.jobs.runner.run_job` on ``llm`` (`load_engine`), ``model`` the name its manifest records:
    every record not already in ``output`` decoded by vLLM and its line appended as its chunk returns.
    `JobConfigError` for a bad spec, option or output before any record runs. Writes ``output``."""
    sampling_params(spec, options)  # its errors before the output is claimed
    manifest = job_manifest(model, spec, options.template, options.generate, ENGINE)
    return run_lines(output, manifest, records, lambda todo: record_lines(llm, spec, todo, options),
                     on_record, retry_errors)
