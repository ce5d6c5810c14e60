"""The throughput benchmark end to end on a tiny random model saved as a model directory: every row, pass counts,
the identity column, the JSON, the bf16 agreement mode, and bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import structspec
from structspec.models.device import native_bf16
from structspec.tools import throughput
from structspec.tools.harness import PLAIN, methods
from structspec.tools.throughput_report import Output, identity


@pytest.fixture(scope="module")
def model_dir(byte_lm: structspec.LM, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny-model")
    byte_lm.model.save_pretrained(path)
    byte_lm.tokenizer.save_pretrained(path)
    return str(path)


def _run(model_dir: str, tmp_path: Path, *options: str) -> dict:
    out = tmp_path / "throughput.json"
    code = throughput.main(["--model", model_dir, "--device", "cpu", "--records", "4", "--batch-sizes", "2",
                            "--peer-batch-size", "2", "--max-new-tokens", "12", "--json", str(out), *options])
    assert code == 0
    return json.loads(out.read_text())


@pytest.mark.slow
def test_every_row_runs_with_passes_and_greedy_rows_identical_to_plain_masked_at_batch_1(
        model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _run(model_dir, tmp_path)
    printed = capsys.readouterr().out
    rows = {(r["method"], r["batch_size"]): r for r in raw["rows"]}
    structspec_rows = [(m, b) for b in (1, 2) for m in methods()]  # B=1 runs though only 2 was asked for
    peers = [(throughput.OUTLINES, 2), (throughput.OUTLINES_MIXED, 2), (throughput.UNCONSTRAINED, 2)]
    assert list(rows) == structspec_rows + peers
    assert raw["dtype"] == ("bfloat16" if native_bf16() else "float32")
    assert raw["max_new_tokens"] == 12 and raw["memory"]
    for key, row in rows.items():
        assert row["model_calls"] > 0 and row["seconds"] > 0 and row["peak_memory_mib"] > 0, key
        assert len(row["outputs"]) == 4 and all(o["row_passes"] > 0 for o in row["outputs"]), key
        assert row["passes_per_token"] > 0 and row["records_per_second"] > 0, key
        assert key[0] in printed
    for key in structspec_rows:  # greedy speed-ups and batching keep plain masked decoding's tokens
        assert rows[key]["identity"] == {"identical": 4, "records": 4, "divergences": []}, key
    assert rows[(throughput.UNCONSTRAINED, 2)]["identity"] is None
    assert rows[("fast-forward", 2)]["passes_per_token"] < rows[(PLAIN, 1)]["passes_per_token"]
    assert rows[(PLAIN, 2)]["model_calls"] < rows[(PLAIN, 1)]["model_calls"]  # rows share passes
    assert "×1.00" in printed and "4/4" in printed  # the B=1 prompt lookup ratio; the identity column


@pytest.mark.slow
def test_bf16_agreement_compares_every_record_with_its_float32_decode(
        model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _run(model_dir, tmp_path, "--bf16-agreement")
    assert raw["records"] == 4 and raw["batch_size"] == 2
    assert raw["identical"] + len(raw["divergences"]) == 4
    for d in raw["divergences"]:
        assert d["position"] >= 0 and d["margin"] >= 0
    assert "bf16 agreement" in capsys.readouterr().out


def test_identity_counts_identical_records_and_first_divergences() -> None:
    def out(task_id: str, ids: list[int]) -> Output:
        return Output(task_id, ids, "", True, len(ids))

    reference = [out("a", [1, 2, 3]), out("b", [4, 5]), out("c", [6])]
    same = identity([out("a", [1, 2, 3]), out("b", [4, 9]), out("c", [6, 7])], reference)
    assert (same.identical, same.records, same.divergences) == (1, 3, [("b", 1), ("c", 1)])


def test_bad_batch_sizes_and_unknown_models_exit_with_a_configuration_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert throughput.main(["--batch-sizes", "1,0"]) == 2
    assert "batch sizes must be whole numbers ≥ 1" in capsys.readouterr().err
    assert throughput.main(["--model", "no-such-model", "--records", "1"]) == 2
    assert "unknown model" in capsys.readouterr().err
