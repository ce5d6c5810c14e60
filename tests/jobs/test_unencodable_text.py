"""A record whose text no tokenizer can encode (a lone surrogate, ``"\\ud800"`` in JSON) is that record's error
line, of its own kind, in every engine; the job goes on with the other records."""

from __future__ import annotations

import json
from pathlib import Path

import structspec
from structspec.jobs.lines import ERROR_KINDS
from structspec.jobs.prompts import default_template
from structspec.jobs.records import input_record, read_inputs, text_error
from structspec.jobs.runner import JobOptions, run_job

SCHEMA = {"type": "object", "properties": {"flag": {"type": "boolean"}}, "required": ["flag"],
          "additionalProperties": False}


def _input(path: Path) -> Path:
    rows = [{"id": "a", "text": "Item 1 is small."}, {"id": "bad", "text": "broken \ud800 text"},
            {"id": "c", "text": "Item 3 is large."}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))  # (json.dumps writes "\ud800" as an escape)
    return path


def test_a_lone_surrogate_is_the_records_error_of_its_own_kind(tmp_path: Path) -> None:
    records = read_inputs(_input(tmp_path / "in.jsonl"))
    kinds = {r.id: r.error and r.error[0] for r in records}
    assert kinds == {"a": None, "bad": "unencodable_text", "c": None} and "unencodable_text" in ERROR_KINDS
    [bad] = [r for r in records if r.error]
    assert "line 2" in bad.error[1] and "U+D800 at character 7" in bad.error[1] and "; fix the input" in bad.error[1]
    assert len(bad.input_hash) == 16  # (its line can name it: the hash reads the text escaped)
    assert input_record({"text": "\udfff"}, "row 1").error[0] == "unencodable_text"  # (CSV and dataset rows)
    assert text_error("ok é 𝄞") is None


def test_the_local_engine_writes_its_line_and_every_other_record(byte_lm: structspec.LM, tmp_path: Path) -> None:
    records, out = read_inputs(_input(tmp_path / "in.jsonl")), tmp_path / "out.jsonl"
    summary = run_job(byte_lm, SCHEMA, records, out, JobOptions(default_template(SCHEMA), {"max_new_tokens": 20}))
    rows = {row["id"]: row for row in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"a", "bad", "c"} and rows["bad"]["error"]["kind"] == "unencodable_text"
    assert all("error" not in rows[i] or rows[i]["error"]["kind"] == "token_budget" for i in "ac")
    assert summary.failed["unencodable_text"] == 1
