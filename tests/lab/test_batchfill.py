"""`lab.batchfill`: the batch's tool sets differ and their calls are valid; one quick run times every thread
count per engine with the masks checked equal across counts, and the table has a row each (no timing is
asserted)."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from lab import batchfill
from structspec.testing import byte_level_tokenizer

XGRAMMAR = importlib.util.find_spec("xgrammar") is not None


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


def test_the_tool_sets_differ_and_each_call_names_a_tool_of_its_set(tokenizer) -> None:
    batch = batchfill.requests(tokenizer, 32)
    assert len({frozenset(r.tools) for r in batch}) == 32
    assert all(2 <= len(r.tools) <= 5 and r.token_ids for r in batch)
    tools, _ = batchfill.load_tools()
    for request in batch:
        call = tokenizer.decode(request.token_ids)
        assert call.startswith(f'{{"name":"{request.tools[0]}","arguments":{{')
        assert request.schema == batchfill.call_schema(tools, request.tools)


def test_an_instance_holds_the_required_properties_and_first_enum_values() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"enum": ["x", "y"]},
                                               "c": {"type": "integer"}}, "required": ["a", "b"]}
    assert batchfill.arguments_of(schema) == {"a": "x", "b": "x"}


def test_a_quick_run_times_every_thread_count_and_the_table_has_a_row_each(isolated_cache: str, tokenizer) -> None:
    parser = argparse.ArgumentParser()
    batchfill.add_arguments(parser)
    args = parser.parse_args(["--tool-sets", "4", "--steps", "6", "--threads", "1", "2", "--repeats", "2"]
                             + ([] if XGRAMMAR else ["--no-xgrammar"]))
    results, header = batchfill.measure(tokenizer, len(tokenizer), args)  # (raises if masks differ by threads)
    names = ["structspec first visit", "structspec warm"] + ["xgrammar batch fill"] * XGRAMMAR
    assert list(results) == names
    assert all(sorted(s.by_threads) == [1, 2] and all(len(v) == 2 for v in s.by_threads.values())
               for s in results.values())
    assert "4 tool sets, 6 steps" in header
    lines = batchfill.table(results, [1, 2]).splitlines()
    assert len(lines) == 2 + len(names) + XGRAMMAR * 2  # (and a structspec ÷ xgrammar row per structspec row)
    assert all(line.count("|") == lines[0].count("|") for line in lines)
