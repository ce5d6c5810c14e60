"""`load` is quiet by default: no transformers progress bars, logging or warnings unless ``verbose=True``, and
transformers' own settings are as the caller left them afterwards."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from transformers.utils import logging

import structspec
from structspec.models.loading import quiet_loading
from structspec.testing import save_tiny_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def chatty_transformers() -> Iterator[None]:
    """transformers at INFO with progress bars on (it prints a line per file it loads), restored after."""
    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_info()
    logging.enable_progress_bar()
    yield
    logging.set_verbosity(verbosity)
    (logging.enable_progress_bar if bars else logging.disable_progress_bar)()


@pytest.mark.dtype
def test_load_prints_nothing_and_restores_transformers_settings(
    model_dir: Path, chatty_transformers: None, capfd: pytest.CaptureFixture[str]
) -> None:
    structspec.load(str(model_dir), kernels="torch")
    assert capfd.readouterr().err == ""
    assert logging.get_verbosity() == logging.INFO
    assert logging.is_progress_bar_enabled()


@pytest.mark.dtype
def test_verbose_shows_what_transformers_says(model_dir: Path, capfd: pytest.CaptureFixture[str]) -> None:
    structspec.load(str(model_dir), kernels="torch", verbose=True)
    assert "Loading weights" in capfd.readouterr().err


def test_quiet_loading_ignores_warnings_in_the_block_only() -> None:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_loading():
            warnings.warn("inside", FutureWarning, stacklevel=1)
        warnings.warn("outside", FutureWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["outside"]


@pytest.mark.real_model
def test_a_cached_shipped_model_loads_in_silence(smollm2: structspec.LM) -> None:
    """A new process loading the (already converted) default model writes nothing to stderr: no GGUF message,
    no progress bar, no warning; and the cached config keeps no quantization_config."""
    converted = Path(smollm2.model.config.name_or_path)  # <STRUCTSPEC_CACHE>/models/smollm2-135m
    env = {**os.environ, "STRUCTSPEC_CACHE": str(converted.parents[1]), "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", "import structspec; structspec.load('smollm2-135m')"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert "quantization_config" not in json.loads((converted / "config.json").read_text())


# What transformers, torch or Ray print when they are not silenced (any case): progress bars, GGUF notes,
# deprecation warnings, Ray's worker log lines.
NOISE = ("loading weights", "warning", "deprecat", "gguf", "quantization", "it/s]", "core_worker", "%|")


@pytest.mark.real_model
@pytest.mark.parametrize("command", ["demo", "extract"])
def test_the_cli_writes_no_library_noise_to_stderr(smollm2: structspec.LM, tmp_path: Path, command: str) -> None:
    """`structspec demo` and `structspec extract` on the cached default model: stderr holds structspec's own lines
    (the job summary) and nothing that transformers, torch or Ray print by default."""
    converted = Path(smollm2.model.config.name_or_path)
    # a cache of the run's own that reaches the converted model: what the run stores (compiled automata)
    # stays out of the developer's cache
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "models").symlink_to(converted.parent, target_is_directory=True)
    env = {**os.environ, "STRUCTSPEC_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "structspec", command, "--threads", "1"]
    if command == "demo":
        argv.append("--no-explain")
    else:
        (tmp_path / "in.jsonl").write_text(json.dumps({"id": 1, "text": "Ada Lovelace, 36, London."}) + "\n")
        (tmp_path / "schema.json").write_text(json.dumps(
            {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}))
        argv += ["--max-new-tokens", "48", "--schema", str(tmp_path / "schema.json"),
                 "--input", str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out.jsonl")]
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert not [line for line in run.stderr.lower().splitlines() if any(n in line for n in NOISE)], run.stderr
    if command == "extract":
        assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 1
