"""Extraction jobs on Ray: `Extractor` for ``ray.data.Dataset.map_batches``, and `run_job` for
``structspec extract --ray``.

Typical use, on a cluster with one GPU per actor::

    import ray
    from structspec.integrations.ray import Extractor

    ray.init(address="auto")
    docs = ray.data.read_json("s3://bucket/docs.jsonl")  # columns: id, text
    records = docs.map_batches(Extractor, fn_constructor_kwargs={"model": "smollm2-135m", "spec": Invoice},
                               batch_size=128, compute=ray.data.ActorPoolStrategy(size=4), num_gpus=1)
    records.write_parquet("s3://bucket/invoices/")

Each actor loads the model and compiles the spec once, then decodes each batch
with the batched engine (`structspec.iter_batch`). An output row is one record:
``id``, ``value`` (JSON text), ``stop_reason``, ``error_kind``, ``error_message``,
``stats`` (JSON text) and ``line``, the record's line exactly as
``structspec extract`` writes it. A bad record is its row's error (the kinds of
`structspec.tools.jobs.ERROR_KINDS`); it never fails the job.

``structspec extract --ray ADDRESS`` runs the same job as ``extract``: the
driver writes each line as its batch comes back, so a killed job resumes
by id, as local ``extract`` does. ``--ray local`` starts a Ray instance for
the job (`connect`), in its own temporary directory and process group, which a
watchdog tears down when the driver ends, even by ``kill -9``.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

try:
    import ray
    import ray.data
except ImportError as e:  # an optional extra
    raise ImportError(f"structspec.integrations.ray needs Ray: pip install 'structspec[ray]' ({e})") from e

from structspec.result import Result
from structspec.tools.jobs import (
    DEFAULT_BATCH_SIZE,
    InputRecord,
    JobConfigError,
    JobOptions,
    JobSummary,
    appending,
    check_job,
    default_template,
    input_record,
    load_model,
    output_line,
    record_lines,
    resolve_draft,
    resume,
)

BATCHES_PER_CALL = 4  # engine batches of rows per actor call, so that finished rows are refilled


class Extractor:
    """One actor's extraction: decodes batches of dataset rows into records, one output row per input row.

    Ray constructs it once per actor (``map_batches(Extractor, fn_constructor_kwargs=...)``): it loads
    ``model`` on ``device`` in ``dtype``, loads a draft model named in ``options.generate["draft"]``
    beside it, and compiles ``spec``; a bad spec, option or model raises `JobConfigError` here,
    before any row runs. ``options`` defaults to the default template and `generate_result`'s defaults.
    Input rows need ``id_field`` and ``text_field``; ``input_field`` (if present) says where the row came
    from, for the line's ``input``.
    """

    def __init__(self, model: str, spec: Any, options: JobOptions | None = None, device: str = "auto",
                 dtype: str | None = None, text_field: str = "text", id_field: str = "id",
                 input_field: str = "input") -> None:
        options = JobOptions(default_template(spec)) if options is None else options
        self.lm = load_model(model, device, dtype)
        draft = options.generate.get("draft")
        if isinstance(draft, str):  # a name travels to the actor; a draft model is loaded here, beside the target
            options = replace(options, generate=options.generate | {"draft": resolve_draft(draft, device, dtype)})
        check_job(self.lm, spec, options)
        self.spec, self.options = spec, options
        self.text_field, self.id_field, self.input_field = text_field, id_field, input_field

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[Any]]:
        """Decode one batch (columns, Ray's ``"numpy"`` batch format) and return the output columns, rows in
        the order they finished. Runs the model; a row that cannot run is that row's error."""
        if self.id_field not in batch:
            raise JobConfigError(f"the dataset has no {self.id_field!r} column (columns: {', '.join(batch)}); "
                                 "pass id_field=")
        columns = {name: values.tolist() for name, values in batch.items()}  # numpy scalars → Python values
        records = []
        for i in range(len(columns[self.id_field])):
            row = {name: values[i] for name, values in columns.items()}
            where = row.get(self.input_field) or f"{self.id_field} {row[self.id_field]}"
            records.append(input_record(row, str(where), self.text_field, self.id_field))
        return _columns(list(record_lines(self.lm, self.spec, records, self.options)))


def _columns(lines: list[tuple[Result | None, dict[str, Any]]]) -> dict[str, list[Any]]:
    """The output columns of records' results and lines (see the module's docstring)."""

    def text(value: Any) -> str:
        return json.dumps(value, ensure_ascii=False)

    return {
        "id": [line["id"] for _, line in lines],
        "value": [text(line["value"]) if "value" in line else None for _, line in lines],
        "stop_reason": [result.stop_reason if result else None for result, _ in lines],
        "error_kind": [line["error"]["kind"] if "error" in line else None for _, line in lines],
        "error_message": [line["error"]["message"] if "error" in line else None for _, line in lines],
        "stats": [text(line["stats"]) if "stats" in line else None for _, line in lines],
        "line": [text(line) for _, line in lines],
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
    """`structspec.tools.jobs.run_job` on the connected Ray cluster (see `connect`): ``actors`` Extractors,
    each with ``num_cpus`` CPUs and ``num_gpus`` GPUs, decode the records not already in ``output``.

    Appends each record's line as its batch comes back, so the output and its resume are the same as a
    local job's. Records that could not be read are written last, by this process, so that a spec, option or
    model the actors cannot use stops the job (`JobConfigError`) before any line is written.
    """
    summary, todo = resume(records, output, retry_errors)
    readable = [record for record in todo if not record.error]
    rows_per_pass = options.batch_size
    if rows_per_pass is None:  # an actor with a GPU decodes on it (device "auto"): the GPU's default
        rows_per_pass = DEFAULT_BATCH_SIZE["cuda" if num_gpus else "cpu"]
    with appending(output, summary, on_record) as write:
        if readable:
            dataset = ray.data.from_items([{"id": r.id, "input": r.where, "text": r.text} for r in readable])
            decoded = dataset.map_batches(
                Extractor, fn_constructor_kwargs={"model": model, "spec": spec, "device": device, "dtype": dtype,
                                                  "options": replace(options, batch_size=rows_per_pass)},
                batch_size=rows_per_pass * BATCHES_PER_CALL, compute=ray.data.ActorPoolStrategy(size=actors),
                num_cpus=num_cpus, num_gpus=num_gpus)
            try:
                for batch in decoded.iter_batches(batch_size=None, batch_format="numpy"):
                    for line in batch["line"]:
                        write(json.loads(line))
            except ray.exceptions.RayActorError as e:
                if not e.actor_init_failed:
                    raise
                # its last line is the actor's error: "structspec.tools.jobs.JobConfigError: temperature must be > 0"
                raise JobConfigError(f"the actors could not start: {str(e).strip().splitlines()[-1]}") from None
        for record in todo:
            if record.error:
                write(output_line(record, None, options.max_new_tokens))
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
    (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN``), as Ray's own ``ray.init()`` does for the instances it starts."""
    if address != "local":
        with _connected(address):
            yield f"the Ray cluster at {address}"
        return
    temp_dir = tempfile.mkdtemp(prefix="structspec-ray-", dir="/tmp")  # Ray's default: socket paths stay short
    # A token, as Ray's own local instances take, but kept in the environment, not in ~/.ray. Ray reads the
    # mode when it is imported: refresh its config, as ray.init does when it starts an instance.
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    ray._raylet.Config.initialize("")
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


@contextmanager
def _connected(address: str) -> Iterator[None]:
    """Connect to ``address`` for the block (a `JobConfigError` if nothing answers there)."""
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
