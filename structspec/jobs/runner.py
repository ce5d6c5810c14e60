"""The local job loop: check the spec and options, claim the output, decode the records it has no line for,
append each line as its row finishes.

Documents are decoded ``batch_size`` at a time (`structspec.iter_batch`), and each record's line is written the
moment its row finishes, so lines come in the order rows finish, not the input's order (`structspec.jobs.output`
makes that resumable). Records that could not be read are written first, as their errors.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structspec
from structspec.errors import DROPPED_WARNING, StructspecError
from structspec.jobs.errors import JobConfigError
from structspec.jobs.lines import output_line
from structspec.jobs.manifest import job_manifest
from structspec.jobs.output import JobSummary, job_output
from structspec.jobs.prompts import build_prompt
from structspec.jobs.records import InputRecord

if TYPE_CHECKING:  # this module imports no torch: the CLI reads DEFAULT_BATCH_SIZE for its help
    from structspec.models.transformers_lm import LM
    from structspec.result import Result

DEFAULT_BATCH_SIZE = {"cpu": 8, "cuda": 32}  # rows per target pass, by the model's device type
VLLM_BATCH_SIZE = 16  # records per `vllm.LLM.generate` call under --engine vllm: their lines come when it returns

LineSource = Callable[[list[InputRecord]], Iterable[dict[str, Any]]]
"""What decodes a job's records, whatever the engine: given the records the output has no line for yet, their
output lines (`structspec.jobs.lines.output_line`'s format), each yielded as soon as it is known."""


@dataclass(frozen=True)
class JobOptions:
    """How records run: the prompt template (with ``{document}``), `generate_result`'s keywords, and the rows
    decoded together (None: `DEFAULT_BATCH_SIZE` for the model's device); ``cli_words``: the job runs from
    ``structspec extract``, so the fixes its lines name are the CLI's options (``--max-new-tokens``)."""

    template: str
    generate: dict[str, Any] = field(default_factory=dict)
    batch_size: int | None = None
    cli_words: bool = False

    @property
    def max_new_tokens(self) -> int:
        return self.generate.get("max_new_tokens", 512)  # generate_result's default

    def rows_per_pass(self, lm: LM) -> int:
        """``batch_size``, or the default for ``lm``'s device (does not touch the model)."""
        return default_batch_size(lm) if self.batch_size is None else self.batch_size


def default_batch_size(lm: LM) -> int:
    """The rows per target pass a job uses on ``lm``'s device when none is given (does not touch the model)."""
    return DEFAULT_BATCH_SIZE.get(lm.device.type, DEFAULT_BATCH_SIZE["cpu"])


def check_job(lm: LM, spec: Any, options: JobOptions) -> tuple[str, ...]:
    """Raise `JobConfigError` when ``spec`` cannot be used on ``lm`` or ``options`` are bad, before any record runs;
    return the schema keywords ``strict=False`` leaves unenforced (`not_enforced`).

    Compiles the spec (which fills the compile cache); runs no forward pass.
    """
    compile_names = {f.name for f in dataclasses.fields(structspec.CompileOptions)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DROPPED_WARNING)  # the job lists them in its lines instead
        try:
            structspec.compile(spec, lm, **{k: v for k, v in options.generate.items() if k in compile_names})
        except StructspecError as e:
            raise JobConfigError(f"the schema cannot be used: {e}") from None
        try:  # no prompts: only the options are checked
            list(structspec.iter_batch(lm, spec, [], batch_size=options.rows_per_pass(lm), **options.generate))
        except StructspecError as e:
            raise JobConfigError(str(e)) from None
    return not_enforced(spec, options.generate.get("strict", True))


def not_enforced(spec: Any, strict: bool = True) -> tuple[str, ...]:
    """The schema keywords of ``spec`` that ``strict=False`` drops, each as ``"'keyword' at /pointer"`` (none when
    ``strict``; `structspec.schema.Constraint.not_enforced`); what a job's lines list as ``stats.not_enforced``.
    Resolves the spec, without its warning of them; loads no model."""
    if strict:
        return ()
    from structspec.schema import constraint_of  # imports torch: not at the top, which the CLI's help reads

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=DROPPED_WARNING)  # the caller lists them
        return constraint_of(spec, strict=False).not_enforced


def record_lines(
    lm: LM, spec: Any, records: list[InputRecord], options: JobOptions, unenforced: tuple[str, ...] = ()
) -> Iterator[tuple[int, Result | None, dict[str, Any]]]:
    """Each record's index in ``records``, `Result` (None for a record that could not be read) and output line:
    records that could not be read first, then the others as their rows finish, decoded
    ``options.rows_per_pass(lm)`` rows per target pass. ``unenforced`` (what `check_job` returns) goes in each
    line's stats as ``not_enforced``. Run `check_job` first: bad options raise here."""
    todo = [i for i, record in enumerate(records) if not record.error]
    for i, record in enumerate(records):
        if record.error:
            yield i, None, output_line(record, None, options.max_new_tokens, options.cli_words)
    if todo:
        prompts = [build_prompt(lm, options.template, records[i].text) for i in todo]
        with warnings.catch_warnings():  # the call compiles (the rows run as results are read)
            warnings.filterwarnings("ignore", message=DROPPED_WARNING)  # in each line's stats instead
            results = structspec.iter_batch(lm, spec, prompts, batch_size=options.rows_per_pass(lm),
                                            **options.generate)
        for k, result in results:
            line = output_line(records[todo[k]], result, options.max_new_tokens, options.cli_words)
            if unenforced and "stats" in line:
                line["stats"]["not_enforced"] = list(unenforced)
            yield todo[k], result, line


def run_job(
    lm: LM,
    spec: Any,
    records: list[InputRecord],
    output: str | Path,
    options: JobOptions,
    on_record: Callable[[JobSummary], None] = lambda summary: None,
    retry_errors: bool = False,
) -> JobSummary:
    """Run every record not already in ``output`` and append its line as it finishes; ``on_record`` sees the
    running summary.

    Checks the spec, the options and the output first (`check_job`, `job_output`), so a bad one raises
    `JobConfigError` before any record runs. Records that could not be read are written first; the
    others are decoded ``options.batch_size`` rows per pass.
    """
    unenforced = check_job(lm, spec, options)
    manifest = job_manifest(lm.name, spec, options.template, options.generate)

    def lines(todo: list[InputRecord]) -> Iterator[dict[str, Any]]:
        return (row for _, _, row in record_lines(lm, spec, todo, options, unenforced))

    return run_lines(output, manifest, records, lines, on_record, retry_errors)


def run_lines(
    output: str | Path,
    manifest: dict[str, Any],
    records: list[InputRecord],
    lines: LineSource,
    on_record: Callable[[JobSummary], None] = lambda summary: None,
    retry_errors: bool = False,
) -> JobSummary:
    """A job on any engine: claim ``output`` for ``manifest`` (`job_output`), give ``lines`` the records it has
    no line for yet, and append each line it yields at once; ``on_record`` sees the running summary. Writes
    ``output`` and its manifest; `JobConfigError` before anything is written for an output that cannot be used."""
    with job_output(output, manifest, records, retry_errors, on_record) as (summary, todo, write):
        for row in lines(todo):
            write(row)
    return summary


def load_model(name: str, device: str = "auto", dtype: str | None = None, kernels: str = "auto") -> LM:
    """`structspec.load` on ``device`` in ``dtype`` (None: the device's default) with ``kernels``; an unknown
    name or a device that is not there is a `JobConfigError`."""
    try:
        return structspec.load(name, device=device, dtype=dtype, kernels=kernels)
    except StructspecError as e:
        raise JobConfigError(str(e)) from None


def resolve_draft(name: str | None, device: str = "auto", dtype: str | None = None) -> Any:
    """``generate_result``'s ``draft=`` for ``--draft NAME``: a drafter's name as is, else a model to load
    (on ``device`` in ``dtype``, as the target)."""
    if name is None or name == "none":
        return None
    from structspec.decoding.drafters.factory import DRAFT_NAMES  # imports torch

    if name in DRAFT_NAMES:
        return name
    try:
        return load_model(name, device, dtype)
    except JobConfigError as e:
        raise JobConfigError(f"--draft {name}: {e}") from None
