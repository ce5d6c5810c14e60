"""``extract --engine``: the choice checked by argparse, ``--engine vllm`` refused with the install line where vLLM
is missing and with the fix for options it cannot honour, all before any model loads; the engine-agnostic job
(`run_lines`) writes, resumes and records its engine in the manifest. vLLM itself runs in
tests/integrations/test_vllm_extract.py."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import structspec
from structspec.jobs.errors import JobConfigError
from structspec.jobs.lines import output_line
from structspec.jobs.manifest import check_settings, job_manifest
from structspec.jobs.records import InputRecord, read_inputs
from structspec.jobs.runner import run_lines
from structspec.tools import extract
from structspec.tools.cli import main, parser
from structspec.tools.command import EXIT_CONFIG

SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}


@pytest.fixture()
def job(tmp_path: Path) -> list[str]:
    """An extract command line (a schema, two records, an output), without ``--engine``."""
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "Ada"}\n{"id": "b", "text": "Bo"}\n')
    return ["extract", "--schema", str(tmp_path / "s.json"), "--input", str(tmp_path / "in.jsonl"),
            "--output", str(tmp_path / "out.jsonl")]


@pytest.fixture()
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """`structspec.load` fails the test if called: what is checked must be checked before a model loads."""
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the error was found")

    monkeypatch.setattr(structspec, "load", load)


def _vllm_installed(monkeypatch: pytest.MonkeyPatch, installed: bool) -> None:
    """Make ``find_spec("vllm")`` say vLLM is (not) installed, whatever this venv holds."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: (
        (real("json") if installed else None) if name == "vllm" else real(name, *args)))


def test_engine_defaults_to_structspec_and_refuses_other_names(job: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert parser("extract").parse_args(job).engine == "structspec"
    with pytest.raises(SystemExit) as exit_:
        main([*job, "--engine", "nonsense"])
    assert exit_.value.code == 2
    assert "argument --engine: invalid choice: 'nonsense'" in capsys.readouterr().err


def test_engine_vllm_without_vllm_exits_2_naming_the_install(job: list[str], tmp_path: Path, no_load: None,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    _vllm_installed(monkeypatch, False)
    assert main([*job, "--engine", "vllm"]) == EXIT_CONFIG
    err = " ".join(capsys.readouterr().err.split())
    assert "--engine vllm needs vLLM, which is not installed here" in err
    assert "pip install './structspec[vllm]'" in err and ".ci/vllm-check" in err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("option, fix", [
    (["--draft-model", "smollm2-135m"], "--engine vllm does not take --draft-model"),
    (["--no-strict"], "--engine vllm does not take --no-strict"),
])
def test_engine_vllm_refuses_options_it_cannot_honour(job: list[str], option: list[str], fix: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _vllm_installed(monkeypatch, True)
    with pytest.raises(JobConfigError, match=fix):
        extract.check_vllm_options(parser("extract").parse_args([*job, "--engine", "vllm", *option]))


def test_engine_vllm_takes_ray(job: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _vllm_installed(monkeypatch, True)  # (tests/integrations/test_vllm_ray.py runs such a job)
    extract.check_vllm_options(parser("extract").parse_args([*job, "--engine", "vllm", "--ray", "local"]))


def test_run_lines_writes_what_the_engine_yields_and_resumes(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "Ada"}\n{"id": "b"}\n{"id": "c", "text": "Cy"}\n')
    records, output = read_inputs(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    seen: list[list[str]] = []

    def lines(todo: list[InputRecord]) -> Iterator[dict[str, Any]]:
        seen.append([r.id for r in todo])
        for record in todo:
            yield output_line(record, None, 10) if record.error else \
                {"id": record.id, "input": record.where, "input_hash": record.input_hash, "value": record.text}

    manifest = job_manifest("m", SCHEMA, "{document}", {}, "vllm")
    summary = run_lines(output, manifest, records, lines)
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(r["id"], r.get("value"), r.get("error", {}).get("kind")) for r in rows] == [
        ("a", "Ada", None), ("b", None, "malformed_input"), ("c", "Cy", None)]
    assert (summary.ok, dict(summary.failed)) == (2, {"malformed_input": 1})
    again = run_lines(output, manifest, records, lines)
    assert seen == [["a", "b", "c"], []] and again.skipped == 3
    assert len(output.read_text().splitlines()) == 3


def test_the_engine_is_a_setting_of_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "Ada"}\n')
    output = tmp_path / "out.jsonl"
    on_vllm = job_manifest("m", SCHEMA, "{document}", {}, "vllm")
    assert on_vllm["settings"]["engine"] == "vllm"
    assert "engine" not in job_manifest("m", SCHEMA, "{document}", {})["settings"]  # as before engines existed
    run_lines(output, on_vllm, read_inputs(tmp_path / "in.jsonl"),
              lambda todo: ({"id": r.id, "input": r.where, "input_hash": r.input_hash, "value": 1} for r in todo))
    assert check_settings(output, on_vllm) is False
    with pytest.raises(JobConfigError, match="engine"):
        check_settings(output, job_manifest("m", SCHEMA, "{document}", {}))
