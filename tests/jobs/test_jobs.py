"""Extraction jobs in-process: reading inputs, per-record errors, resuming from the output file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, field_validator

import structspec
from structspec.jobs.errors import JobConfigError
from structspec.jobs.manifest import check_output
from structspec.jobs.output import JobSummary, resume
from structspec.jobs.prompts import build_prompt, default_template, read_template
from structspec.jobs.records import InputRecord, read_inputs
from structspec.jobs.runner import (
    DEFAULT_BATCH_SIZE,
    JobOptions,
    default_batch_size,
    load_model,
    resolve_draft,
    run_job,
)
from structspec.jobs.spec import load_spec
from structspec.testing import CountingLM

SCHEMA = {  # short outputs, so the tiny random model finishes records
    "type": "object",
    "properties": {"flag": {"type": "boolean"}, "size": {"enum": ["small", "medium", "large"]}},
    "required": ["flag", "size"],
    "additionalProperties": False,
}
OPTIONS = JobOptions(default_template(SCHEMA), {"max_new_tokens": 30})


def test_jsonl_records_keep_their_line_and_bad_lines_become_errors(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": "a", "text": "Alice"}\n\n{not json\n{"text": "no id"}\n["a list"]\n'
                     b'{"id": 7, "body": "x"}\n{"id": "e", "text": "   "}\n{"id": "u", "text": "\xff"}\n')
    got = [(r.id, r.where, r.text, r.error and r.error[0]) for r in read_inputs(path)]
    assert got == [
        ("a", "line 1", "Alice", None),
        ("<line 3>", "line 3", "", "malformed_input"),
        ("<line 4>", "line 4", "no id", None),
        ("<line 5>", "line 5", "", "malformed_input"),
        ("7", "line 6", "", "malformed_input"),
        ("e", "line 7", "", "empty_document"),
        ("<line 8>", "line 8", "", "malformed_input"),
    ]
    assert "no 'text' field" in read_inputs(path)[4].error[1]


def test_fields_are_chosen_by_name_in_jsonl_and_csv(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"key": "k1", "body": "hello"}\n')
    (tmp_path / "in.csv").write_text('key,body\nk1,"two\nlines"\n,short\n')
    [record] = read_inputs(tmp_path / "in.jsonl", text_field="body", id_field="key")
    assert (record.id, record.text) == ("k1", "hello")
    rows = read_inputs(tmp_path / "in.csv", text_field="body", id_field="key")
    assert [(r.id, r.where, r.text) for r in rows] == [("k1", "row 3", "two\nlines"), ("<row 4>", "row 4", "short")]
    with pytest.raises(JobConfigError, match="no 'text' column"):
        read_inputs(tmp_path / "in.csv")


def test_a_folder_of_text_files_is_one_record_per_file(tmp_path: Path) -> None:
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "c.txt").write_bytes(b"\xff\xfe")
    (tmp_path / "notes.md").write_text("ignored")
    records = read_inputs(tmp_path)
    assert [(r.id, r.text, r.error and r.error[0]) for r in records] == [
        ("a", "first", None), ("b", "second", None), ("c", "", "malformed_input")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(JobConfigError, match="no .txt files"):
        read_inputs(tmp_path / "empty")


def test_unreadable_input_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(JobConfigError, match="cannot read the input"):
        read_inputs(tmp_path / "missing.jsonl")


def test_specs_load_from_modules_files_json_and_reject_the_rest(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mypkg_schemas.py").write_text("from pydantic import BaseModel\nclass P(BaseModel):\n    x: int\n")
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    assert load_spec("mypkg_schemas:P").model_fields.keys() == {"x"}
    assert load_spec(str(tmp_path / "mypkg_schemas.py") + ":P").__name__ == "P"
    assert load_spec("s.json") == SCHEMA
    assert isinstance(load_spec("grammar:date"), structspec.Regex)
    for bad, message in [("mypkg_schemas:Q", "no attribute 'Q'"), ("no_such_module:P", "cannot import"),
                         ("missing.py:P", "no Python file"), ("missing.json", "cannot read"),
                         ("justaname", "use package.module:Model"), ("grammar:no-such-grammar", "grammar")]:
        with pytest.raises(JobConfigError, match=message):
            load_spec(bad)


def test_the_default_prompt_names_the_fields_and_templates_need_the_placeholder(tmp_path: Path) -> None:
    assert "flag, size" in default_template(SCHEMA) and "{document}" in default_template(SCHEMA)
    (tmp_path / "t.txt").write_text("Read this: {no placeholder}")
    with pytest.raises(JobConfigError, match="placeholder"):
        read_template(str(tmp_path / "t.txt"))


def _run(lm: structspec.LM, records: list[InputRecord], out: Path,
         options: JobOptions = OPTIONS) -> dict[str, dict]:
    """Run a job into ``out`` and return its lines by id."""
    run_job(lm, SCHEMA, records, out, options)
    return {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}


def _prompt_of_length(lm: structspec.LM, tokens: int) -> str:
    """A document whose job prompt is exactly ``tokens`` tokens."""
    document = ""
    while len(lm.encode_prompt(build_prompt(lm, OPTIONS.template, document))) < tokens:
        document += "a "
    while len(lm.encode_prompt(build_prompt(lm, OPTIONS.template, document))) > tokens:
        document = document[:-1]
    assert len(lm.encode_prompt(build_prompt(lm, OPTIONS.template, document))) == tokens
    return document


@pytest.mark.slow
def test_a_document_longer_than_the_context_is_an_error_without_any_forward_pass(byte_lm: structspec.LM,
                                                                                tmp_path: Path) -> None:
    lm = CountingLM(byte_lm)
    long_text = " ".join(f"Alice{i} is {i} years old." for i in range(400))
    [row] = _run(lm, [InputRecord("x", "line 1", long_text)], tmp_path / "out.jsonl").values()
    assert row["error"]["kind"] == "too_long" and "stats" not in row
    assert row["error"]["message"].startswith("PromptError: the prompt has ") and "2048" in row["error"]["message"]
    assert lm.passes == 0
    rows = _run(byte_lm, [InputRecord("x", "line 1", long_text), InputRecord("y", "line 2", "Item 1.")],
                tmp_path / "two.jsonl")
    assert rows["x"]["error"]["kind"] == "too_long" and "stats" in rows["y"]  # the other row is unaffected


@pytest.mark.slow
def test_a_token_budget_that_runs_out_keeps_the_partial_output_and_stats(byte_lm: structspec.LM,
                                                                         tmp_path: Path) -> None:
    options = JobOptions(OPTIONS.template, {"max_new_tokens": 3})
    [row] = _run(byte_lm, [InputRecord("x", "line 1", "Alice is 31.")], tmp_path / "out.jsonl", options).values()
    assert row["error"]["kind"] == "token_budget"
    assert row["error"]["message"].startswith("max_new_tokens=3 ran out before the output was complete")
    assert row["stats"]["output_tokens"] == 3
    assert row["error"]["partial_text"].startswith('{"')


@pytest.mark.slow
def test_a_context_that_fills_up_mid_record_keeps_the_partial_output_and_stats(byte_lm: structspec.LM,
                                                                               tmp_path: Path) -> None:
    document = _prompt_of_length(byte_lm, 2048 - 5)  # room for 5 output tokens; the record needs more
    rows = _run(byte_lm, [InputRecord("x", "line 1", document), InputRecord("y", "line 2", "Item 2.")],
                tmp_path / "out.jsonl")
    error = rows["x"]["error"]
    assert error["kind"] == "max_context" and error["message"].startswith("the model's context filled up")
    assert 0 < rows["x"]["stats"]["output_tokens"] <= 6 and error["partial_text"].startswith('{"')  # the last unfed
    assert "stats" in rows["y"] and rows["y"].get("error", {}).get("kind") != "max_context"


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 3])
def test_a_job_writes_one_line_per_record_and_a_rerun_writes_nothing(byte_lm: structspec.LM, tmp_path: Path,
                                                                     batch_size: int) -> None:
    records = [InputRecord(f"r{i}", f"line {i}", f"Item {i} is small.") for i in range(4)]
    records.insert(2, InputRecord("<line 9>", "line 9", error=("malformed_input", "line 9: not JSON")))
    out = tmp_path / "out.jsonl"
    options = JobOptions(OPTIONS.template, OPTIONS.generate, batch_size)
    summary = run_job(byte_lm, SCHEMA, records, out, options)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0]["id"] == "<line 9>"  # unreadable records first; the others as they finish
    assert sorted(r["id"] for r in rows) == ["<line 9>", "r0", "r1", "r2", "r3"]
    assert summary.ok + summary.failed["token_budget"] == 4 and summary.failed["malformed_input"] == 1
    for row in rows:
        if "value" in row:
            assert set(row["value"]) == {"flag", "size"}
            assert row["stats"]["no_pass_tokens"] == row["stats"]["forced_tokens"] > 0
            assert {"prefill_passes", "prefix_tokens_reused"} <= set(row["stats"])
    before = out.read_bytes()
    again = run_job(byte_lm, SCHEMA, records, out, options)
    assert (again.skipped, again.written) == (5, 0) and out.read_bytes() == before


@pytest.mark.slow
def test_batched_and_one_by_one_jobs_write_the_same_records(byte_lm: structspec.LM, tmp_path: Path) -> None:
    records = [InputRecord(f"r{i}", f"line {i}", f"Item {i} is a {['small', 'large'][i % 2]} box.")
               for i in range(6)]
    alone = _run(byte_lm, records, tmp_path / "1.jsonl", JobOptions(OPTIONS.template, OPTIONS.generate, 1))
    batched = _run(byte_lm, records, tmp_path / "4.jsonl", JobOptions(OPTIONS.template, OPTIONS.generate, 4))

    def outcome(row: dict) -> tuple:
        return row.get("value"), row.get("error", {}).get("kind"), row.get("error", {}).get("partial_text")

    assert {k: outcome(r) for k, r in batched.items()} == {k: outcome(r) for k, r in alone.items()}
    assert sum(r["stats"]["prefix_tokens_reused"] for r in batched.values()) > 0  # the template is prefilled once


@pytest.mark.slow
def test_an_interrupted_batched_job_resumes_by_id_whatever_order_rows_finished(byte_lm: structspec.LM,
                                                                             tmp_path: Path) -> None:
    records = [InputRecord(f"r{i}", f"line {i}", f"Item {i} is a {['small', 'large'][i % 2]} box.")
               for i in range(7)]
    out = tmp_path / "out.jsonl"
    options = JobOptions(OPTIONS.template, OPTIONS.generate, 4)

    def interrupt(summary: JobSummary) -> None:
        if summary.written == 3:
            raise KeyboardInterrupt  # as Ctrl-C would, between two lines

    with pytest.raises(KeyboardInterrupt):
        run_job(byte_lm, SCHEMA, records, out, options, interrupt)
    first = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(first) == 3
    summary = run_job(byte_lm, SCHEMA, records, out, options)
    assert (summary.skipped, summary.written) == (3, 4)
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids[:3] == first and sorted(ids) == [f"r{i}" for i in range(7)]


@pytest.mark.slow
def test_resume_cuts_a_torn_last_line_and_reruns_that_record(byte_lm: structspec.LM, tmp_path: Path) -> None:
    records = [InputRecord(f"r{i}", f"line {i}", f"Item {i} is large.") for i in range(3)]
    out = tmp_path / "out.jsonl"
    run_job(byte_lm, SCHEMA, records[:1], out, OPTIONS)
    with open(out, "ab") as f:
        f.write(b'{"id": "r1", "input": "li')  # what a power cut mid-write could leave
    summary = run_job(byte_lm, SCHEMA, records, out, OPTIONS)
    assert (summary.skipped, summary.written) == (1, 2)
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == ["r0", "r1", "r2"]


@pytest.mark.slow
def test_repeated_ids_resume_by_their_place_in_the_input(byte_lm: structspec.LM, tmp_path: Path) -> None:
    records = [InputRecord("same", f"line {i}", f"Item {i}.") for i in range(3)]
    out = tmp_path / "out.jsonl"
    run_job(byte_lm, SCHEMA, records[:2], out, OPTIONS)
    assert run_job(byte_lm, SCHEMA, records, out, OPTIONS).written == 1
    assert [json.loads(line)["input"] for line in out.read_text().splitlines()] == ["line 0", "line 1", "line 2"]


def test_retry_errors_drops_error_lines_and_runs_those_records_again(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "a", "input": "line 1", "value": 1}\n'
                   '{"id": "b", "input": "line 2", "error": {"kind": "token_budget"}}\n')
    records = [InputRecord("a", "line 1", "A."), InputRecord("b", "line 2", "B.")]
    summary, todo = resume(records, out, retry_errors=True)
    assert (summary.skipped, todo) == (1, records[1:])
    assert out.read_text() == '{"id": "a", "input": "line 1", "value": 1}\n'


def test_an_output_file_that_is_not_a_job_output_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "notes.txt"
    out.write_text("my notes\n")
    with pytest.raises(JobConfigError, match="not a line of a structspec job"):
        check_output(out)
    assert out.read_text() == "my notes\n"


def test_an_unusable_schema_or_option_stops_the_job_before_any_record(byte_lm: structspec.LM,
                                                                        tmp_path: Path) -> None:
    records = [InputRecord("a", "line 1", "x"), InputRecord("b", "line 2", error=("malformed_input", "x"))]
    bad = structspec.Regex("[0-9")
    with pytest.raises(JobConfigError, match="invalid regex"):
        run_job(byte_lm, bad, records, tmp_path / "out.jsonl", OPTIONS)
    for options, message in [(JobOptions(OPTIONS.template, {"temperature": 0.0}), "temperature must be > 0"),
                             (JobOptions(OPTIONS.template, batch_size=0), "batch_size must be ≥ 1")]:
        with pytest.raises(JobConfigError, match=message):
            run_job(byte_lm, SCHEMA, records, tmp_path / "out.jsonl", options)
    assert not (tmp_path / "out.jsonl").exists()


class PickyBox(BaseModel):
    """A schema-valid value can still fail the model's own validator."""

    flag: bool
    size: Literal["small", "medium", "large"]

    @field_validator("flag")
    @classmethod
    def refuse(cls, flag: bool) -> bool:
        raise ValueError("no boxes today")


@pytest.mark.slow
def test_a_value_that_fails_validation_is_that_records_error(byte_lm: structspec.LM, tmp_path: Path) -> None:
    records = [InputRecord(f"r{i}", f"line {i}", f"Item {i}.") for i in range(3)]
    out = tmp_path / "out.jsonl"
    options = JobOptions(default_template(PickyBox), OPTIONS.generate, 2)
    summary = run_job(byte_lm, PickyBox, records, out, options)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert summary.written == 3 and summary.failed["invalid_output"] >= 1
    failed = next(r for r in rows if r.get("error", {}).get("kind") == "invalid_output")
    assert failed["error"]["message"].startswith("ValidationError: ") and "no boxes today" in failed["error"]["message"]
    assert failed["error"]["partial_text"].startswith("{")


def test_the_default_batch_size_follows_the_models_device(byte_lm: structspec.LM) -> None:
    assert default_batch_size(byte_lm) == DEFAULT_BATCH_SIZE[byte_lm.device.type]


@pytest.mark.slow
def test_draft_names_pass_through_and_unknown_draft_models_are_configuration_errors(byte_lm: structspec.LM,
                                                                                    tmp_path: Path) -> None:
    assert resolve_draft(None) is None and resolve_draft("none") is None
    assert resolve_draft("prompt_lookup") == "prompt_lookup"
    with pytest.raises(JobConfigError, match="--draft no-such-model"):
        resolve_draft("no-such-model")
    with pytest.raises(JobConfigError, match="not a torch device"):
        load_model("smollm2-135m", device="nonsense")
    records = [InputRecord("x", "line 1", 'Item 3 is {"flag":true,"size":"small"} here.')]
    drafted = _run(byte_lm, records, tmp_path / "drafted.jsonl",
                   JobOptions(OPTIONS.template, OPTIONS.generate | {"draft": "prompt_lookup"}))["x"]
    plain = _run(byte_lm, records, tmp_path / "plain.jsonl",
                 JobOptions(OPTIONS.template, OPTIONS.generate | {"draft": None}))["x"]
    assert drafted["value"] == plain["value"]  # verified greedy drafting keeps the output
    assert "prompt_lookup" in drafted["stats"]["drafts"] and "prompt_lookup" not in plain["stats"]["drafts"]
