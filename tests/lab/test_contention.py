"""`python -m lab.contention`: both settings run in processes of their own, alone and beside a
busy process, and the table names the model, dtype and threads (timings are the benchmark's, not asserted)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab import contention
from structspec.testing import save_tiny_model

pytestmark = pytest.mark.slow  # two child processes, each importing torch and loading a model


def test_the_table_has_each_setting_alone_and_busy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = save_tiny_model(tmp_path / "tiny")
    assert contention.main(["--model", str(model), "--records", "1", "--max-new-tokens", "4", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert f"; {model}, " in out and ", 1 threads, 1 records, " in out
    rows = re.findall(r"^\| (.+?) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)× \|$", out, re.M)
    assert [r[0] for r in rows] == list(contention.SETTINGS)
    for _, alone, busy, slowdown in rows:
        assert float(alone) > 0 and float(busy) > 0 and float(slowdown) > 0
