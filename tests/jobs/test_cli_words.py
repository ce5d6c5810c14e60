"""A job from the command line speaks the CLI's words, once: an empty input refused before the model loads, a
budget error naming --max-new-tokens, a keyword structspec cannot enforce naming --no-strict (not the API's
strict=False), a misspelled keyword warned once, on one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.jobs.test_jobs import SCHEMA  # short outputs, so the tiny random model finishes records
from tests.jobs.test_jobs_repair import UNIQUE

import structspec
from structspec.testing import save_tiny_model
from structspec.tools import extract
from structspec.tools.cli import main
from structspec.tools.command import EXIT_CONFIG, EXIT_OK


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("words") / "model")


def _extract(model: Path, folder: Path, *options: str, input_name: str = "in.jsonl") -> int:
    return main(["extract", "--schema", str(folder / "schema.json"), "--input", str(folder / input_name),
                 "--output", str(folder / "out.jsonl"), "--model", str(model), "--device", "cpu", "--quiet",
                 "--draft", "none", *options])


def _job_files(folder: Path, schema: dict, texts: list[str]) -> None:
    (folder / "schema.json").write_text(json.dumps(schema))
    lines = [json.dumps({"id": f"r{i}", "text": text}) + "\n" for i, text in enumerate(texts)]
    (folder / "in.jsonl").write_text("".join(lines))


def _no_model(*args: object, **kwargs: object) -> None:
    raise AssertionError("the model loaded before the refusal")


@pytest.mark.parametrize("name, content, said", [
    ("in.jsonl", "", "no JSON lines"),
    ("in.jsonl", "\n\n", "no JSON lines"),
    ("in.csv", "id,text\n", "a header row and no rows"),
])
def test_an_empty_input_is_a_configuration_error_before_the_model_loads(
        model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        name: str, content: str, said: str) -> None:
    _job_files(tmp_path, SCHEMA, [])
    (tmp_path / name).write_text(content)
    monkeypatch.setattr(extract, "load_model", _no_model)
    assert _extract(model, tmp_path, input_name=name) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert f"--input {tmp_path / name} holds no records ({said})" in err and "no model was loaded" in err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.dtype
def test_a_budget_error_line_names_the_clis_option(model: Path, tmp_path: Path) -> None:
    _job_files(tmp_path, SCHEMA, ["Box 1 is small."])
    assert _extract(model, tmp_path, "--max-new-tokens", "2") == EXIT_OK
    [row] = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert row["error"]["kind"] == "token_budget"
    message = row["error"]["message"]
    assert "--max-new-tokens (2) ran out" in message and "--retry-errors" in message
    assert "max_new_tokens" not in message.replace("--max-new-tokens", "")


def test_an_unenforceable_keyword_names_strict_false_in_python_and_no_strict_in_the_cli(
        model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(structspec.SchemaError, match=r"'uniqueItems' at /properties/sizes: .*pass strict=False"):
        structspec.to_regex(UNIQUE)
    _job_files(tmp_path, UNIQUE, ["Sizes 1 and 2."])
    monkeypatch.setattr(extract, "load_model", _no_model)
    assert _extract(model, tmp_path) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.count("--no-strict") == 1 and "strict=False" not in err


@pytest.mark.dtype
def test_a_misspelled_keyword_warns_once_in_one_line(model: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    schema = {"type": "object", "properties": {"size": {"type": "string", "maxLenght": 3}}, "required": ["size"]}
    _job_files(tmp_path, schema, ["Box 1 is small."])
    assert _extract(model, tmp_path, "--max-new-tokens", "20") == EXIT_OK
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "maxLenght" in line]
    assert warned == [line for line in err.splitlines() if line.startswith("structspec extract: warning: ")]
    assert len(warned) == 1 and "did you mean 'maxLength'?" in warned[0]
    assert "UserWarning" not in err and "StructspecWarning" not in err and ".py:" not in err
    with pytest.warns(structspec.StructspecWarning, match="maxLenght"):  # in Python: a category of its own
        structspec.to_regex(schema)
