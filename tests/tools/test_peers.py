"""The benchmark task set (loading, expected values, field accuracy), the peers, and the benchmark's report."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel
from rich.console import Console

import structspec
from structspec.jobs.errors import JobConfigError
from structspec.tools.tasks import Task, extraction_prompt, field_accuracy, load_schemas, load_tasks


def test_tasks_load_with_unique_ids_and_known_schemas():
    tasks = load_tasks()
    assert len(tasks) == 36
    assert len({t.id for t in tasks}) == len(tasks)
    assert {t.schema_name for t in tasks} == {"invoice", "contact", "jobposting", "event", "productreview", "shipment"}


def test_tasks_load_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the defaults are the package's example data, not paths from the cwd
    assert len(load_tasks()) == 36


def test_a_tasks_path_is_read_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.jsonl").write_text('{"id": "c1", "schema": "contact", "text": "Ann, ann@x.org"}\n')
    (task,) = load_tasks("mine.jsonl")  # the shipped schemas by default
    assert (task.id, task.schema_name, task.expected) == ("c1", "contact", None)
    with pytest.raises(FileNotFoundError):
        load_tasks("examples/tasks.jsonl")  # a relative path is the cwd's, not the clone's


def test_a_schemas_file_that_cannot_be_imported_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(JobConfigError, match="no Python file"):
        load_schemas(tmp_path / "missing.py")
    (tmp_path / "broken.py").write_text("SCHEMAS = {\n")
    with pytest.raises(JobConfigError, match="importing .*broken.py failed: SyntaxError"):
        load_schemas(tmp_path / "broken.py")


def test_every_expected_value_validates_against_its_schema():
    for task in load_tasks():
        assert task.expected is not None, task.id
        task.schema.model_validate(task.expected)


def test_prompt_names_every_field_and_carries_the_document():
    task = load_tasks()[0]
    (message,) = extraction_prompt(task.text, task.schema)
    assert message["role"] == "user"
    assert task.text in message["content"]
    assert all(name in message["content"] for name in task.schema.model_fields)


@pytest.mark.parametrize(
    ("value", "expected", "accuracy"),
    [
        ({"a": "Acme Inc.", "b": 2}, {"a": "  acme inc. ", "b": 2}, 1.0),
        ({"a": "Acme", "b": 3}, {"a": "Acme", "b": 2}, 0.5),
        ({"a": 0.1 + 0.2}, {"a": 0.3}, 1.0),  # floats within tolerance
        ({"a": 0.31}, {"a": 0.3}, 0.0),
        ({"a": 1200}, {"a": 1200.0}, 1.0),  # int and float of the same number
        ({"a": True}, {"a": 1}, 0.0),  # a bool is not a number
        ({"b": 1}, {"a": 1, "b": 1}, 0.5),  # a missing field counts as wrong
        ({"a": 1, "extra": 5}, {"a": 1}, 1.0),  # extra fields are not penalized
        ({"items": [{"d": "X", "p": 1.5}]}, {"items": [{"d": "x ", "p": 1.5}]}, 1.0),  # nested, same rules
        ({"items": [{"d": "X"}]}, {"items": [{"d": "X"}, {"d": "Y"}]}, 0.0),  # a list must match whole
    ],
)
def test_field_accuracy(value, expected, accuracy):
    assert field_accuracy(value, expected) == pytest.approx(accuracy)


def test_field_accuracy_is_one_for_the_expected_value_itself():
    for task in load_tasks():
        assert field_accuracy(task.expected, task.expected) == 1.0


def test_a_limit_takes_every_schema_in_turn():
    from structspec.tools.benchmarks.harness import spread

    tasks = load_tasks()
    assert [t.schema_name for t in spread(tasks, 7)] == [
        "contact", "jobposting", "event", "productreview", "shipment", "invoice", "contact",
    ]
    assert spread(tasks, None) == tasks


def test_bench_first_difference():
    from structspec.tools.benchmarks.bench import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_divergence_is_a_near_tie_or_a_token_our_mask_forbids(byte_lm: structspec.LM) -> None:
    from structspec.tools.benchmarks.bench import divergence

    task = Task("box-0", "box", Box, "Item 0 is a small box.", None)
    ours = structspec.generate_result(byte_lm, Box, extraction_prompt(task.text, Box), fast_forward="off",
                                      draft=None).token_ids
    assert divergence(byte_lm, task, ours, ours) is None
    fsm = structspec.compile(Box, byte_lm).fsm
    states = [fsm.initial_state, *fsm.walk(fsm.initial_state, ours)]
    i = next(i for i, s in enumerate(states) if len(fsm.allowed_token_ids(s)) > 1)  # the first free choice
    other = next(t for t in fsm.allowed_token_ids(states[i]) if t != ours[i])  # another token the schema allows
    d = divergence(byte_lm, task, ours, ours[:i] + [other])
    assert (d.position, d.theirs_allowed, d.ours) == (i, True, byte_lm.vocab.decode(ours[i:i + 1]))
    assert d.margin >= 0
    forbidden = next(t for t in range(len(byte_lm.vocab)) if fsm.next_state(fsm.initial_state, t) is None
                     and t not in fsm.eos_token_ids)
    d = divergence(byte_lm, task, ours, [forbidden])
    assert (d.position, d.theirs_allowed) == (0, False)


@pytest.mark.slow
def test_transformers_speculative_peers_are_counted_by_target_pass(byte_lm) -> None:
    from structspec.tools.benchmarks.peers import hf_assisted, hf_prompt_lookup, unconstrained_greedy

    ids = byte_lm.encode_prompt("Alice is 31. Alice is 31. Alice is")
    plain = unconstrained_greedy(byte_lm, ids, 24)
    assert plain.forward_passes == len(plain.token_ids) + (len(plain.token_ids) < 24)
    for run in (hf_prompt_lookup(byte_lm, ids, 24), hf_assisted(byte_lm, byte_lm.early_exit(1), ids, 24)):
        assert run.token_ids == plain.token_ids  # greedy speculative decoding is lossless
        assert 0 < run.forward_passes <= plain.forward_passes  # draft passes are not target passes


class Box(BaseModel):
    flag: bool
    size: Literal["small", "medium", "large"]


@pytest.mark.slow
def test_bench_runs_every_row_and_checks_the_speed_ups_against_plain_masked_decoding(
        byte_lm: structspec.LM, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from structspec.tools.benchmarks import bench
    from structspec.tools.benchmarks.harness import PLAIN, run_tasks

    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))  # empty, so the first compile is cold
    tasks = [Task(f"box-{i}", "box", Box, f"Item {i} is a {size} box.", {"flag": True, "size": size})
             for i, size in enumerate(["small", "large"])]
    console = Console(file=io.StringIO(), width=300)
    compared = bench.rows()
    compile_times = bench.measure_compile(byte_lm, tasks)
    by_method = run_tasks(byte_lm, tasks, compared, 24, console)
    divergences = {bench.PEER: [bench.Divergence("box-0", 3, 0.02, "a", "b", True),
                                bench.Divergence("box-1", 0, 1.5, "{", "x", False)],
                   "+ tree": [bench.Divergence("box-1", 5, 0.004, "c", "d", True)]}  # as bf16 passes can
    bench.print_report(console, byte_lm, compared, by_method, compile_times, 24, divergences)
    out = console.file.getvalue()
    assert "box-0: first difference at output token 3: plain masked 'a' vs outlines 'b': masked-logit margin 0.020, " \
           "a near-tie" in out
    assert "box-1: first difference at output token 0: plain masked '{' vs outlines 'x': our mask forbids" in out
    assert "box-1: first difference at output token 5: plain masked 'c' vs + tree 'd': masked-logit margin 0.004" in out
    for header in ("s /", "records/s", "per record", "floor /"):  # the headline columns
        assert header in out
    assert list(by_method)[:3] == [PLAIN, bench.PEER, "fast-forward"] and "canonical" not in out
    assert list(compile_times) == ["box"]
    assert f"Oracle: {PLAIN} and {bench.PEER} produced the same token ids on" in out
    for name in ("fast-forward", "+ prompt lookup", "+ tree", "+ self-draft", "+ staged self-draft", "+ threshold",
                 "+ auto"):
        assert f"{name}: same token ids as {PLAIN} on 2/2 tasks" in out  # greedy speed-ups are lossless
    assert all(r.sources == ["model"] * len(r.token_ids) for r in by_method["HF greedy (unconstrained)"])


@pytest.mark.slow
def test_batched_peers_left_pad_and_decode_each_row_as_it_decodes_alone(byte_lm: structspec.LM) -> None:
    from structspec.tools.benchmarks.peers import (
        outlines_batch,
        outlines_greedy,
        outlines_index,
        unconstrained_batch,
        unconstrained_greedy,
    )

    prompts = [byte_lm.encode_prompt(t) for t in ("Alice is 31.", "Bob is 45. He works in London as a teacher.")]
    plain = unconstrained_batch(byte_lm, prompts, 16)
    assert plain.token_ids == [unconstrained_greedy(byte_lm, p, 16).token_ids for p in prompts]
    regexes = [structspec.to_regex(Box), r'\{"age":[1-9][0-9]?\}']
    indexes = [outlines_index(byte_lm, r) for r in regexes]
    mixed = outlines_batch(byte_lm, indexes, prompts, 24)  # one outlines processor per row
    shared = outlines_batch(byte_lm, [indexes[0]] * 2, prompts, 24)  # outlines' own batched processor
    assert mixed.token_ids == [outlines_greedy(byte_lm, r, p, 24).token_ids for r, p in zip(regexes, prompts)]
    assert shared.token_ids == [outlines_greedy(byte_lm, regexes[0], p, 24).token_ids for p in prompts]
    for batch in (plain, mixed, shared):
        assert batch.texts == [byte_lm.vocab.decode(ids) for ids in batch.token_ids]
        passes = [batch.row_passes(row) for row in range(2)]
        assert batch.forward_passes == max(passes)  # a batch runs until its last row stops
        assert passes == [len(ids) + eos for ids, eos in zip(batch.token_ids, batch.chose_eos)]
    assert all(mixed.chose_eos) and mixed.mask_seconds > 0 and plain.mask_seconds == 0


def test_bench_without_outlines_runs_structspecs_rows_and_names_the_skipped_peer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from structspec.testing import save_tiny_model
    from structspec.tools.benchmarks import bench
    from structspec.tools.cli import main

    model = save_tiny_model(tmp_path / "model")
    monkeypatch.setitem(sys.modules, "outlines", None)  # `import outlines` raises ImportError, as when not installed
    assert bench.PEER not in bench.rows(outlines=False)
    assert main(["bench", "--model", str(model), "--device", "cpu", "--limit", "1", "--max-new-tokens", "8",
                 "--only", "prompt lookup", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert "outlines is not installed, so its row and its Index compile times are skipped; pip install " \
           "'outlines>=1.2,<2'" in " ".join(err.split())
    text = " ".join(out.split())
    assert "plain masked" in text and "prompt lookup" in text and "outlines: not installed, skipped." in text
