"""The throughput benchmark end to end on a tiny random model saved as a model directory: every row (lookahead and
the default among them), pass counts, B = 1 on fewer records, the identity column, the ratios, peers at several
batch sizes, several dtypes, the JSON, the bf16 agreement mode, and bad options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import structspec
from structspec.models.device import native_bf16
from structspec.options import GenerateOptions
from structspec.tools.benchmarks import throughput
from structspec.tools.benchmarks.harness import PLAIN
from structspec.tools.benchmarks.throughput_report import (
    DEFAULT,
    LOOKAHEAD,
    LOOKUP,
    OUTLINES,
    OUTLINES_MIXED,
    PEERS,
    UNCONSTRAINED,
    Measured,
    Output,
    Report,
    identity,
    method_label,
)

DEFAULT_DTYPE = "bfloat16" if native_bf16() else "float32"


@pytest.fixture(scope="module")
def model_dir(byte_lm: structspec.LM, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("tiny-model")
    byte_lm.model.save_pretrained(path)
    byte_lm.tokenizer.save_pretrained(path)
    return str(path)


def _run(model_dir: str, tmp_path: Path, *options: str) -> dict:
    out = tmp_path / "throughput.json"
    code = throughput.main(["--model", model_dir, "--device", "cpu", "--json", str(out), *options])
    assert code == 0
    return json.loads(out.read_text())


def _check_ratios(raw: dict) -> None:
    """Every row's ratios, recomputed from the JSON's raw numbers."""
    rows = {(r["method"], r["batch_size"]): r for r in raw["rows"]}
    outlines = max((r for r in raw["rows"] if r["method"] in (OUTLINES, OUTLINES_MIXED)),
                   key=lambda r: r["records_per_second"])
    unconstrained = max((r for r in raw["rows"] if r["method"] == UNCONSTRAINED),
                        key=lambda r: r["tokens_per_second"])
    assert raw["best_outlines"] == {"method": outlines["method"], "batch_size": outlines["batch_size"]}
    assert raw["best_unconstrained"] == {"method": UNCONSTRAINED, "batch_size": unconstrained["batch_size"]}
    for (method, b), row in rows.items():
        assert row["records_per_second"] == pytest.approx(len(row["outputs"]) / row["seconds"])
        assert row["tokens_per_second"] == pytest.approx(row["output_tokens"] / row["seconds"])
        rate, ratios = row["records_per_second"], row["ratios"]
        own, plain = rows.get((method, 1)), rows.get((PLAIN, b))
        assert ratios["own_b1"] == (None if own is None else pytest.approx(rate / own["records_per_second"]))
        assert ratios["plain_same_b"] == (None if plain is None else pytest.approx(rate / plain["records_per_second"]))
        assert ratios["best_outlines"] == pytest.approx(rate / outlines["records_per_second"])
        tokens = row["tokens_per_second"]
        assert ratios["best_unconstrained"] == pytest.approx(tokens / unconstrained["tokens_per_second"])


@pytest.mark.slow
def test_every_row_runs_b1_on_fewer_records_and_peers_at_each_batch_size(
        model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _run(model_dir, tmp_path, "--records", "4", "--b1-records", "2", "--batch-sizes", "2",
               "--peer-batch-sizes", "4,2", "--max-new-tokens", "12")
    printed = capsys.readouterr().out
    rows = {(r["method"], r["batch_size"]): r for r in raw["rows"]}
    modes = [PLAIN, "fast-forward", LOOKUP, LOOKAHEAD]  # + prompt lookup decodes as the defaults: no "default" row
    structspec_rows = [(m, b) for b in (1, 2) for m in modes]  # B=1 runs though only 2 was asked for
    # 4 records of 4 schemas: outlines' batches per schema are the same at B=4 as at B=2, so run once
    assert list(rows) == structspec_rows + [(peer, 2) for peer in PEERS] + [(OUTLINES_MIXED, 4), (UNCONSTRAINED, 4)]
    assert f"{OUTLINES}, B=4: the same batches as a smaller B, not run again" in printed
    assert raw["default_method"] == LOOKUP and "+ prompt lookup (default)" in printed
    assert raw["dtype"] == raw["default_dtype"] == DEFAULT_DTYPE and f"resolved to {DEFAULT_DTYPE}" in printed
    assert raw["max_new_tokens"] == 12 and raw["memory"] and raw["records"] == 4
    assert raw["prefill_seconds"] > 0  # every record's prompt prefilled once, alone
    assert f"Prefill alone: {raw['prefill_seconds'] / 4:.3f} s a record" in " ".join(printed.split())
    task_ids = [o["task_id"] for o in rows[(PLAIN, 2)]["outputs"]]
    for key, row in rows.items():
        assert row["model_calls"] > 0 and row["seconds"] > 0 and row["peak_memory_mib"] > 0, key
        assert [o["task_id"] for o in row["outputs"]] == task_ids[:2 if key[1] == 1 else 4], key
        assert all(o["row_passes"] > 0 for o in row["outputs"]), key
        assert row["passes_per_token"] > 0, key
        assert key[0] in printed
    for m in modes:  # greedy speed-ups and batching keep plain masked decoding's tokens, on the records it decoded
        assert rows[(m, 1)]["identity"] == {"identical": 2, "records": 2, "of": 2, "divergences": []}, m
        assert rows[(m, 2)]["identity"] == {"identical": 2, "records": 2, "of": 4, "divergences": []}, m
    assert rows[(UNCONSTRAINED, 2)]["identity"] is None
    assert rows[("fast-forward", 2)]["passes_per_token"] < rows[(PLAIN, 1)]["passes_per_token"]
    assert rows[(PLAIN, 2)]["model_calls"] < rows[(PLAIN, 1)]["model_calls"] * 2  # rows share passes
    for peer in (OUTLINES_MIXED, UNCONSTRAINED):  # 4 records: two batches of 2, or one of 4
        assert rows[(peer, 4)]["model_calls"] < rows[(peer, 2)]["model_calls"], peer
    assert "2/2 (of 4)" in printed and "×1.00" in printed
    _check_ratios(raw)


@pytest.mark.slow
def test_several_dtypes_run_the_whole_matrix_each(model_dir: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    raw = _run(model_dir, tmp_path, "--records", "2", "--batch-sizes", "2", "--peer-batch-size", "2",
               "--max-new-tokens", "6", "--dtypes", "float32,bfloat16")
    printed = capsys.readouterr().out
    assert [r["dtype"] for r in raw["reports"]] == ["float32", "bfloat16"]
    for report in raw["reports"]:
        assert report["default_dtype"] == DEFAULT_DTYPE
        assert len(report["rows"]) == 2 * 4 + 3 and {r["batch_size"] for r in report["rows"]} == {1, 2}
        _check_ratios(report)
    assert printed.count(f"resolved to {DEFAULT_DTYPE}") == 2
    assert "Ran in float32" in printed and "Ran in bfloat16" in printed


def test_the_mode_that_decodes_as_the_defaults_is_the_default_row() -> None:
    rows, default = throughput.modes()
    assert list(rows) == [PLAIN, "fast-forward", LOOKUP, LOOKAHEAD]
    assert {k: getattr(GenerateOptions(), k) for k in rows[default]} == rows[default]
    assert throughput.modes(GenerateOptions(fast_forward="off", draft=None)) == (rows, PLAIN)
    assert throughput.modes(GenerateOptions(draft="auto")) == (rows | {DEFAULT: {}}, DEFAULT)


def _measured(method: str, b: int, seconds: float, tokens: int, records: int = 4) -> Measured:
    outputs = [Output(f"t{i}", [1] * tokens, "", True, tokens) for i in range(records)]
    return Measured(method, b, seconds, 1, 1.0, 0.0, outputs)


def test_ratios_take_the_own_b1_plain_same_b_and_fastest_peer_rows() -> None:
    report = Report("m", "cpu", "float32", "float32", 1, 10, 4, LOOKUP, "how", [
        _measured(PLAIN, 1, 4.0, 5, records=2), _measured(LOOKUP, 1, 2.0, 5, records=2),
        _measured(PLAIN, 8, 2.0, 5), _measured(LOOKUP, 8, 1.0, 5),
        _measured(OUTLINES, 8, 8.0, 5), _measured(OUTLINES_MIXED, 8, 4.0, 5), _measured(OUTLINES, 32, 5.0, 5),
        _measured(UNCONSTRAINED, 8, 2.0, 10), _measured(UNCONSTRAINED, 32, 1.0, 10)])
    lookup = report.ratios(report.rows[3])  # 4 records/s, 20 tokens/s
    assert (lookup.own_b1, lookup.plain_same_b, lookup.best_outlines, lookup.best_unconstrained) == (4.0, 2.0, 4.0, 0.5)
    assert report.ratios(report.rows[4]).own_b1 is None  # outlines did not run at B=1
    assert method_label(report, LOOKUP) == "+ prompt lookup (default)" and method_label(report, PLAIN) == PLAIN
    assert method_label(Report("m", "cpu", "float32", "float32", 1, 10, 4, DEFAULT, "how"), DEFAULT) == DEFAULT


@pytest.mark.slow
def test_bf16_agreement_compares_every_record_with_its_float32_decode(
        model_dir: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = _run(model_dir, tmp_path, "--records", "4", "--batch-sizes", "2", "--max-new-tokens", "12",
               "--bf16-agreement")
    assert raw["records"] == 4 and raw["batch_size"] == 2
    assert raw["identical"] + len(raw["divergences"]) == 4
    for d in raw["divergences"]:
        assert d["position"] >= 0 and d["margin"] >= 0
    assert "bf16 agreement" in capsys.readouterr().out


def test_identity_counts_identical_records_and_first_divergences_among_those_with_a_reference() -> None:
    def out(task_id: str, ids: list[int]) -> Output:
        return Output(task_id, ids, "", True, len(ids))

    reference = [out("a", [1, 2, 3]), out("b", [4, 5]), out("c", [6])]
    same = identity([out("a", [1, 2, 3]), out("b", [4, 9]), out("c", [6, 7])], reference)
    assert (same.identical, same.records, same.of, same.divergences) == (1, 3, 3, [("b", 1), ("c", 1)])
    fewer = identity([out("a", [1, 2, 3]), out("b", [4, 9]), out("c", [6]), out("d", [8])], reference[:2])
    assert (fewer.identical, fewer.records, fewer.of, fewer.divergences) == (1, 2, 4, [("b", 1)])


@pytest.mark.parametrize("options, message", [
    (["--batch-sizes", "1,0"], "batch sizes must be whole numbers ≥ 1 separated by commas, got --batch-sizes 1,0"),
    (["--peer-batch-sizes", "8,x"], "got --peer-batch-sizes 8,x"),
    (["--dtypes", "float32,fp8"], "dtype='fp8' is not one of float32, bfloat16, float16"),
    (["--dtypes", "float32,float32"], "--dtypes names a dtype twice"),
])
def test_bad_options_exit_2_before_a_model_loads(options: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the error was found")

    monkeypatch.setattr(structspec, "load", load)
    assert throughput.main(options) == 2
    assert message in " ".join(capsys.readouterr().err.split())  # rich wraps lines


def test_a_count_below_one_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        throughput.main(["--b1-records", "0"])
    assert exit_.value.code == 2 and "--b1-records: must be ≥ 1, got 0" in capsys.readouterr().err


def test_unknown_models_exit_with_a_configuration_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert throughput.main(["--model", "no-such-model", "--records", "1"]) == 2
    assert "unknown model" in capsys.readouterr().err
