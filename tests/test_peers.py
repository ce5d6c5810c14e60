"""The benchmark task set: loading, expected values, and field accuracy (no model needed)."""

from __future__ import annotations

import pytest

from structspec.tools.tasks import extraction_prompt, field_accuracy, load_tasks


def test_tasks_load_with_unique_ids_and_known_schemas():
    tasks = load_tasks()
    assert len(tasks) == 36
    assert len({t.id for t in tasks}) == len(tasks)
    assert {t.schema_name for t in tasks} == {"invoice", "contact", "jobposting", "event", "productreview", "shipment"}


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


def test_bench_limit_takes_every_schema_in_turn():
    from structspec.tools.bench import spread

    tasks = load_tasks()
    assert [t.schema_name for t in spread(tasks, 7)] == [
        "invoice", "contact", "jobposting", "event", "productreview", "shipment", "invoice",
    ]
    assert spread(tasks, None) == tasks


def test_bench_first_difference():
    from structspec.tools.bench import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_transformers_speculative_peers_are_counted_by_target_pass(byte_lm) -> None:
    from structspec.decoding.drafters import early_exit
    from structspec.tools.peers import hf_assisted, hf_prompt_lookup, unconstrained_greedy

    ids = byte_lm.encode_prompt("Alice is 31. Alice is 31. Alice is")
    plain = unconstrained_greedy(byte_lm, ids, 24)
    assert plain.forward_passes == len(plain.token_ids) + (len(plain.token_ids) < 24)
    for run in (hf_prompt_lookup(byte_lm, ids, 24), hf_assisted(byte_lm, early_exit(byte_lm, 1), ids, 24)):
        assert run.token_ids == plain.token_ids  # greedy speculative decoding is lossless
        assert 0 < run.forward_passes <= plain.forward_passes  # draft passes are not target passes
