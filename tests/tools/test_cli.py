"""`structspec extract` as users run it: a subprocess on a tiny random model, killed and resumed."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from rich.console import Console

import structspec
from structspec.tools.cli import main
from structspec.decoding import calibrate
from structspec.decoding.cost import curve_path, pass_cost
from structspec.tools.command import EXIT_BUSY, EXIT_CONFIG, EXIT_INTERRUPTED, EXIT_OK
from structspec.tools.demo import DEMO_DOCUMENT, demo
from structspec.jobs.runner import load_model
from structspec.models.device import default_dtype
from structspec.testing import save_tiny_model

N_RECORDS = 200  # enough work left after the third line that a signal always lands mid-job
SCHEMA = {
    "type": "object",
    "properties": {"flag": {"type": "boolean"}, "size": {"enum": ["small", "medium", "large"]}},
    "required": ["flag", "size"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A saved tiny model, a schema file, and an input with a malformed line (3) and an empty document (6)."""
    root = tmp_path_factory.mktemp("job")
    save_tiny_model(root / "model")
    (root / "schema.json").write_text(json.dumps(SCHEMA))
    lines = [json.dumps({"id": f"doc-{i}", "text": f"Item {i} is a {['small', 'large'][i % 2]} box."})
             for i in range(N_RECORDS)]
    lines[2] = '{"id": "broken", "text": '
    lines[5] = json.dumps({"id": "blank", "text": ""})
    (root / "input.jsonl").write_text("\n".join(lines) + "\n")
    return {"root": root, "model": root / "model", "schema": root / "schema.json", "input": root / "input.jsonl"}


def _command(job: dict[str, Path], output: Path, batch_size: int | None = None) -> list[str]:
    """The extract command line (``batch_size`` None: the default for the device, 8 on the CPU)."""
    return [sys.executable, "-m", "structspec.tools", "extract", "--schema", str(job["schema"]), "--input",
            str(job["input"]), "--output", str(output), "--model", str(job["model"]), "--max-new-tokens", "24",
            "--device", "cpu"] + ([] if batch_size is None else ["--batch-size", str(batch_size)])


def _env(job: dict[str, Path]) -> dict[str, str]:
    return os.environ | {"STRUCTSPEC_CACHE": str(job["root"] / "cache"), "OMP_NUM_THREADS": "1"}


def _ids(output: Path) -> Counter[str]:
    return Counter(json.loads(line)["id"] for line in output.read_text().splitlines())  # every line parses


def _expected_ids() -> Counter[str]:
    return Counter(["<line 3>", "blank"] + [f"doc-{i}" for i in range(N_RECORDS) if i not in (2, 5)])


def _interrupt_after_lines(job: dict[str, Path], output: Path, sig: int, lines: int = 3,
                           batch_size: int | None = None) -> int:
    """Start the job, send ``sig`` once ``output`` has ``lines`` lines, and return the exit code."""
    # A shell's background jobs start with SIGINT ignored, and Python then installs no Ctrl-C handler:
    # restore the default so the job sees SIGINT as a user's Ctrl-C, wherever the tests run.
    proc = subprocess.Popen(_command(job, output, batch_size), env=_env(job), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    while proc.poll() is None and (not output.exists() or output.read_text().count("\n") < lines):
        time.sleep(0.02)
    proc.send_signal(sig)
    proc.communicate(timeout=60)
    return proc.returncode


@pytest.mark.slow
def test_extract_reports_malformed_lines_and_completes(job: dict[str, Path], tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    done = subprocess.run(_command(job, output), env=_env(job), capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    rows = {json.loads(line)["id"]: json.loads(line) for line in output.read_text().splitlines()}
    assert _ids(output) == _expected_ids()
    assert rows["<line 3>"]["error"]["kind"] == "malformed_input" and "line 3" in rows["<line 3>"]["error"]["message"]
    assert rows["blank"]["error"]["kind"] == "empty_document" and rows["blank"]["input"] == "line 6"
    extracted = [r for r in rows.values() if "value" in r]
    assert extracted and all(set(r["value"]) == {"flag", "size"} and "stats" in r for r in extracted)
    summary = done.stderr.strip().splitlines()[-1]
    assert f"{N_RECORDS} records: {len(extracted)} extracted" in summary
    assert "empty_document 1" in summary and "malformed_input 1" in summary


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 8])
def test_resume_after_kill_9_writes_every_record_exactly_once(job: dict[str, Path], tmp_path: Path,
                                                              batch_size: int) -> None:
    output = tmp_path / "out.jsonl"
    assert _interrupt_after_lines(job, output, signal.SIGKILL, lines=12, batch_size=batch_size) == -signal.SIGKILL
    before = output.read_text()
    assert 12 <= before.count("\n") < N_RECORDS  # killed mid-job, rows of one batch finished
    done = subprocess.run(_command(job, output, batch_size), env=_env(job), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    assert output.read_text().startswith(before)  # what was written before the kill stays as it was
    assert _ids(output) == _expected_ids()


@pytest.mark.slow
def test_ctrl_c_exits_130_and_a_rerun_finishes_the_job(job: dict[str, Path], tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    assert _interrupt_after_lines(job, output, signal.SIGINT) == EXIT_INTERRUPTED
    assert output.read_text().count("\n") < N_RECORDS
    done = subprocess.run(_command(job, output), env=_env(job), capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_OK
    assert _ids(output) == _expected_ids()
    assert "already done" in done.stderr


@pytest.mark.slow
def test_a_configuration_error_exits_2_with_one_line(job: dict[str, Path], tmp_path: Path) -> None:
    command = _command(job, tmp_path / "out.jsonl")
    command[command.index("--schema") + 1] = "no_such_package.schemas:Invoice"
    done = subprocess.run(command, env=_env(job), capture_output=True, text=True, timeout=120)
    assert done.returncode == EXIT_CONFIG
    assert done.stderr.strip().splitlines() == [
        "structspec extract: cannot import 'no_such_package.schemas': No module named 'no_such_package'"]
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("option, value, message", [
    ("--input", "{tmp}/missing.jsonl", "cannot read the input"),
    ("--model", "no-such-model", "unknown model"),
    ("--prompt-template", "{tmp}/missing.txt", "cannot read the prompt template"),
])
def test_other_configuration_errors_exit_2(job: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           option: str, value: str, message: str) -> None:
    argv = _command(job, tmp_path / "out.jsonl")[3:] + [option, value.format(tmp=tmp_path)]  # the last one wins
    assert main(argv) == EXIT_CONFIG
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()


def test_help_documents_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["extract", "--help"])
    text = capsys.readouterr().out
    assert "exit codes:" in text and "130" in text and "malformed_input" in text and "too_long" in text
    assert "max_context" in text and "8 on the CPU, 32 on CUDA" in text and "--dtype" in text


@pytest.mark.parametrize("command", ["demo", "extract", "calibrate", "compare", "bench"])
def test_every_command_that_loads_a_model_takes_device_and_dtype(command: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "--device" in text and "{float32,bfloat16,float16}" in text
    assert "bfloat16 on CUDA and on CPUs with AVX-512 BF16" in " ".join(text.split())  # as wrapped


def test_a_device_that_is_not_there_is_a_configuration_error(job: dict[str, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_command(job, tmp_path / "out.jsonl")[3:] + ["--device", "nonsense"]) == EXIT_CONFIG
    assert "device='nonsense' is not a torch device" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists()
    assert load_model(str(job["model"]), "cpu", "bfloat16").model.dtype == torch.bfloat16


def test_fast_forward_is_off_or_exact(job: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(_command(job, tmp_path / "out.jsonl")[3:] + ["--fast-forward", "canonical"])
    assert exit_.value.code == 2 and "invalid choice: 'canonical'" in capsys.readouterr().err


def test_compare_with_an_unreadable_schemas_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--schemas", str(tmp_path / "missing.py")]) == EXIT_CONFIG
    assert "structspec compare: cannot load the tasks: no Python file" in capsys.readouterr().err


def test_calibrate_stores_the_curve_and_says_when_the_machine_was_busy(
        job: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    command = ["calibrate", "--model", str(job["model"]), "--device", "cpu", "--dtype", "float32"]
    monkeypatch.setattr(calibrate, "others_running", lambda: 1)  # another process spinning beside it
    assert main(command) == EXIT_BUSY
    captured = capsys.readouterr()
    assert "not stored: 1 thread(s) of other work" in captured.err and "--store-busy" in captured.err
    lm = structspec.load(str(job["model"]), "cpu", "float32")
    assert not curve_path(lm).exists()
    monkeypatch.setattr(calibrate, "others_running", lambda: 0)
    assert main(command) == EXIT_OK
    out = capsys.readouterr().out
    assert f"stored in {curve_path(lm)}" in out and re.search(r"\n\s+64\s+[0-9.]+\s+[0-9.]+\n", out)
    assert pass_cost(lm).points[-1][0] == 64  # what decoding with that model now reads


@pytest.mark.slow
def test_the_benchmark_is_a_subcommand_and_a_module() -> None:
    done = subprocess.run([sys.executable, "-m", "structspec.tools.benchmarks.bench", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == EXIT_OK, done.stderr
    assert "usage: structspec bench" in done.stdout
    assert all(option in done.stdout for option in ("--model", "--draft-model", "--limit", "--only",
                                                    "--max-new-tokens", "--threads"))


@pytest.mark.real_model
@pytest.mark.real_model  # its fixtures are asked for by name, so conftest cannot see them
@pytest.mark.parametrize("model", ["smollm2", "smollm2_bf16"])  # the default (float32 everywhere), and bfloat16
def test_demo_shows_the_object_stats_and_token_view(model: str, request: pytest.FixtureRequest,
                                                    tmp_path: Path) -> None:
    lm = request.getfixturevalue(model)
    assert model != "smollm2" or lm.dtype == default_dtype(torch.device("cpu"), "smollm2-135m")  # what users get
    console = Console(file=io.StringIO(), width=300)
    assert demo(lm, console, explain=True, html=str(tmp_path / "demo.html")) == EXIT_OK
    out = console.file.getvalue()
    facts = {"name": "Dr. Maria Okafor", "title": "Head of Research", "city": "Lagos",
             "email": "maria.okafor@brightlabs.io", "phone": "+234 801 555 0199", "start_day": "Monday"}
    assert all(value in DEMO_DOCUMENT for value in facts.values())
    assert all(f"{k}={v!r}" in out for k, v in facts.items())  # the object holds exactly the document's facts
    assert "target forward passes" in out and "use qwen2.5-coder-0.5b or your own model" in out
    assert "pass cost: " in out  # which curve the run drafts by
    assert "forced by the schema (no forward pass)" in out and "chosen by the target model" in out
    page = (tmp_path / "demo.html").read_text()
    tokens = page[page.index('<div class="tokens">'):]
    assert tokens.count("<span") > 50 and "Maria Okafor" in re.sub(r"<[^>]+>", "", tokens)
