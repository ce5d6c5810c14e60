"""The GPU check runs end to end on the CPU in its tiny version: the packed pass grid, the decode turns against
their forwards, transformers' step, printed and written as JSON (the real run needs a lent GPU)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lab import gpucheck


def test_the_quick_check_measures_every_part_on_the_cpu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpucheck.main(["--device", "cpu", "--quick", "--json", str(tmp_path / "check.json")]) == 0
    out = capsys.readouterr().out
    assert "random tiny" in out and "ms/pass" in out and "transformers one-token step" in out
    (report,) = json.loads((tmp_path / "check.json").read_text())["reports"]
    assert [(p["rows"], p["fed_per_row"]) for p in report["passes"]] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert all(p["ms"] > 0 for p in report["passes"]) and report["passes"][0]["relative"] == 1.0
    assert [turn["rows"] for turn in report["decode"]] == [1, 2]
    for turn in report["decode"]:  # (differences of two decodes: on a tiny model, noise may make either small)
        assert turn["passes"] >= 1 and turn["prompt_tokens"] > 0 and turn["output_tokens"] > 0
        assert all(math.isfinite(turn[k]) for k in ("ms_per_pass", "forward_ms_per_pass", "outside_share"))
    assert report["transformers_step_ms"] > 0 and report["dtype"] == "float32" and report["device"] == "cpu"


def test_qwens_tokenizer_folder_is_the_repositorys() -> None:
    clone = Path(__file__).resolve().parents[2]  # (the module's own path decides it: a move must keep it)
    assert gpucheck.TOKENIZER == clone / "tests" / "data" / "qwen2.5-tokenizer" and gpucheck.TOKENIZER.is_dir()


@pytest.mark.slow  # reads a 151,665-token tokenizer: seconds
def test_qwens_tokenizer_is_read_from_the_repository_and_fits_both_shapes() -> None:
    tokenizer = gpucheck.qwen_tokenizer()  # no download: the GPU machine reaches nothing outside
    assert all(len(tokenizer) <= shape["vocab_size"] for shape in gpucheck.CONFIGS.values())
    assert tokenizer.encode("123", add_special_tokens=False) == [16, 17, 18]  # Qwen's digits, one token each
