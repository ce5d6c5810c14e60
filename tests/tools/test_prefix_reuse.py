"""`python -m structspec.tools.prefix_reuse`: both runs print, the second reuses prompt tokens, outputs agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from structspec.testing import save_tiny_model
from structspec.tools import prefix_reuse

pytestmark = pytest.mark.slow  # six records on a tiny model, twice


def test_reuse_is_reported_and_outputs_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = save_tiny_model(tmp_path / "tiny")
    assert prefix_reuse.main(["--model", str(model), "--max-new-tokens", "8"]) == 0
    out = capsys.readouterr().out
    without = re.search(r"^without reuse: [0-9.]+ s / record, (\d+) prompt tokens reused$", out, re.M)
    with_ = re.search(r"^with reuse: [0-9.]+ s / record, (\d+) prompt tokens reused$", out, re.M)
    assert without and with_ and int(without.group(1)) == 0 and int(with_.group(1)) > 0
    assert out.rstrip().endswith("token-identical: True")
