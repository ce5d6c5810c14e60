"""Extraction jobs never lose, truncate or duplicate a line: outputs that are not a job's, repeated ids killed
mid-job, two jobs on one output, reruns with other settings, CSV fields with odd line breaks, filesystem errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from tests.jobs.test_jobs import SCHEMA  # short outputs, so the tiny random model finishes records

import structspec
from structspec.jobs.errors import JobConfigError
from structspec.jobs.manifest import check_output, manifest_path
from structspec.jobs.output import resume
from structspec.jobs.prompts import default_template
from structspec.jobs.records import InputRecord, read_inputs
from structspec.jobs.runner import JobOptions, run_job
from structspec.testing import save_tiny_model
from structspec.tools.cli import main
from structspec.tools.command import EXIT_CONFIG

OPTIONS = JobOptions(default_template(SCHEMA), {"max_new_tokens": 30}, batch_size=4)

# A job in its own process on `tiny_lm` (the `byte_lm` fixture's model), with OPTIONS: argv is the input, the
# output, N and what to do once N lines are written: "kill" (kill -9 itself) or "pause" (say so on stdout,
# then go on when stdin closes).
JOB = """
import json, os, signal, sys
from structspec.testing import tiny_lm
from structspec.jobs.prompts import default_template
from structspec.jobs.records import read_inputs
from structspec.jobs.runner import JobOptions, run_job
source, output, after, action = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
schema = json.loads(sys.stdin.readline())
def on_record(summary):
    if summary.written == after and action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if summary.written == after:
        print("paused", flush=True)
        sys.stdin.read()
options = JobOptions(default_template(schema), {"max_new_tokens": 30}, batch_size=4)
run_job(tiny_lm("byte_level"), schema, read_inputs(source), output, options, on_record)
"""


def _job(source: Path, output: Path, after: int, action: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", JOB, str(source), str(output), str(after), action],
                            env=os.environ | {"OMP_NUM_THREADS": "1"}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdin.write(json.dumps(SCHEMA) + "\n")
    proc.stdin.flush()
    return proc


def _lines(output: Path) -> list[dict]:
    return [json.loads(line) for line in output.read_text().splitlines()]


def _repeated_ids(path: Path, n: int) -> list[InputRecord]:
    """``n`` records whose ids repeat (5 and "5" are one id once read) read from ``path``, which this writes; the
    4th record's document is empty, so a job writes its error line before any other of id 5."""
    ids = [5, "5", "a", 5, "5", "a"]
    texts = [f"Box {i} is {['small', 'large'][i % 2]}." if i != 3 else "" for i in range(n)]
    path.write_text("".join(json.dumps({"id": ids[i % len(ids)], "text": texts[i]}) + "\n" for i in range(n)))
    return read_inputs(path)


@pytest.mark.slow
@pytest.mark.parametrize("content", [b"my notes", b"my notes\n", b"[1, 2]\n", b"5\n", b'{"id": "a"}\n',
                                     b'{"id": "a", "input": "line 1", "value": 1}\nmy notes',
                                     b'{"id": "a", "text": "a document"}\n'])
def test_a_file_that_is_not_a_job_output_is_refused_and_never_changed(byte_lm: structspec.LM, tmp_path: Path,
                                                                      content: bytes) -> None:
    out = tmp_path / "notes.txt"
    out.write_bytes(content)
    with pytest.raises(JobConfigError, match=f"{out}.*choose another --output"):
        run_job(byte_lm, SCHEMA, [InputRecord("a", "line 1", "Box 1.")], out, OPTIONS)
    assert out.read_bytes() == content and sorted(tmp_path.iterdir()) == [out]


def test_extract_refuses_a_notes_file_as_output_with_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "Box 1 is small."}\n')
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"my notes")  # no final newline: once cut off as a torn line, emptying the file
    code = main(["extract", "--schema", str(tmp_path / "schema.json"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(notes), "--model", str(save_tiny_model(tmp_path / "model")), "--device", "cpu",
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_CONFIG and notes.read_bytes() == b"my notes"
    assert str(notes) in err and "choose another --output" in err


@pytest.mark.slow
def test_the_input_file_is_refused_as_output(byte_lm: structspec.LM, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "Box 1 is small."}\n')
    with pytest.raises(JobConfigError, match="is the --input file"):
        check_output(source, source)
    before = source.read_bytes()
    with pytest.raises(JobConfigError, match="not a line of a structspec job"):  # not taken as "1 already done"
        run_job(byte_lm, SCHEMA, read_inputs(source), source, OPTIONS)
    assert source.read_bytes() == before


@pytest.mark.slow
def test_repeated_ids_killed_mid_job_and_resumed_write_each_record_once(byte_lm: structspec.LM,
                                                                        tmp_path: Path) -> None:
    records = _repeated_ids(tmp_path / "in.jsonl", 12)
    out = tmp_path / "out.jsonl"
    proc = _job(tmp_path / "in.jsonl", out, 2, "kill")
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read()
    before = out.read_text()
    assert [row["input"] for row in _lines(out)][0] == "line 4" and len(_lines(out)) == 2  # line 1 or 2 not done
    summary = run_job(byte_lm, SCHEMA, records, out, OPTIONS)
    assert (summary.skipped, summary.written) == (2, 10) and out.read_text().startswith(before)
    rows = _lines(out)
    assert Counter(row["input"] for row in rows) == Counter(record.where for record in records)  # each line once
    assert all(row["id"] == record.id for row, record in
               zip(sorted(rows, key=lambda r: int(r["input"].split()[1])), records))


@pytest.mark.parametrize("hashed", [True, False])  # False: a line written before lines had input_hash
def test_a_line_for_a_later_record_with_the_same_id_does_not_stand_for_an_earlier_one(tmp_path: Path,
                                                                                      hashed: bool) -> None:
    records = _repeated_ids(tmp_path / "in.jsonl", 4)  # ids 5, "5", "a", 5: one id "5" for lines 1, 2 and 4
    out = tmp_path / "out.jsonl"
    line = {"id": "5", "input": "line 2"} | ({"input_hash": records[1].input_hash} if hashed else {})
    out.write_text(json.dumps(line | {"value": {"flag": True, "size": "small"}}) + "\n")  # a killed job's one line
    summary, todo = resume(records, out)
    assert summary.skipped == 1 and [r.where for r in todo] == ["line 1", "line 3", "line 4"]


@pytest.mark.slow
def test_a_second_job_on_the_same_output_is_refused_while_the_first_runs(byte_lm: structspec.LM,
                                                                         tmp_path: Path) -> None:
    records = _repeated_ids(tmp_path / "in.jsonl", 6)
    out = tmp_path / "out.jsonl"
    first = _job(tmp_path / "in.jsonl", out, 2, "pause")
    assert first.stdout.readline() == "paused\n", first.stderr.read()  # 2 lines written, the job still running
    with pytest.raises(JobConfigError, match=f"another job is writing {out}"):
        run_job(byte_lm, SCHEMA, records, out, OPTIONS)
    assert len(_lines(out)) == 2
    first.stdin.close()
    assert first.wait(timeout=300) == 0, first.stderr.read()
    assert sorted(row["input"] for row in _lines(out)) == sorted(record.where for record in records)
    assert run_job(byte_lm, SCHEMA, records, out, OPTIONS).written == 0  # the lock went with the process


@pytest.mark.slow
def test_a_rerun_with_other_settings_is_refused_naming_what_differs(byte_lm: structspec.LM, tmp_path: Path) -> None:
    records = [InputRecord(f"r{i}", f"line {i}", f"Box {i} is small.") for i in range(2)]
    out = tmp_path / "out.jsonl"
    run_job(byte_lm, SCHEMA, records[:1], out, OPTIONS)
    before = out.read_bytes()
    others = [
        (SCHEMA, JobOptions(OPTIONS.template, {"max_new_tokens": 30, "top_k": 5}), r"options.top_k None there, 5 now"),
        (SCHEMA, JobOptions("Read: {document}", OPTIONS.generate), "the prompt template differs"),
        (SCHEMA | {"required": ["flag"]}, OPTIONS, "the spec differs"),
    ]
    for spec, options, message in others:
        with pytest.raises(JobConfigError, match=f"{out} was written with other settings.*{message}"):
            run_job(byte_lm, spec, records, out, options)
        assert out.read_bytes() == before
    # what keeps the output (batch size, drafter, options at their defaults written out) resumes
    same = JobOptions(OPTIONS.template, OPTIONS.generate | {"draft": None, "temperature": 1.0}, batch_size=1)
    assert run_job(byte_lm, SCHEMA, records, out, same).written == 1
    manifest = json.loads(manifest_path(out).read_text())
    assert manifest["settings"]["options"] == {"max_new_tokens": 30} and manifest["settings"]["model"] == byte_lm.name


@pytest.mark.slow
def test_an_output_written_before_manifests_resumes_by_place_and_id(byte_lm: structspec.LM, tmp_path: Path) -> None:
    records = [InputRecord("same", f"line {i}", f"Box {i} is small.") for i in (1, 2, 3)]
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "same", "input": "line 2", "value": {"flag": true, "size": "small"}}\n')
    summary = run_job(byte_lm, SCHEMA, records, out, OPTIONS)
    assert (summary.skipped, summary.written) == (1, 2)
    assert sorted(row["input"] for row in _lines(out)) == ["line 1", "line 2", "line 3"]
    assert manifest_path(out).exists()


def test_csv_fields_keep_line_separators_that_are_not_csv_line_breaks(tmp_path: Path) -> None:
    odd = ["\u2028", "\x0c", "\x1c", "\x85", "\u2029", "\x1d"]
    rows = [f"r{i},plain{sep}text,\"quoted{sep}text\"" for i, sep in enumerate(odd)]
    (tmp_path / "in.csv").write_text("id,text,note\r\n" + "\r\n".join(rows) + "\r\n", encoding="utf-8", newline="")
    records = read_inputs(tmp_path / "in.csv")
    assert [(r.id, r.text) for r in records] == [(f"r{i}", f"plain{sep}text") for i, sep in enumerate(odd)]


@pytest.mark.parametrize("where, message", [
    ("missing/out.jsonl", "does not exist .*mkdir -p"),
    ("folder", "is a folder"),
    ("/sys/out.jsonl", "cannot write"),  # refused even to root
])
def test_an_output_that_cannot_be_written_is_a_configuration_error(byte_lm: structspec.LM, tmp_path: Path,
                                                                   where: str, message: str) -> None:
    (tmp_path / "folder").mkdir()
    out = tmp_path / where
    with pytest.raises(JobConfigError, match=f"{out}.*{message}|{message}.*{out}"):
        run_job(byte_lm, SCHEMA, [InputRecord("a", "line 1", "Box 1.")], out, OPTIONS)


def test_a_text_field_missing_from_the_first_record_is_a_configuration_error_listing_its_fields(
        tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text('{"id": "a", "body": "Box 1.", "lang": "en"}\n{"id": "b", "text": "x"}\n')
    with pytest.raises(JobConfigError, match=r"line 1, the first record, has no 'text' field "
                                                  r"\(its fields: id, body, lang\): pass --text-field"):
        read_inputs(tmp_path / "in.jsonl")
    assert [r.text for r in read_inputs(tmp_path / "in.jsonl", text_field="body")] == ["Box 1.", ""]
