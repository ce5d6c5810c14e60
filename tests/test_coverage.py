"""The coverage benchmark's pieces on a few real JSONSchemaBench rows (tests/data), without the corpus."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import structspec
from structspec import SchemaError
from structspec.tools.coverage import in_layout, summarize
from structspec.schema import constraint_of, validator

ROWS = [json.loads(line) for line in (Path(__file__).parent / "data" / "jsonschemabench_sample.jsonl").open()]


def test_layout_follows_the_schema_property_order() -> None:
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"$ref": "#/$defs/x"}},
              "$defs": {"x": {"type": "object", "properties": {"d": {}, "c": {}}}}}
    assert in_layout({"a": {"c": 1, "d": 2}, "b": 3}, schema, schema) == '{"b":3,"a":{"d":2,"c":1}}'


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_known_instances_are_accepted_or_rejected(row: dict) -> None:
    schema = row["schema"]
    try:
        constraint = constraint_of(schema)
    except SchemaError:
        return
    for test in row["tests"]:
        text = in_layout(test["data"], schema, schema)
        assert (re.fullmatch(constraint.regex, text) is not None) == test["valid"], text


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_generated_instances_validate(byte_lm: structspec.LM, row: dict) -> None:
    try:
        constraint_of(row["schema"])
    except SchemaError:
        return
    for seed in range(2):
        result = structspec.generate_result(byte_lm, row["schema"], "JSON:", max_new_tokens=96, seed=seed,
                                            **({"temperature": 1.2} if seed else {}))
        if not result.complete:
            continue
        validator(row["schema"]).validate(json.loads(result.text))


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
