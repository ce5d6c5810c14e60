"""``structspec extract --engine vllm`` on vLLM's CPU build and SmolLM2-135M (converted): one line per record,
valid against the schema, ids kept; a rerun skips all; kill -9 then a rerun writes each record exactly once; a
record that cannot be read, or runs out of budget, gets its error line.

The kill test runs the CLI in a subprocess (its own engine) before the module's engine starts, so one engine
runs at a time; the others call the job in-process on the module's engine. `.ci/vllm-check` runs the module in
its own venv. Skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vLLM's CPU default takes far more than 135M needs

import jsonschema  # noqa: E402
from vllm import LLM  # noqa: E402

from structspec.jobs import vllm as vllm_jobs  # noqa: E402
from structspec.jobs.errors import JobConfigError  # noqa: E402
from structspec.jobs.manifest import manifest_path  # noqa: E402
from structspec.jobs.prompts import default_template  # noqa: E402
from structspec.jobs.records import InputRecord, read_inputs  # noqa: E402
from structspec.jobs.runner import JobOptions  # noqa: E402
from structspec.models.shipped import model_path  # noqa: E402
from structspec.tools.cli import main  # noqa: E402
from structspec.tools.command import EXIT_CONFIG  # noqa: E402
from tests.conftest import _USER_CACHE, _set_cache  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "role": {"enum": ["admin", "editor", "viewer"]}},
    "required": ["name", "age", "role"],
}
PEOPLE = ["Ada Lovelace, 36, is an admin.", "Grace Hopper is 85 and edits the docs.",
          "Linus, 54 years old, only views.", "Margaret Hamilton (33) administers the servers.",
          "Alan is 41; he edits.", "Barbara, aged 29, is a viewer."]
BUDGET = 100  # tokens: each record above ends in about 30


@pytest.fixture(scope="module")
def model_dir(isolated_cache: str) -> str:
    """SmolLM2-135M's converted directory, from the developer's structspec cache (converted there on first use)."""
    _set_cache(_USER_CACHE)
    try:
        return str(Path(model_path("smollm2-135m")).resolve())
    finally:
        _set_cache(isolated_cache)


@pytest.fixture(scope="module")
def llm(model_dir: str) -> Iterator[LLM]:
    """One engine for the module, under the structspec backend, its engine core in this process."""
    with pytest.MonkeyPatch.context() as patch:  # the setting restored when the module ends
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        engine = vllm_jobs.load_engine(model_dir, enforce_eager=True, max_model_len=2048, seed=0)
        yield engine
        engine.llm_engine.engine_core.shutdown()  # its memory back before the next module starts an engine


def _write_input(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _rows(output: Path) -> list[dict]:
    return [json.loads(line) for line in output.read_text().splitlines()]


def _options(batch_size: int, max_new_tokens: int = BUDGET) -> JobOptions:
    return JobOptions(default_template(SCHEMA), {"max_new_tokens": max_new_tokens}, batch_size)


def test_kill_9_mid_job_then_rerun_writes_each_record_once(tmp_path: Path, model_dir: str,
                                                           request: pytest.FixtureRequest) -> None:
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    source = _write_input(tmp_path / "in.jsonl", [{"id": f"p{i}", "text": t} for i, t in enumerate(PEOPLE)])
    output = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "structspec.tools", "extract", "--engine", "vllm", "--schema",
               str(tmp_path / "s.json"), "--input", str(source), "--output", str(output), "--model", model_dir,
               "--batch-size", "1", "--max-new-tokens", str(BUDGET), "--quiet"]
    # its own session: the kill reaches every process the job started
    log = tmp_path / "stderr.txt"  # (a file, not a pipe: vLLM's log would fill a pipe nobody reads)
    with log.open("wb") as stderr:
        job = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL, stderr=stderr)
    deadline = time.monotonic() + 240
    while not (output.exists() and output.read_bytes().count(b"\n") >= 1):
        assert job.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no line within 240 s"
        time.sleep(0.02)
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    at_kill = len(_rows(output))
    assert 1 <= at_kill < len(PEOPLE)  # killed mid-job: records were left to run

    llm = request.getfixturevalue("llm")  # (the module's engine starts only now: one engine at a time)
    summary = vllm_jobs.run_job(llm, model_dir, SCHEMA, read_inputs(source), output, _options(batch_size=1))
    ids = [row["id"] for row in _rows(output)]
    assert sorted(ids) == [f"p{i}" for i in range(len(PEOPLE))]  # each record exactly once
    assert summary.skipped == at_kill and summary.written == len(PEOPLE) - at_kill


def test_each_record_gets_one_valid_line_and_a_rerun_skips_all(tmp_path: Path, llm: LLM, model_dir: str) -> None:
    source = _write_input(tmp_path / "in.jsonl", [
        {"id": "a", "text": PEOPLE[0]}, {"id": "b", "text": PEOPLE[1]},
        {"id": "bad", "body": "no text field"}, {"id": "d", "text": PEOPLE[2]}])
    records, output = read_inputs(source), tmp_path / "out.jsonl"
    summary = vllm_jobs.run_job(llm, model_dir, SCHEMA, records, output, _options(batch_size=2))
    rows = {row["id"]: row for row in _rows(output)}
    assert len(_rows(output)) == 4 and set(rows) == {"a", "b", "bad", "d"}
    for record in records:  # each line names its record as the local job's lines do
        assert (rows[record.id]["input"], rows[record.id]["input_hash"]) == (record.where, record.input_hash)
    assert rows["bad"]["error"]["kind"] == "malformed_input" and "'text'" in rows["bad"]["error"]["message"]
    for rid in "abd":
        jsonschema.validate(rows[rid]["value"], SCHEMA)
        assert 0 < rows[rid]["stats"]["output_tokens"] <= BUDGET
    assert (summary.ok, dict(summary.failed)) == (3, {"malformed_input": 1})
    assert json.loads(manifest_path(output).read_text())["settings"]["engine"] == "vllm"

    before = output.read_bytes()
    again = vllm_jobs.run_job(llm, model_dir, SCHEMA, records, output, _options(batch_size=2))
    assert (again.skipped, again.written) == (4, 0) and output.read_bytes() == before


def test_a_budget_that_runs_out_is_that_records_error_line(tmp_path: Path, llm: LLM, model_dir: str) -> None:
    source = _write_input(tmp_path / "in.jsonl", [{"id": "a", "text": PEOPLE[0]}])
    output = tmp_path / "out.jsonl"
    vllm_jobs.run_job(llm, model_dir, SCHEMA, read_inputs(source), output, _options(1, max_new_tokens=4))
    (row,) = _rows(output)
    assert row["error"]["kind"] == "token_budget" and "--max-new-tokens" in row["error"]["message"]
    assert row["stats"]["output_tokens"] == 4 and row["error"]["partial_text"].startswith("{")


def test_a_text_the_tokenizer_cannot_encode_is_its_records_line_and_its_chunk_runs(tmp_path: Path, llm: LLM,
                                                                                   model_dir: str) -> None:
    # read_inputs refuses such a record before any engine (unencodable_text); made here as a caller of the job
    # could, it reaches the tokenizer, which raises: that record's line, and the rest of its chunk still runs
    records = [InputRecord("a", "line 1", PEOPLE[0]), InputRecord("bad", "line 2", "Ada \ud800 Lovelace"),
               InputRecord("c", "line 3", PEOPLE[2])]
    output = tmp_path / "out.jsonl"
    summary = vllm_jobs.run_job(llm, model_dir, SCHEMA, records, output, _options(batch_size=3))
    rows = {row["id"]: row for row in _rows(output)}
    assert set(rows) == {"a", "bad", "c"} and rows["bad"]["error"]["kind"] == "unencodable_text"
    assert (summary.ok, dict(summary.failed)) == (2, {"unencodable_text": 1})


def test_options_vllm_refuses_are_refused_before_the_engine_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    def load_engine(*args: object, **kwargs: object) -> None:
        raise AssertionError("the engine was loaded before the error was found")

    monkeypatch.setattr(vllm_jobs, "load_engine", load_engine)
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    source = _write_input(tmp_path / "in.jsonl", [{"id": "a", "text": PEOPLE[0]}])
    job = ["extract", "--engine", "vllm", "--schema", str(tmp_path / "s.json"), "--input", str(source),
           "--output", str(tmp_path / "out.jsonl"), "--model", "smollm2-135m"]
    assert main([*job, "--top-k", "-5"]) == EXIT_CONFIG
    assert "top_k" in capsys.readouterr().err and not (tmp_path / "out.jsonl").exists()
    with pytest.raises(JobConfigError, match="fast_forward are options of structspec's own loop"):
        vllm_jobs.sampling_params(SCHEMA, JobOptions("{document}", {"fast_forward": "exact"}))
