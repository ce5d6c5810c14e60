"""The coverage benchmark's pieces on a few real JSONSchemaBench rows (tests/data), without the corpus."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import structspec
from lab import coverage
from lab.coverage import spread
from lab.coverage_report import summarize
from lab.coverage_worker import OrderSearch, _OutOfBudget
from structspec import SchemaError
from structspec.automaton.dfa import DEAD, LazyDFA
from structspec.automaton.nfa import ByteNFA
from structspec.schema import constraint_of, validator
from structspec.testing import in_layout

ROWS = [json.loads(line) for line in (Path(__file__).parent.parent / "data" / "jsonschemabench_sample.jsonl").open()]


def test_layout_follows_the_schema_property_order() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"$ref": "#/$defs/x"}},
              "$defs": {"x": {"type": "object", "properties": {"d": {}, "c": {}}}}}
    assert in_layout({"a": {"c": 1, "d": 2}, "b": 3}, schema, schema) == '{"b":3,"a":{"d":2,"c":1}}'


def test_an_instance_counts_as_accepted_in_any_member_order() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {
        "type": "object", "properties": {"c": {"type": "string"}, "d": {"type": "boolean"}},
        "additionalProperties": False}}, "required": ["a"], "additionalProperties": False}
    dfa = LazyDFA(ByteNFA(constraint_of(schema).pattern))

    def next_byte(state: int, byte: int) -> int | None:
        after = dfa.step(state, bytes([byte]))
        return None if after == DEAD else after

    def accepted(value: dict, budget: int = 10_000) -> str | None:
        return OrderSearch(dfa.initial, next_byte, dfa.is_final, budget).accepted(value)

    assert accepted({"b": {"d": True, "c": "x"}, "a": 1}) == '{"a":1,"b":{"c":"x","d":true}}'
    assert accepted({"a": 1, "b": {"c": "x"}}) == '{"a":1,"b":{"c":"x"}}'  # in its own order: the first try
    for invalid in [{"b": {"d": 1}, "a": 1}, {"a": 1, "e": 2}, {"b": {}}]:
        assert accepted(invalid) is None, invalid
    with pytest.raises(_OutOfBudget):
        accepted({"b": {"d": True, "c": "x"}, "a": 1}, budget=3)


def _compiled(schema: dict) -> bool:
    """Whether ``schema`` compiles; a `SchemaError` must name a keyword written at the node it points at."""
    try:
        constraint_of(schema)
    except SchemaError as e:
        node = schema
        for part in filter(None, e.pointer.split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert e.keyword in node, (e.keyword, e.pointer)
        return False
    return True


COMPILED = [row for row in ROWS if _compiled(row["schema"])]


def test_most_sample_rows_compile() -> None:
    assert len(COMPILED) >= 0.6 * len(ROWS), f"{len(COMPILED)} of {len(ROWS)}"


@pytest.mark.slow
@pytest.mark.parametrize("row", COMPILED, ids=[r["id"] for r in COMPILED])
def test_known_instances_are_accepted_or_rejected(row: dict) -> None:
    schema = row["schema"]
    constraint = constraint_of(schema)
    for test in row["tests"]:
        text = in_layout(test["data"], schema, schema)
        if test["valid"] and constraint.narrowings and re.fullmatch(constraint.regex, text) is None:
            # a documented narrowing may leave a valid instance out: then it must be lifted by switching it off
            constraint = constraint_of(schema, max_integer_digits=None, max_fraction_digits=None, open_objects=True)
        assert (re.fullmatch(constraint.regex, text) is not None) == test["valid"], text


@pytest.mark.slow
@pytest.mark.parametrize("open_objects", [None, False], ids=["as-read", "closed"])
def test_generated_instances_validate(byte_lm: structspec.LM, open_objects: bool | None) -> None:
    runs = complete = 0
    for row in COMPILED:
        fsm = structspec.compile(row["schema"], byte_lm, open_objects=open_objects).fsm
        for seed in range(2):
            result = structspec.generate_result(byte_lm, row["schema"], "JSON:", max_new_tokens=96, seed=seed,
                                                open_objects=open_objects, **({"temperature": 1.2} if seed else {}))
            runs += 1
            if result.complete:
                validator(row["schema"]).validate(json.loads(result.text))
                complete += 1
            else:  # the budget ran out: what was generated is still a prefix of the language, token by token
                assert result.stop_reason == "max_new_tokens", row["id"]
                assert len(fsm.walk(fsm.initial_state, result.token_ids)) == len(result.token_ids) == 96
    # a random model wanders (long strings, deep arrays, and, where objects are open, names of its own); in
    # closed objects most outputs still end within the budget
    assert complete >= (runs // 2 if open_objects is False else 1), f"{complete} of {runs} outputs complete"


def test_summary_counts_statuses_and_shares() -> None:
    records = [
        {"structspec": {"status": "compiled", "compile_s": 0.5, "cached_s": 0.01, "regex_s": 0.1, "states": 10,
                        "valid_accepted": [2, 2], "invalid_rejected": [1, 1], "generated": [2, 0, 1]}},
        {"structspec": {"status": "schema_error", "keyword": "not"}},
        {"structspec": {"status": "timeout"}},
    ]
    row = summarize(records, "structspec")
    assert row["compiled"] == "33.3%" and row["SchemaError"].startswith("33.3% not 1")
    assert row["other"] == "timeout 1" and row["valid accepted"] == "100.0% (2/2)"
    assert row["generated valid"] == "2/2 (1 incomplete)"


def test_a_baseline_sample_is_spread_and_counted_as_a_sample() -> None:
    assert spread(10, 3) == [0, 3, 6] and spread(3, 5) == spread(3, None) == [0, 1, 2]
    compiled = {"status": "compiled", "compile_s": 0.5, "regex_s": 0.1, "states": 10, "valid_accepted": [1, 1],
                "invalid_rejected": [0, 0]}
    records = [{"structspec": compiled, **({"outlines-core": {"status": "timeout"}} if i in spread(4, 2) else {})}
               for i in range(4)]
    ours, baseline = summarize(records, "structspec"), summarize(records, "outlines-core")
    assert ours["rows"] == "4" and ours["compiled"] == "100.0%"
    assert baseline["rows"] == "2 of 4" and baseline["compiled"] == "0.0%" and baseline["other"] == "timeout 2"


@pytest.mark.parametrize("given", [[], ["--splits", "nosuch"]])
def test_a_data_folder_without_the_splits_is_a_usage_error(given: list[str], tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:  # an empty table was printed, exit 0
        coverage.main(["--data", str(tmp_path), *given])
    assert e.value.code == 2 and f"--data {tmp_path}: no " in capsys.readouterr().err


def test_the_default_data_folder_is_the_shared_one_beside_the_clone() -> None:
    clone = Path(__file__).resolve().parents[2]  # (the module's own path decides it: a move must keep it)
    assert coverage.DEFAULT_DATA == clone.parent / "shared" / "data" / "jsonschemabench"
