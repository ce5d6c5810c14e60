"""Extraction on Ray: the `Extractor` alone, and `structspec extract --ray local` killed, resumed and checked
against the local job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tests.jobs.test_jobs import SCHEMA  # short outputs, so the tiny random model finishes records

pytest.importorskip("ray.data")  # the optional extra (`pip install 'structspec-lm[ray]'`); CI installs it

from structspec.jobs import ray as ray_jobs  # noqa: E402
from structspec.jobs.ray import Extractor  # noqa: E402
from structspec.jobs.errors import JobConfigError  # noqa: E402
from structspec.testing import save_tiny_model  # noqa: E402
from structspec.tools.cli import main  # noqa: E402
from structspec.tools.command import EXIT_CONFIG, EXIT_OK  # noqa: E402

N_RECORDS = 40  # five actor calls of 8 rows: a kill after the first lines lands mid-job
KILL_AFTER = 3  # lines written when the driver kills itself


def killed_after_lines(jobs_module: str, lines: int) -> str:
    """A script running `structspec extract` (argv after the script) whose driver kill -9s itself once ``lines``
    lines are written, through ``jobs_module``'s ``run_job`` (its ``on_record``): the kill lands mid-job whatever
    the timing."""
    return f"""
import inspect, os, signal, sys
from structspec.jobs import {jobs_module} as jobs
from structspec.tools.cli import main
run_job = jobs.run_job
def killing_run_job(*args, **kwargs):
    bound = inspect.signature(run_job).bind(*args, **kwargs)
    show = bound.arguments.get("on_record", lambda summary: None)
    def on_record(summary):
        show(summary)
        if summary.written == {lines}:
            os.kill(os.getpid(), signal.SIGKILL)
    bound.arguments["on_record"] = on_record
    return run_job(*bound.args, **bound.kwargs)
jobs.run_job = killing_run_job
sys.exit(main(sys.argv[1:]))
"""


OPTIONS = {"max_new_tokens": 24, "batch_size": 2}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved tiny model, a schema file and `N_RECORDS` records, two malformed: line 4 is not JSON, line 9 has
    no text."""
    root = tmp_path_factory.mktemp("ray-job")
    save_tiny_model(root / "model")
    (root / "schema.json").write_text(json.dumps(SCHEMA))
    lines = [json.dumps({"id": f"doc-{i}", "text": f"Box {i}: {['small', 'large'][i % 2]}."}) for i in range(N_RECORDS)]
    lines[3], lines[8] = "{not json", json.dumps({"id": "untitled", "body": "no text field"})
    (root / "input.jsonl").write_text("\n".join(lines) + "\n")
    return {"root": root, "model": root / "model", "schema": root / "schema.json", "input": root / "input.jsonl"}


def _arguments(job: dict[str, Path], output: Path) -> list[str]:
    return ["extract", "--schema", str(job["schema"]), "--input", str(job["input"]), "--output", str(output),
            "--model", str(job["model"]), "--max-new-tokens", "24", "--batch-size", "2", "--device", "cpu"]


def _rows(output: Path) -> dict[str, dict]:
    return {row["id"]: row for row in map(json.loads, output.read_text().splitlines())}


def _left_behind(temp_dir: str) -> list[int]:
    """Processes whose command line or open files lie in ``temp_dir`` (Ray's workers rename themselves, but
    keep their log files open)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if temp_dir in (proc / "cmdline").read_bytes().decode(errors="replace") or any(
                    os.readlink(fd).startswith(temp_dir) for fd in (proc / "fd").iterdir()):
                pids.append(int(proc.name))
        except OSError:  # gone meanwhile, or not ours
            continue
    return pids


def _assert_torn_down(stderr: str) -> None:
    """The local instance named in ``stderr`` is gone: its directory and every process that used it."""
    [temp_dir] = re.findall(r"a local Ray instance \(2 CPUs\) in (\S+),", stderr)
    deadline = time.monotonic() + 60
    while (Path(temp_dir).exists() or _left_behind(temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not Path(temp_dir).exists() and not _left_behind(temp_dir)


UNIQUE = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}  # a regex cannot enforce uniqueItems


@pytest.mark.parametrize("keywords, message", [
    ({"max_tokens": 30}, "Extractor takes no keyword 'max_tokens': did you mean 'max_new_tokens'?"),
    ({"text_feild": "body"}, "Extractor takes no keyword 'text_feild': did you mean 'text_field'?"),
    ({"output_logprobs": True}, "Extractor takes no keyword 'output_logprobs'"),
    ({"temperature": 0.0}, "temperature must be"),
    ({"draft": "prompt_lokup"}, "did you mean 'prompt_lookup'"),
    ({"template": "Extract the box."}, "has no {document} placeholder"),
    ({"batch_size": 0}, "batch_size must be a whole number ≥ 1, got 0"),
])
def test_extractor_keywords_are_checked_on_the_driver_before_ray_starts(keywords: dict, message: str) -> None:
    with pytest.raises(JobConfigError, match=re.escape(message)):
        Extractor.constructor_kwargs("smollm2-135m", SCHEMA, **keywords)


def test_extractor_keywords_come_back_as_given_and_a_spec_is_checked_with_its_strictness() -> None:
    kwargs = Extractor.constructor_kwargs("smollm2-135m", SCHEMA, max_new_tokens=30, template="Box: {document}",
                                          batch_size=4, text_field="body", draft=None)
    assert kwargs == {"model": "smollm2-135m", "spec": SCHEMA, "max_new_tokens": 30, "template": "Box: {document}",
                      "batch_size": 4, "text_field": "body", "draft": None}
    with pytest.raises(JobConfigError, match=r"spec: unsupported schema keyword 'uniqueItems'"):
        Extractor.constructor_kwargs("smollm2-135m", UNIQUE)
    assert Extractor.constructor_kwargs("smollm2-135m", UNIQUE, strict=False)["strict"] is False


@pytest.mark.slow
def test_an_extractor_keeps_the_input_columns_and_adds_structured_results(job: dict[str, Path]) -> None:
    extractor = Extractor(**Extractor.constructor_kwargs(str(job["model"]), SCHEMA, device="cpu", **OPTIONS))
    batch = {"id": np.array(["a", "b", "c", "d"]), "lang": np.array(["en", "fr", "de", "en"]),
             "text": np.array(["Item 1 is small.", "", None, "Item 4 is large."], dtype=object)}
    columns = extractor(batch)
    assert list(columns) == ["id", "lang", "text", *ray_jobs.OUTPUT_COLUMNS]
    for name in batch:  # the input's columns, rows in the input's order
        assert list(columns[name]) == list(batch[name])
    rows = {i: {name: values[k] for name, values in columns.items()} for k, i in enumerate(columns["id"])}
    assert rows["b"]["error_kind"] == "empty_document" and rows["c"]["error_kind"] == "malformed_input"
    assert rows["b"]["stop_reason"] is None and rows["b"]["value"] is None and rows["b"]["stats"] is None
    for a in (rows["a"], rows["d"]):
        assert a["stop_reason"] in ("eos", "fsm_complete", "max_new_tokens") and a["stats"]["output_tokens"] > 0
        assert a["value"] is None if a["error_kind"] == "token_budget" else set(a["value"]) == {"flag", "size"}
        line = json.loads(a["line"])  # the line `structspec extract` writes
        assert line["input"] == f"id {a['id']}" and line.get("value") == a["value"] and line["stats"] == a["stats"]
    with pytest.raises(JobConfigError, match="temperature must be"):  # the actor checks what it is given too
        Extractor(str(job["model"]), SCHEMA, device="cpu", temperature=0.0)
    with pytest.raises(JobConfigError, match=r"no 'text' column \(columns: id, body\); pass text_field="):
        extractor({"id": np.array(["a"]), "body": np.array(["Item 1."])})
    with pytest.raises(JobConfigError, match=r"columns named as the Extractor's output \(value\)"):
        extractor(batch | {"value": np.array([1, 2, 3, 4])})


def test_a_local_instance_sets_token_auth_before_ray_reads_it_or_says_how(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray._raylet  # this process imported Ray (this module's importorskip) before any job set the mode

    calls = []

    class Config:  # stands for Ray's own, which reads RAY_AUTH_MODE again
        @staticmethod
        def initialize(config: str) -> None:
            calls.append((config, os.environ["RAY_AUTH_MODE"]))

    for preset, reread in [("token", []), (None, [("", "token")])]:
        for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):
            monkeypatch.delenv(name, raising=False)
        if preset:
            monkeypatch.setenv("RAY_AUTH_MODE", preset)
        monkeypatch.setattr(ray._raylet, "Config", Config)
        calls.clear()
        ray_jobs._use_token_auth()
        assert calls == reread and os.environ["RAY_AUTH_MODE"] == "token" and len(os.environ["RAY_AUTH_TOKEN"]) == 64
    monkeypatch.delenv("RAY_AUTH_MODE")
    monkeypatch.setattr(ray._raylet, "Config", object())  # a Ray without the call
    with pytest.raises(JobConfigError, match="run with RAY_AUTH_MODE=token in the environment"):
        ray_jobs._use_token_auth()


def test_ray_options_without_ray_are_a_configuration_error(job: dict[str, Path], tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_arguments(job, tmp_path / "out.jsonl") + ["--num-gpus", "1"]) == EXIT_CONFIG
    assert "--num-gpus need --ray" in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
def test_a_ray_job_killed_and_rerun_writes_each_record_once_as_the_local_job_does(job: dict[str, Path],
                                                                                  tmp_path: Path) -> None:
    output = tmp_path / "ray.jsonl"
    arguments = _arguments(job, output) + ["--ray", "local", "--actors", "2"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}  # as a user's shell has them
    env |= {"STRUCTSPEC_CACHE": str(job["root"] / "cache"), "OMP_NUM_THREADS": "1"}
    killed = subprocess.run([sys.executable, "-c", killed_after_lines("ray", KILL_AFTER), *arguments], env=env,
                            capture_output=True, text=True, timeout=240)
    assert killed.returncode == -signal.SIGKILL, killed.stderr  # no cleanup of the driver's own ran
    before = output.read_text()
    assert before.count("\n") == KILL_AFTER, killed.stderr  # killed mid-job, after the first batch came back
    _assert_torn_down(killed.stderr)

    command = [sys.executable, "-m", "structspec.tools", *arguments]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == EXIT_OK, done.stderr
    _assert_torn_down(done.stderr)
    assert output.read_text().startswith(before)  # what was written before the kill stays as it was
    ids = Counter(json.loads(line)["id"] for line in output.read_text().splitlines())
    assert ids == Counter(["<line 4>", "untitled"] + [f"doc-{i}" for i in range(N_RECORDS) if i not in (3, 8)])
    assert f"{N_RECORDS} records:" in done.stderr and "already done" in done.stderr

    assert main(_arguments(job, tmp_path / "local.jsonl") + ["--quiet"]) == EXIT_OK
    ray_rows, local_rows = _rows(output), _rows(tmp_path / "local.jsonl")
    assert ray_rows["<line 4>"]["error"]["kind"] == ray_rows["untitled"]["error"]["kind"] == "malformed_input"
    assert sum("value" in row for row in ray_rows.values()) > N_RECORDS // 2

    def same_format(row: dict) -> tuple:  # all but the timings: keys in order, value or error, stats' keys
        return [k for k in row], {k: v for k, v in row.items() if k != "stats"}, list(row.get("stats", {}))

    assert {i: same_format(r) for i, r in ray_rows.items()} == {i: same_format(r) for i, r in local_rows.items()}
