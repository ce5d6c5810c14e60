"""`python -m lab.prefix_reuse`: both runs print, the second reuses prompt tokens, outputs
agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lab import prefix_reuse

pytestmark = [pytest.mark.slow, pytest.mark.real_model]  # two tickets on SmolLM2, three times


def _reused(out: str, run: str) -> int:
    row = re.search(rf"^\| structspec, {run} reuse \| [0-9.]+ \| [0-9.]+× \| ([0-9,]+) \|", out, re.M)
    assert row, out
    return int(row.group(1).replace(",", ""))


def test_reuse_is_reported_and_outputs_agree(smollm2, capsys: pytest.CaptureFixture[str]) -> None:
    model = Path(smollm2.model.config.name_or_path)
    assert prefix_reuse.main(["--model", str(model), "--part", "a", "--records", "2", "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    assert _reused(out, "without") == 0 and _reused(out, "with") > 0
    assert "token-identical with and without reuse: True (2 of 2 records)" in out
