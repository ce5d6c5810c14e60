"""`lab.maskbench`: every engine installed replays the same outputs; the table has a row
per group and engine (no timing is asserted)."""

from __future__ import annotations

import argparse

import pytest

from lab import maskbench, maskbench_engines
from structspec.testing import byte_level_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return byte_level_tokenizer()


def _cases(tokenizer) -> list[maskbench.Case]:
    return [maskbench.Case("extraction", name, schema, maskbench._tokens(tokenizer, instance))
            for name, (schema, instance) in list(maskbench.MORE_SCHEMAS.items())[:2]]


def test_every_engine_accepts_the_same_outputs_and_the_table_has_a_row_each(tokenizer) -> None:
    engines, missing = maskbench_engines.make_engines(tokenizer, len(tokenizer), list(maskbench_engines.ENGINES),
                                                      cold=False)
    names = [e.name for e in engines]
    assert names[0] == "structspec"
    assert len(names) + len(missing) == len(maskbench_engines.ENGINES)  # each peer runs or is named as missing
    cases = _cases(tokenizer)
    results = maskbench.run(cases, engines)
    assert sorted(results) == sorted(("extraction", name) for name in names)
    for (_, name), timings in results.items():
        assert timings.failed == [] and timings.accepted == len(cases), name
        assert len(timings.compile_first) == len(cases)
        assert len(timings.first_visit) + len(timings.warm) == sum(len(c.token_ids) for c in cases)
    first = {name: len(t.first_visit) for (_, name), t in results.items()}
    assert len(set(first.values())) == 1 and 0 < first["structspec"]  # the same positions split every engine
    table = maskbench.markdown(results, {"extraction": len(cases)}).splitlines()
    assert table[0] == maskbench.HEADER and len(table) == 2 + len(names)
    assert all(row.count("|") == table[0].count("|") and f"{len(cases)}/{len(cases)}" in row for row in table[2:])


def test_a_peer_not_installed_is_named_and_structspec_runs_alone(tokenizer, monkeypatch) -> None:
    def missing(*args, **kwargs):
        raise ImportError("no module", name="xgrammar")

    monkeypatch.setattr(maskbench_engines, "XgrammarEngine", missing)
    engines, notes = maskbench_engines.make_engines(tokenizer, len(tokenizer), ["structspec", "xgrammar"], cold=True)
    assert [e.name for e in engines] == ["structspec"]
    assert len(notes) == 1 and notes[0].startswith("xgrammar is not installed")
    results = maskbench.run(_cases(tokenizer)[:1], engines)
    assert all(t.accepted == 1 for t in results.values())


def test_the_options_parse_for_a_quick_run() -> None:
    parser = argparse.ArgumentParser()
    maskbench.add_arguments(parser)
    args = parser.parse_args(["--count", "2", "--splits", "Github_easy", "--engines", "structspec"])
    assert (args.count, args.splits, args.engines, args.cold) == (2, ["Github_easy"], ["structspec"], False)
