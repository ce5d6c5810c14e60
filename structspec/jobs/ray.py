"""Extraction jobs on Ray: `Extractor` for ``ray.data.Dataset.map_batches``, and `run_job` for
``structspec extract --ray``.

Typical use, on a cluster with one GPU per actor::

    import ray
    from structspec.jobs.ray import Extractor

    ray.init(address="auto")
    docs = ray.data.read_json("s3://bucket/docs.jsonl")  # columns: id, text
    kwargs = Extractor.constructor_kwargs("smollm2-135m", Invoice, max_new_tokens=300)  # checked here, at once
    records = docs.map_batches(Extractor, fn_constructor_kwargs=kwargs, batch_size=128,
                               compute=ray.data.ActorPoolStrategy(size=4), num_gpus=1)
    records.write_parquet("s3://bucket/invoices/")

Each actor loads the model and compiles the spec once, then decodes each batch
with the batched engine (`structspec.iter_batch`). As ``ray.data.llm``'s
processors do, an output row is its input row with the result's columns added:
``value`` (the structured value: a dict for a schema), ``stop_reason``,
``error_kind``, ``error_message``, ``stats`` (a dict) and ``line``, the record's
line exactly as ``structspec extract`` writes it (JSON text). Arrow stores a
column's dicts as one struct type, so a key that only other rows have reads
back as None; ``line`` keeps each record as it was. A bad record is its row's
error (the kinds of `structspec.jobs.lines.ERROR_KINDS`); it never fails the job.

``structspec extract --ray ADDRESS`` runs the same job as ``extract``: the
driver writes each line as its batch comes back, to the same output with the
same manifest, lock and resume as local ``extract``. ``--ray local`` starts a
Ray instance for the job (`connect`), in its own temporary directory and process
group, which a watchdog tears down when the driver ends, even by ``kill -9``.
Ray itself is imported when a job connects (so that ``--ray local`` can set its
token mode first), not with this module.
"""

from __future__ import annotations

import difflib
import importlib.util
import inspect
import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

if importlib.util.find_spec("ray") is None:  # an optional extra
    raise ImportError("structspec.jobs.ray needs Ray: pip install 'ray[data]==2.60.0' (or install structspec "
                      "with its ray extra: pip install './structspec[ray]' from a clone)")

import structspec
from structspec.errors import StructspecError
from structspec.jobs.errors import JobConfigError
from structspec.jobs.lines import output_line
from structspec.jobs.manifest import changed_options, job_manifest
from structspec.jobs.output import JobSummary, job_output
from structspec.jobs.prompts import default_template
from structspec.jobs.records import InputRecord, input_record
from structspec.jobs.runner import (
    DEFAULT_BATCH_SIZE,
    DROPPED_WARNING,
    JobOptions,
    check_job,
    load_model,
    record_lines,
    resolve_draft,
)
from structspec.models.shipped import SHIPPED

BATCHES_PER_CALL = 4  # engine batches of rows per actor call, so that finished rows are refilled
OUTPUT_COLUMNS = ("value", "stop_reason", "error_kind", "error_message", "stats", "line")


class Extractor:
    """One actor's extraction: decodes batches of dataset rows into records, each row kept with its result's
    columns added (`OUTPUT_COLUMNS`, see the module's docstring).

    Ray constructs it once per actor (``map_batches(Extractor, fn_constructor_kwargs=...)``); build those keywords
    with `Extractor.constructor_kwargs`, which checks them on the driver. The actor loads ``model`` on ``device``
    in ``dtype``, loads a draft model named by ``draft`` beside it, and compiles ``spec``; a bad spec, option or
    model raises `JobConfigError` here, before any row runs. ``template`` is the prompt, with a ``{document}``
    placeholder (default: an instruction naming the spec's fields); ``batch_size`` the rows per target pass
    (default: `DEFAULT_BATCH_SIZE` for the model's device); ``generate`` takes `structspec.iter_batch`'s
    keywords (``max_new_tokens``, ``temperature``, ``draft``, ``strict``, ...). Input rows need ``id_field``
    and ``text_field`` and no column named as an output column; ``input_field`` (if present) says where the row
    came from, for the line's ``input``.
    """

    def __init__(self, model: str, spec: Any, *, template: str | None = None, batch_size: int | None = None,
                 device: str = "auto", dtype: str | None = None, text_field: str = "text", id_field: str = "id",
                 input_field: str = "input", **generate: Any) -> None:
        options = job_options(spec, template, batch_size, generate)
        self.lm = load_model(model, device, dtype)
        draft = options.generate.get("draft")
        if isinstance(draft, str):  # a name travels to the actor; a draft model is loaded here, beside the target
            options = replace(options, generate=options.generate | {"draft": resolve_draft(draft, device, dtype)})
        self.unenforced = check_job(self.lm, spec, options)
        self.spec, self.options = spec, options
        self.text_field, self.id_field, self.input_field = text_field, id_field, input_field

    @classmethod
    def constructor_kwargs(cls, model: str, spec: Any, **keywords: Any) -> dict[str, Any]:
        """``map_batches``' ``fn_constructor_kwargs`` for Extractors of ``model`` and ``spec``, with ``keywords``
        (those of `Extractor`), checked here on the driver, so that a mistake is one `JobConfigError` before Ray
        starts an actor: an unknown keyword (with the nearest name), a spec that cannot be used, a template without
        ``{document}``, a bad option value. The model is checked on the actors. Loads nothing."""
        own = [name for name in inspect.signature(cls).parameters if name not in ("model", "spec", "generate")]
        names = own + [name for name in _generate_names() if name != "output_logprobs"]
        check_keywords(cls.__name__, keywords, names)
        job_options(spec, keywords.get("template"), keywords.get("batch_size"),
                     {k: v for k, v in keywords.items() if k not in own})
        return {"model": model, "spec": spec, **keywords}

    def __call__(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Decode one batch (columns, Ray's ``"numpy"`` batch format) and return its columns with the output
        columns added, rows in the input's order. Runs the model; a row that cannot run is that row's error."""
        records = batch_records(batch, self.text_field, self.id_field, self.input_field)
        lines: list[dict[str, Any]] = [{}] * len(records)
        stop_reasons: list[str | None] = [None] * len(records)  # None: the record never ran
        for i, result, line in record_lines(self.lm, self.spec, records, self.options, self.unenforced):
            lines[i], stop_reasons[i] = line, result.stop_reason if result else None
        return dict(batch) | line_columns(lines, stop_reasons)


def check_keywords(owner: str, keywords: dict[str, Any], names: list[str]) -> None:
    """`JobConfigError` for the first of ``keywords`` that ``owner`` (a class's name) does not take, naming the
    nearest of ``names``. Changes nothing."""
    for name in keywords:
        if name not in names:
            near = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {near[0]!r}? " if near else ""
            raise JobConfigError(f"{owner} takes no keyword {name!r}: {hint}its keywords are {', '.join(names)}")


def batch_records(batch: dict[str, Any], text_field: str, id_field: str, input_field: str) -> list[InputRecord]:
    """The input records of one ``map_batches`` batch (columns, Ray's ``"numpy"`` format), in its rows' order; a
    row's ``input_field`` (if present) says where it came from. `JobConfigError` for a batch without
    ``id_field`` or ``text_field`` or with a column named as an output column."""
    for field, option in ((id_field, "id_field"), (text_field, "text_field")):
        if field not in batch:
            raise JobConfigError(f"the dataset has no {field!r} column (columns: {', '.join(batch)}); "
                                 f"pass {option}= with the one to use")
    if taken := [name for name in OUTPUT_COLUMNS if name in batch]:
        raise JobConfigError(f"the dataset has columns named as the Extractor's output ({', '.join(taken)}): "
                             "rename them first (Dataset.rename_columns)")
    columns = {name: values.tolist() for name, values in batch.items()}  # numpy scalars → Python values
    records = []
    for i in range(len(columns[id_field])):
        row = {name: values[i] for name, values in columns.items()}
        where = row.get(input_field) or f"{id_field} {row[id_field]}"
        records.append(input_record(row, str(where), text_field, id_field))
    return records


def _generate_names() -> list[str]:
    """The keywords `structspec.iter_batch` takes for decoding and compiling."""
    return [f.name for cls in (structspec.GenerateOptions, structspec.CompileOptions) for f in fields(cls)]


def job_options(spec: Any, template: str | None, batch_size: int | None, generate: dict[str, Any]) -> JobOptions:
    """The `JobOptions` of an Extractor's keywords; `JobConfigError` for a spec that cannot be used (checked as
    `structspec.compile` checks it, without a tokenizer), a template without ``{document}``, a batch size below 1
    or a bad option. Loads nothing."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=DROPPED_WARNING)  # each line lists them
            structspec.to_regex(spec, strict=generate.get("strict", True))
    except StructspecError as e:
        raise JobConfigError(f"spec: {e}") from None
    if template is not None and (not isinstance(template, str) or "{document}" not in template):
        raise JobConfigError(f"template {template!r} has no {{document}} placeholder: put it where the document "
                             "goes")
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1):
        raise JobConfigError(f"batch_size must be a whole number ≥ 1, got {batch_size!r}; leave it out for the "
                             "device's default")
    changed_options(generate)
    draft = generate.get("draft")
    if isinstance(draft, str) and not (draft in SHIPPED or "/" in draft or os.path.isdir(draft)):
        try:  # neither a model's name (shipped, a hub id, a directory) nor a drafter's: the nearest drafter
            structspec.GenerateOptions.of({"draft": draft})
        except StructspecError as e:
            raise JobConfigError(f"{e} (or a draft model: a shipped name, a hub id or a directory)") from None
    return JobOptions(default_template(spec) if template is None else template, generate, batch_size)


def line_columns(lines: list[dict[str, Any]], stop_reasons: list[str | None] | None = None) -> dict[str, list[Any]]:
    """The output columns of records' lines (see the module's docstring); ``stop_reason`` where ``stop_reasons``
    (one per line, None for a record that never ran) are given."""
    columns: dict[str, list[Any]] = {"value": [line.get("value") for line in lines]}
    if stop_reasons is not None:
        columns["stop_reason"] = stop_reasons
    return columns | {
        "error_kind": [line["error"]["kind"] if "error" in line else None for line in lines],
        "error_message": [line["error"]["message"] if "error" in line else None for line in lines],
        "stats": [line.get("stats") for line in lines],
        "line": [json.dumps(line, ensure_ascii=False) for line in lines],
    }


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
    device: str = "auto",
    dtype: str | None = None,
) -> JobSummary:
    """`structspec.jobs.runner.run_job` on the connected Ray cluster (see `connect`): ``actors`` Extractors,
    each with ``num_cpus`` CPUs and ``num_gpus`` GPUs, decode the records not already in ``output``
    (`run_actors`)."""
    rows_per_pass = options.batch_size
    if rows_per_pass is None:  # an actor with a GPU decodes on it (device "auto"): the GPU's default
        rows_per_pass = DEFAULT_BATCH_SIZE["cuda" if num_gpus else "cpu"]
    kwargs = Extractor.constructor_kwargs(model, spec, template=options.template, batch_size=rows_per_pass,
                                          device=device, dtype=dtype, **options.generate)
    manifest = job_manifest(model, spec, options.template, options.generate)
    return run_actors(Extractor, kwargs, manifest, records, output, options.max_new_tokens,
                      rows_per_pass * BATCHES_PER_CALL, on_record, retry_errors, actors, num_cpus, num_gpus)


def run_actors(
    extractor: type,
    kwargs: dict[str, Any],
    manifest: dict[str, Any],
    records: list[InputRecord],
    output: str | Path,
    max_new_tokens: int,
    rows_per_call: int,
    on_record: Callable[[JobSummary], None] = lambda summary: None,
    retry_errors: bool = False,
    actors: int = 1,
    num_cpus: float = 1,
    num_gpus: float = 0,
) -> JobSummary:
    """A job on the connected Ray cluster, whatever decodes it: claim ``output`` for ``manifest``
    (`structspec.jobs.output.job_output`), and have ``actors`` instances of ``extractor`` (a ``map_batches``
    class built with ``kwargs``, whose output rows carry a ``line`` column), each with ``num_cpus`` CPUs and
    ``num_gpus`` GPUs, decode the records it has no line for yet, ``rows_per_call`` per actor call.

    Appends each record's line as its batch comes back, so the output, its manifest, lock and resume are the
    same as a local job's. Records that could not be read are written last, by this process (``max_new_tokens``
    for their lines), so that a spec, option or model the actors cannot use stops the job (`JobConfigError`)
    before any line is written.
    """
    import ray.data  # imported once connected (see the module's docstring)

    with job_output(output, manifest, records, retry_errors, on_record) as (summary, todo, write):
        readable = [record for record in todo if not record.error]
        if readable:
            dataset = ray.data.from_items([{"id": r.id, "input": r.where, "text": r.text} for r in readable])
            decoded = dataset.map_batches(extractor, fn_constructor_kwargs=kwargs, batch_size=rows_per_call,
                                          compute=ray.data.ActorPoolStrategy(size=actors), num_cpus=num_cpus,
                                          num_gpus=num_gpus)
            try:
                for batch in decoded.iter_batches(batch_size=None, batch_format="numpy"):
                    for line in batch["line"]:
                        write(json.loads(line))
            except ray.exceptions.RayActorError as e:
                if not e.actor_init_failed:
                    raise
                # its last line is the actor's error: "structspec.jobs.errors.JobConfigError: temperature must be > 0"
                raise JobConfigError(f"the actors could not start: {str(e).strip().splitlines()[-1]}") from None
        for record in todo:
            if record.error:
                write(output_line(record, None, max_new_tokens))
    return summary


# The watchdog of a local instance, a process that leads its own process group: it starts the instance with
# ``num_cpus`` CPUs in ``temp_dir`` and prints its address (or why it failed) as a JSON line; when its stdin
# closes (the driver ended or died) it stops the instance, removes ``temp_dir`` and kills what is left of the
# group, itself last (Ray's agents outlive their raylet). A script, not a structspec module: it imports Ray
# alone, which starts in two seconds, not eight.
_WATCHDOG = """
import json, logging, os, shutil, signal, sys
import ray
temp_dir, num_cpus = sys.argv[1], int(sys.argv[2])
try:
    context = ray.init(address="local", num_cpus=num_cpus, _temp_dir=temp_dir, include_dashboard=False,
                       logging_level=logging.WARNING, log_to_driver=False)
    print(json.dumps({"address": context.address_info["gcs_address"]}), flush=True)
    sys.stdin.read()  # returns at EOF: the driver closed the pipe or died
    ray.shutdown()
except Exception as e:
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
finally:
    shutil.rmtree(temp_dir, ignore_errors=True)
    os.killpg(0, signal.SIGKILL)
"""


@contextmanager
def connect(address: str, local_cpus: int = 2) -> Iterator[str]:
    """Connect this process to the Ray cluster at ``address``, or with ``"local"`` to a Ray instance with
    ``local_cpus`` CPUs started for the block; yields where the job runs, in words. Disconnects at the end
    of the block and stops the local instance. ``"local"`` also puts its token in this process's environment
    (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``; see `_use_token_auth`), as Ray's own ``ray.init()`` does for the
    instances it starts."""
    if address != "local":
        with _connected(address):
            yield f"the Ray cluster at {address}"
        return
    _use_token_auth()
    temp_dir = tempfile.mkdtemp(prefix="structspec-ray-", dir="/tmp")  # Ray's default: socket paths stay short
    watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, temp_dir, str(local_cpus)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        reply = json.loads(watchdog.stdout.readline() or '{"error": "its watchdog exited"}')
        if "error" in reply:
            raise JobConfigError(f"the local Ray instance did not start: {reply['error']}")
        with _connected(reply["address"]):
            cpus = f"{local_cpus} CPU" + ("" if local_cpus == 1 else "s")
            yield f"a local Ray instance ({cpus}) in {temp_dir}, stopped when the job ends"
    finally:
        watchdog.stdin.close()  # the watchdog stops the instance; a driver killed by any signal closes it too
        watchdog.wait()


def _use_token_auth() -> None:
    """Put a token in this process's environment (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``) for a local
    instance and the workers it starts: a token, as Ray's own local instances take, but not kept in ``~/.ray``.

    Ray reads the mode when it is first imported, so this must come before (as it does in ``structspec
    extract``). Where Ray was imported earlier without ``RAY_AUTH_MODE=token``, Ray has no public call that
    reads the mode again: ``ray._raylet.Config.initialize`` (what ``ray.init`` calls when it turns token auth
    on, in Ray 2.5x) is used where it exists; else a `JobConfigError` says to set the mode before Python
    starts. Changes ``os.environ``.
    """
    mode = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    if "ray" not in sys.modules or mode == "token":
        return  # Ray reads the mode set here when imported, or already read it as the user set it
    config = getattr(getattr(sys.modules["ray"], "_raylet", None), "Config", None)
    if not hasattr(config, "initialize"):
        raise JobConfigError("Ray was imported before the local instance's token mode was set, and this Ray cannot "
                             "read it again: run with RAY_AUTH_MODE=token in the environment")
    config.initialize("")


@contextmanager
def _connected(address: str) -> Iterator[None]:
    """Connect to ``address`` for the block (a `JobConfigError` if nothing answers there)."""
    import ray.data  # imported once the token mode is set (see `_use_token_auth`)

    try:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except (ConnectionError, ValueError) as e:
        raise JobConfigError(f"cannot connect to the Ray cluster at {address}: {e}") from None
    # the job reports its own progress: Ray Data's bars and notices stay out of its output
    ray.data.DataContext.get_current().enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)
    try:
        yield
    finally:
        ray.shutdown()
