"""The shared harness and the savings report on a tiny random model: runs, judging, summaries, the table, and
the written PNG/HTML/JSON."""

from __future__ import annotations

import argparse
import io
import json
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel
from rich.console import Console

import structspec
from structspec.jobs.errors import JobConfigError
from structspec.testing import save_tiny_model
from structspec.tools.benchmarks import compare, harness
from structspec.tools.cli import main, parser
from structspec.tools.benchmarks.harness import Run
from structspec.tools.tasks import Task


class Box(BaseModel):
    flag: bool
    size: Literal["small", "medium", "large"]


TASKS = [
    Task("box-1", "box", Box, "Item 1 is a small box.", {"flag": True, "size": "small"}),
    Task("box-2", "box", Box, "Item 2 is a large box.", None),
]


@pytest.fixture(scope="module")
def by_method(byte_lm: structspec.LM) -> dict[str, list[Run]]:
    return harness.run_tasks(byte_lm, TASKS, compare.rows(batch_size=2), 24, Console(file=io.StringIO()))


def test_every_method_runs_every_task_with_the_unconstrained_peer_first(by_method: dict[str, list[Run]]) -> None:
    assert list(by_method) == ["unconstrained", "plain masked", "fast-forward", "+ prompt lookup",
                               "plain masked, batch 2", "fast-forward, batch 2",
                               "fast-forward + prompt lookup, batch 2"]
    assert all([r.task_id for r in runs] == ["box-1", "box-2"] for runs in by_method.values())
    assert all(r.sources == ["model"] * len(r.token_ids) for r in by_method["unconstrained"])
    assert list(compare.rows()) == list(by_method)[:4]  # batch size 1: no batched rows


def test_batched_rows_keep_each_records_tokens(by_method: dict[str, list[Run]]) -> None:
    for label in ["plain masked", "fast-forward", "+ prompt lookup"]:
        alone = by_method[label]
        together = by_method[f"{'fast-forward ' if label.startswith('+') else ''}{label}, batch 2"]
        assert [r.token_ids for r in together] == [r.token_ids for r in alone]
        assert [r.sources for r in together] == [r.sources for r in alone]
        assert all(r.seconds > 0 for r in together)


def test_fast_forward_saves_passes_and_keeps_plain_masked_tokens(by_method: dict[str, list[Run]]) -> None:
    for plain, fast, lookup in zip(by_method["plain masked"], by_method["fast-forward"], by_method["+ prompt lookup"]):
        assert fast.token_ids == plain.token_ids == lookup.token_ids  # greedy speed-ups keep the tokens
        assert fast.forward_passes == plain.forward_passes - fast.sources.count("forced") < plain.forward_passes
        assert plain.schema_valid and plain.valid_json


def test_summary_and_table_read_from_the_runs(by_method: dict[str, list[Run]]) -> None:
    summaries = [harness.summarize(runs) for runs in by_method.values()]
    fast = summaries[2]
    assert fast.forward_passes == sum(r.forward_passes for r in by_method["fast-forward"])
    assert fast.no_pass_tokens == sum(r.sources.count("forced") for r in by_method["fast-forward"])
    assert fast.schema_valid == 1.0 and fast.accuracy == by_method["fast-forward"][0].accuracy
    rows = compare.table_rows(summaries)
    assert [row[0] for row in rows] == list(by_method)
    assert rows[0][8] == "finished none" and summaries[0].unfinished == 2  # a random model's text never ends
    assert compare.table_rows(summaries[1:3])[0][8] == "×1.00"  # against plain masked, which finished
    assert len(rows[0]) == len(compare.HEADERS) and compare.HEADERS[6] == "records/s"
    assert compare.HEADERS[7] == "s / valid\nrecord" and rows[2][7] == f"{fast.seconds / 2:.3g}"  # both valid
    assert all(s.records == 2 and s.records_per_second == 2 / s.seconds for s in summaries)


def test_judging_reads_json_as_a_user_would() -> None:
    task = TASKS[0]
    fenced = harness.judge(task, '```json\n{"flag": true, "size": "small"}\n```')
    assert fenced.valid_json and fenced.schema_valid and fenced.accuracy == 1.0
    partial = harness.judge(task, '{"flag": true}')
    assert partial.valid_json and not partial.schema_valid and partial.accuracy == 0.5
    prose = harness.judge(task, "Sure! Here it is: {")
    assert not prose.valid_json and prose.accuracy == 0.0
    assert harness.judge(TASKS[1], "[]").accuracy is None


@pytest.mark.slow
def test_the_report_files_hold_the_table_chart_and_token_views(by_method: dict[str, list[Run]],
                                                               byte_lm: structspec.LM, tmp_path: Path) -> None:
    png, page, raw = compare.write_report(tmp_path, "title", "a note", TASKS, by_method, byte_lm)
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    text = page.read_text()
    assert text.count('<div class="tokens">') == len(TASKS) * len(by_method)
    assert "data:image/png;base64," in text and "a note" in text and "box-2" in text
    assert all(f"<h4>{name} " in text for name in by_method)
    data = json.loads(raw.read_text())
    assert len(data["runs"]) == len(TASKS) * len(by_method) and data["summaries"][0]["method"] == "unconstrained"


@pytest.mark.slow
def test_a_method_that_finished_nothing_is_flagged_not_given_a_speed(by_method: dict[str, list[Run]],
                                                                     byte_lm: structspec.LM, tmp_path: Path) -> None:
    summaries = [harness.summarize(runs) for runs in by_method.values()]
    stuck = replace(summaries[3], unfinished=summaries[3].records, schema_valid=0.0)
    rows = compare.table_rows([summaries[0], stuck])
    assert rows[1][8] == "finished none" and rows[1][7] == "—"  # no tokens/s ratio, no seconds per valid record
    baseline_stuck = compare.table_rows([replace(summaries[0], unfinished=2), summaries[2]])
    assert baseline_stuck[1][8] == "— (unconstrained finished none)"
    invalid = replace(summaries[2], schema_valid=0.0)
    assert compare.flag(invalid) == "none valid" and compare.seconds_per_valid_record(invalid) is None
    stuck_runs = {label: [replace(r, finished=False) for r in runs] if label == "+ prompt lookup" else runs
                  for label, runs in by_method.items()}
    _, _, raw = compare.write_report(tmp_path, "title", "a note", TASKS, stuck_runs, byte_lm)
    flags = {s["method"]: (s["flag"], s["seconds_per_valid_record"]) for s in json.loads(raw.read_text())["summaries"]}
    assert flags["+ prompt lookup"][0] == "finished none" and flags["fast-forward"][0] is None
    assert flags["fast-forward"][1] > 0


def _args(*argv: str) -> argparse.Namespace:
    return parser("compare").parse_args(["compare", *argv])


def _box_schema(folder: Path) -> str:
    (folder / "box.py").write_text("from typing import Literal\nfrom pydantic import BaseModel\n\n\n"
                                   "class Box(BaseModel):\n    flag: bool\n    size: Literal['small', 'medium', "
                                   "'large']\n")
    return f"{folder / 'box.py'}:Box"


def test_compare_input_takes_each_records_expected_values_from_a_field(tmp_path: Path) -> None:
    spec = _box_schema(tmp_path)
    (tmp_path / "docs.jsonl").write_text(
        '{"id": "a", "text": "A small box.", "gold": {"flag": true, "size": "small"}}\n'
        '{"id": "b", "text": "A box."}\n')
    (tmp_path / "docs.csv").write_text('id,text,gold\nc,A large box.,"{""size"": ""large""}"\nd,A box.,\n')
    loaded = compare.load_compare_tasks(_args("--schema", spec, "--input", str(tmp_path / "docs.jsonl"),
                                              "--expected-field", "gold"))
    assert [(t.id, t.expected) for t in loaded] == [("a", {"flag": True, "size": "small"}), ("b", None)]
    loaded = compare.load_compare_tasks(_args("--schema", spec, "--input", str(tmp_path / "docs.csv"),
                                              "--expected-field", "gold"))
    assert [(t.id, t.expected) for t in loaded] == [("c", {"size": "large"}), ("d", None)]

    (tmp_path / "bad.jsonl").write_text('{"id": "e", "text": "A box.", "gold": "small"}\n')
    for argv, message in [
        (["--input", str(tmp_path / "docs.jsonl"), "--expected-field", "expected"], "no record of --input"),
        (["--input", str(tmp_path / "bad.jsonl"), "--expected-field", "gold"], "gold' of line 1 is not a JSON object"),
        (["--input", str(tmp_path), "--expected-field", "gold"], "a folder of .txt files"),
    ]:
        with pytest.raises(JobConfigError, match=message):
            compare.load_compare_tasks(_args("--schema", spec, *argv))
    with pytest.raises(JobConfigError, match="--expected-field names a field of --input records"):
        compare.load_compare_tasks(_args("--expected-field", "gold"))


def test_a_prompt_template_is_every_methods_prompt(byte_lm: structspec.LM, monkeypatch: pytest.MonkeyPatch) -> None:
    template = "Box facts as JSON.\n{document}\nJSON:"
    seen: list[str] = []

    def record(prompt: str | list[dict[str, str]]) -> None:
        seen.append(prompt if isinstance(prompt, str) else prompt[0]["content"])

    generate_result, generate_batch = structspec.generate_result, structspec.generate_batch
    encode = byte_lm.encode_prompt
    monkeypatch.setattr(structspec, "generate_result",
                        lambda lm, spec, prompt, **kw: record(prompt) or generate_result(lm, spec, prompt, **kw))
    monkeypatch.setattr(structspec, "generate_batch",
                        lambda lm, specs, prompts, **kw: [record(p) for p in prompts] and
                        generate_batch(lm, specs, prompts, **kw))
    monkeypatch.setattr(byte_lm, "encode_prompt", lambda prompt: record(prompt) or encode(prompt))  # the peer's
    harness.run_tasks(byte_lm, TASKS, compare.rows(batch_size=2), 8, Console(file=io.StringIO()), template)
    counts = Counter(text for text in seen if text != "warm-up")
    # each task's prompt reached the peer, every structspec method and the batched rows (which encode it again
    # inside), and no other prompt reached the model
    assert set(counts) == {template.replace("{document}", task.text) for task in TASKS}
    assert min(counts.values()) >= 1 + 2 * len(harness.methods())


@pytest.mark.slow
def test_compare_on_ones_own_documents_scores_them_with_ones_own_prompt(tmp_path: Path) -> None:
    spec = _box_schema(tmp_path)
    (tmp_path / "docs.jsonl").write_text("".join(
        json.dumps({"id": f"d{i}", "text": f"Item {i} is a small box.", "gold": {"size": "small"}}) + "\n"
        for i in range(2)))
    (tmp_path / "prompt.txt").write_text("Box facts as JSON.\n{document}\nJSON:")
    code = main(["compare", "--schema", spec, "--input", str(tmp_path / "docs.jsonl"), "--expected-field", "gold",
                 "--prompt-template", str(tmp_path / "prompt.txt"), "--model", str(save_tiny_model(tmp_path / "m")),
                 "--device", "cpu", "--max-new-tokens", "12", "--quiet", "--out", str(tmp_path / "report")])
    assert code == 0
    report = json.loads((tmp_path / "report" / "compare.json").read_text())
    assert all(s["accuracy"] is not None for s in report["summaries"])
    assert "prompt.txt" in (tmp_path / "report" / "compare.html").read_text()
