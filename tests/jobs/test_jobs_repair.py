"""Jobs a user can repair from the command line: a failed record run again with a bigger token budget, a schema
keyword relaxed with --no-strict, records without ids said so, a folder input that holds the output; error lines
dropped through a temp file of the job's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.jobs.test_jobs import OPTIONS, SCHEMA  # short outputs, so the tiny random model finishes records

import structspec
from structspec.jobs.errors import JobConfigError
from structspec.jobs.manifest import manifest_path
from structspec.jobs.lines import output_line
from structspec.jobs.output import done_keys
from structspec.jobs.records import InputRecord, read_inputs
from structspec.jobs.runner import run_job
from structspec.testing import save_tiny_model
from structspec.tools import extract
from structspec.tools.cli import main
from structspec.tools.command import EXIT_CONFIG, EXIT_OK


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("repair") / "model")


def _extract(model: Path, folder: Path, *options: str) -> int:
    return main(["extract", "--schema", str(folder / "schema.json"), "--input", str(folder / "in.jsonl"),
                 "--output", str(folder / "out.jsonl"), "--model", str(model), "--device", "cpu", "--quiet",
                 "--draft", "none", *options])


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _job_files(folder: Path, schema: dict, lines: list[str]) -> None:
    (folder / "schema.json").write_text(json.dumps(schema))
    (folder / "in.jsonl").write_text("".join(json.dumps({"id": f"r{i}", "text": text}) + "\n"
                                             for i, text in enumerate(lines)))


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model loaded before the refusal")


@pytest.mark.dtype
def test_retry_errors_with_a_bigger_budget_runs_the_records_the_budget_stopped(
        model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _job_files(tmp_path, SCHEMA, ["Box 1 is small.", "Box 2 is large."])
    assert _extract(model, tmp_path, "--max-new-tokens", "2") == EXIT_OK
    assert {row["error"]["kind"] for row in _rows(tmp_path / "out.jsonl")} == {"token_budget"}
    before = (tmp_path / "out.jsonl").read_bytes()
    capsys.readouterr()

    with monkeypatch.context() as m:  # refused before the model loads: the failed lines would change
        m.setattr(extract, "load_model", _no_model)
        assert _extract(model, tmp_path, "--max-new-tokens", "60") == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "token_budget 2" in err and "add --retry-errors" in err and "--max-new-tokens 60" in err
    assert (tmp_path / "out.jsonl").read_bytes() == before

    assert _extract(model, tmp_path, "--max-new-tokens", "60", "--retry-errors") == EXIT_OK
    rows = _rows(tmp_path / "out.jsonl")
    assert sorted(row["id"] for row in rows) == ["r0", "r1"] and all("value" in row for row in rows), rows
    manifest = json.loads(manifest_path(tmp_path / "out.jsonl").read_text())
    assert manifest["settings"]["options"]["max_new_tokens"] == 60

    # a smaller budget than a written record needed would change that line: refused, naming the budget it had
    capsys.readouterr()
    least = min(row["stats"]["output_tokens"] for row in rows)
    with monkeypatch.context() as m:
        m.setattr(extract, "load_model", _no_model)
        assert _extract(model, tmp_path, "--max-new-tokens", str(least - 1), "--retry-errors") == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "written with --max-new-tokens 60" in err and "extracted 2" in err
    # one that every written record fits in keeps them all: nothing runs again
    most = max(row["stats"]["output_tokens"] for row in rows)
    assert _extract(model, tmp_path, "--max-new-tokens", str(most)) == EXIT_OK
    assert _rows(tmp_path / "out.jsonl") == rows


def test_other_settings_are_still_refused_when_the_budget_changes_too(byte_lm: structspec.LM, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    records = read_inputs(_input(tmp_path, 1))
    run_job(byte_lm, SCHEMA, records, out, OPTIONS)
    other = type(OPTIONS)("Read: {document}", {"max_new_tokens": 60})
    with pytest.raises(JobConfigError, match="other settings.*the prompt template differs"):
        run_job(byte_lm, SCHEMA, records, out, other, retry_errors=True)


def _input(folder: Path, n: int) -> Path:
    path = folder / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"r{i}", "text": f"Box {i} is small."}) + "\n" for i in range(n)))
    return path


UNIQUE = {  # uniqueItems on an array of integers: a regex cannot enforce it
    "type": "object",
    "properties": {"sizes": {"type": "array", "items": {"type": "integer"}, "maxItems": 2, "uniqueItems": True}},
    "required": ["sizes"],
    "additionalProperties": False,
}


@pytest.mark.dtype
def test_no_strict_drops_a_keyword_and_each_line_lists_it(model: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    _job_files(tmp_path, UNIQUE, ["Sizes 1 and 2."])
    assert _extract(model, tmp_path, "--max-new-tokens", "30") == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "'uniqueItems' at /properties/sizes" in err and "pass --no-strict" in err
    assert not (tmp_path / "out.jsonl").exists()

    assert _extract(model, tmp_path, "--max-new-tokens", "30", "--no-strict") == EXIT_OK
    [row] = _rows(tmp_path / "out.jsonl")
    assert row["stats"]["not_enforced"] == ["'uniqueItems' at /properties/sizes"]
    capsys.readouterr()
    assert _extract(model, tmp_path, "--max-new-tokens", "30") == EXIT_CONFIG  # a strict rerun is another job


@pytest.mark.dtype
def test_records_without_ids_are_said_to_be_named_by_their_row(model: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "in.csv").write_text("text\nBox 1 is small.\nBox 2 is large.\n")
    code = main(["extract", "--schema", str(tmp_path / "schema.json"), "--input", str(tmp_path / "in.csv"),
                 "--output", str(tmp_path / "out.jsonl"), "--model", str(model), "--device", "cpu", "--quiet",
                 "--max-new-tokens", "30"])
    err = capsys.readouterr().err
    assert code == EXIT_OK
    assert "2 of 2 records have no 'id'" in err and '"<row 2>"' in err and "--id-field" in err
    assert sorted(row["id"] for row in _rows(tmp_path / "out.jsonl")) == ["<row 2>", "<row 3>"]


def test_a_folder_input_never_reads_the_jobs_own_output(byte_lm: structspec.LM, tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"doc{i}.txt").write_text(f"Box {i} is small.")
    out = tmp_path / "out.txt"  # inside the input folder, named as its documents are
    assert run_job(byte_lm, SCHEMA, read_inputs(tmp_path), out, OPTIONS).written == 3
    records = read_inputs(tmp_path)
    assert [r.where for r in records] == ["doc0.txt", "doc1.txt", "doc2.txt"]
    summary = run_job(byte_lm, SCHEMA, records, out, OPTIONS)
    assert (summary.skipped, summary.written) == (3, 0) and len(_rows(out)) == 3


@pytest.mark.dtype
def test_the_manifest_of_the_output_is_refused_as_input(model: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    _job_files(tmp_path, SCHEMA, ["Box 1 is small."])
    assert _extract(model, tmp_path, "--max-new-tokens", "30") == EXIT_OK
    capsys.readouterr()
    code = main(["extract", "--schema", str(tmp_path / "schema.json"), "--input",
                 str(manifest_path(tmp_path / "out.jsonl")), "--output", str(tmp_path / "out.jsonl"),
                 "--model", str(model), "--device", "cpu", "--quiet", "--text-field", "structspec_job"])
    assert code == EXIT_CONFIG and "is the manifest of --output" in capsys.readouterr().err


def test_dropping_error_lines_rewrites_the_output_through_a_temp_file_of_its_own(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    bad = InputRecord("a", "line 1", error=("malformed_input", "line 1: not JSON"))
    out.write_text(json.dumps(output_line(bad, None, 8)) + "\n")
    out.chmod(0o640)
    (tmp_path / "out.jsonl.tmp").mkdir()  # the fixed name the rewrite used: another writer's, left alone
    assert done_keys(out, retry_errors=True) == set()  # the error line dropped: the record runs again
    assert out.read_bytes() == b"" and out.stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl", "out.jsonl.tmp"]
