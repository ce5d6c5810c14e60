"""Extraction jobs on vLLM engines under Ray: `VLLMExtractor` for ``ray.data.Dataset.map_batches``, and `run_job`
for ``structspec extract --engine vllm --ray`` (the ``vllm`` and ``ray`` extras).

Typical use, on a cluster with one GPU per engine::

    import ray
    from structspec.jobs.vllm_ray import VLLMExtractor

    docs = ray.data.read_json("s3://bucket/docs.jsonl")  # columns: id, text
    kwargs = VLLMExtractor.constructor_kwargs("/models/qwen", Invoice, max_new_tokens=300,
                                              engine_args={"max_model_len": 4096})  # checked here, at once
    records = docs.map_batches(VLLMExtractor, fn_constructor_kwargs=kwargs, batch_size=16,
                               compute=ray.data.ActorPoolStrategy(size=4), num_gpus=1)

Each actor holds one ``vllm.LLM`` under structspec's structured-output backend and decodes each batch with
`structspec.jobs.vllm.record_lines`, so a record's line is exactly what ``extract --engine vllm`` writes; an
output row is its input row with `structspec.jobs.ray.OUTPUT_COLUMNS` added but ``stop_reason`` (vLLM's lines
carry none). The engine core runs in the actor's process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless set), so
an engine is one process and dies with its actor.

Why actors holding ``vllm.LLM`` and not ``ray.data.llm``'s processor: both run on vLLM's CPU build (the
processor needs ``placement_group_config={"bundles": [{"CPU": 1}]}`` and ``log_engine_metrics=False`` there),
but the processor's output rows have no finish reason and it sends a too-long prompt to the engine, so its
lines would need a second, guessing translation; an actor running the local job's own `record_lines` writes
the same lines, errors included, with one engine process instead of three.

``run_job`` is `structspec.jobs.ray.run_actors` with these actors: the driver writes each line as its batch
comes back, with the manifest, lock and resume of ``extract --engine vllm`` (an output started on one machine
resumes on Ray, and the other way). Importing this module imports vLLM and needs Ray.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from structspec.jobs import vllm as vllm_jobs
from structspec.jobs.lines import output_line
from structspec.jobs.manifest import job_manifest
from structspec.jobs.output import JobSummary
from structspec.jobs.ray import batch_records, check_keywords, job_options, line_columns, run_actors
from structspec.jobs.records import InputRecord
from structspec.jobs.runner import VLLM_BATCH_SIZE, JobOptions


class VLLMExtractor:
    """One actor's extraction on a ``vllm.LLM``: decodes batches of dataset rows into records, each row kept with
    its line's columns added (see the module's docstring).

    Ray constructs it once per actor (``map_batches(VLLMExtractor, fn_constructor_kwargs=...)``); build those
    keywords with `VLLMExtractor.constructor_kwargs`, which checks them on the driver. The actor loads ``model``
    (as `structspec.jobs.vllm.load_engine` does: a shipped name, a model directory or a hub id) in ``dtype``
    with ``engine_args`` (``vllm.LLM``'s keywords, as they are); a model vLLM cannot load fails the actor's
    start. ``template`` is the prompt, with a ``{document}`` placeholder (default: an instruction naming the
    spec's fields); ``batch_size`` the records per ``LLM.generate`` call (default `VLLM_BATCH_SIZE`); ``generate``
    takes the sampling options of `structspec.jobs.vllm.SAMPLING` (``max_new_tokens``, ``temperature``, ...).
    Input rows need ``id_field`` and ``text_field``; ``input_field`` (if present) says where the row came from.
    """

    def __init__(self, model: str, spec: Any, *, template: str | None = None, batch_size: int | None = None,
                 dtype: str | None = None, engine_args: dict[str, Any] | None = None, text_field: str = "text",
                 id_field: str = "id", input_field: str = "input", **generate: Any) -> None:
        self.options = job_options(spec, template, batch_size, generate)
        vllm_jobs.sampling_params(spec, self.options)  # its refusals before the engine loads
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this actor's process
        self.llm = vllm_jobs.load_engine(model, dtype, **(engine_args or {}))
        self.spec = spec
        self.text_field, self.id_field, self.input_field = text_field, id_field, input_field

    @classmethod
    def constructor_kwargs(cls, model: str, spec: Any, **keywords: Any) -> dict[str, Any]:
        """``map_batches``' ``fn_constructor_kwargs`` for VLLMExtractors of ``model`` and ``spec``, with
        ``keywords`` (those of `VLLMExtractor`), checked here on the driver, so that a mistake is one
        `JobConfigError` before Ray starts an actor: an unknown keyword (with the nearest name), a spec vLLM's
        request cannot carry, a template without ``{document}``, an option vLLM refuses. The model and the
        engine's arguments are checked on the actors. Loads nothing."""
        own = [name for name in inspect.signature(cls).parameters if name not in ("model", "spec", "generate")]
        check_keywords(cls.__name__, keywords, own + list(vllm_jobs.SAMPLING))
        options = job_options(spec, keywords.get("template"), keywords.get("batch_size"),
                              {k: v for k, v in keywords.items() if k not in own})
        vllm_jobs.sampling_params(spec, options)
        return {"model": model, "spec": spec, **keywords}

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Decode one batch (columns, Ray's ``"numpy"`` batch format) and return its columns with the line's
        columns added, rows in the input's order. Runs the engine; a row that cannot run is that row's error."""
        records = batch_records(batch, self.text_field, self.id_field, self.input_field)
        readable = [i for i, record in enumerate(records) if not record.error]
        lines = [output_line(record, None, self.options.max_new_tokens) if record.error else {}
                 for record in records]
        # record_lines yields the readable records' lines in their order
        for i, line in zip(readable, vllm_jobs.record_lines(self.llm, self.spec, [records[i] for i in readable],
                                                             self.options)):
            lines[i] = line
        return dict(batch) | line_columns(lines)


def run_job(
    model: str,
    spec: Any,
    records: list[InputRecord],
    output: str | Path,
    options: JobOptions,
    on_record: Callable[[JobSummary], None] = lambda summary: None,
    retry_errors: bool = False,
    actors: int = 1,
    num_cpus: float = 1,
    num_gpus: float = 0,
    dtype: str | None = None,
    engine_args: dict[str, Any] | None = None,
) -> JobSummary:
    """`structspec.jobs.vllm.run_job` on the connected Ray cluster (`structspec.jobs.ray.connect`): ``actors``
    VLLMExtractors, each with ``num_cpus`` CPUs and ``num_gpus`` GPUs and a ``vllm.LLM`` of ``model`` in
    ``dtype`` with ``engine_args``, decode the records not already in ``output``, ``options.batch_size``
    (default `VLLM_BATCH_SIZE`) per actor call. ``model`` is also the name the manifest records, as the local
    job's. `JobConfigError` for a bad spec, option or output before any record runs, and for actors that
    could not start before any line is written. Writes ``output``."""
    rows_per_call = options.batch_size or VLLM_BATCH_SIZE
    kwargs = VLLMExtractor.constructor_kwargs(model, spec, template=options.template, batch_size=rows_per_call,
                                              dtype=dtype, engine_args=engine_args, **options.generate)
    manifest = job_manifest(model, spec, options.template, options.generate, vllm_jobs.ENGINE)
    return run_actors(VLLMExtractor, kwargs, manifest, records, output, options.max_new_tokens, rows_per_call,
                      on_record, retry_errors, actors, num_cpus, num_gpus)
