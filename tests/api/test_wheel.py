"""The built wheel holds what an installed structspec needs: every module, the grammar files, the example data
the CLI's commands default to, the license, its name on the package index and the `structspec` command; not the
developers' `lab/` harnesses, nor matplotlib among its core requirements (the `plots` extra has it).
(Installing it in a fresh venv and running every command is the slower CI step `.ci/wheel-check`.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # the module builds the wheel first: 17 s on 2 cores


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    # Built from a copy of what the sdist holds: setuptools writes build/ beside the sources, and two test
    # workers building in the clone at once would share it.
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    for name in ("structspec", "grammars", "examples", "lab"):  # lab/ beside them, as in a clone: left out
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    # No build isolation: the venv's setuptools (a dev requirement) builds it, with no index to reach.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(source)], check=True, capture_output=True)
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path)


def _dist_info(wheel: zipfile.ZipFile, name: str) -> str:
    (member,) = [n for n in wheel.namelist() if n.endswith(f".dist-info/{name}")]
    return wheel.read(member).decode()


def test_named_for_the_index_with_its_extras(wheel: zipfile.ZipFile) -> None:
    assert Path(wheel.filename).name.startswith("structspec_lm-")
    metadata = Parser().parsestr(_dist_info(wheel, "METADATA"))
    assert metadata["Name"] == "structspec-lm"
    assert metadata["License-Expression"] == "MIT"
    assert {"ray", "docs", "dev", "plots"} <= set(metadata.get_all("Provides-Extra"))
    core = [r for r in metadata.get_all("Requires-Dist") if "extra ==" not in r]
    assert core and not [r for r in core if r.startswith("matplotlib")]  # only compare's chart needs it


def test_ships_every_module_and_grammar_file(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "structspec").rglob("*.py")}
    grammars = {f"structspec/grammar_data/{p.name}" for p in (ROOT / "grammars").glob("*.toml")}
    assert grammars, "no grammar files found in grammars/"
    assert not (modules | grammars | {"structspec/py.typed"}) - names
    assert not [n for n in names if n.startswith("lab/")]  # the developers' harnesses stay in the repository


def test_ships_the_compiled_core_built_from_its_source(wheel: zipfile.ZipFile) -> None:
    # (the clone's own in-place build is not copied: the wheel's was compiled by its build)
    assert [n for n in wheel.namelist() if n.startswith("structspec/automaton/_core.") and n.endswith(".so")]
    assert "-py3-none-any" not in Path(wheel.filename).name


def test_ships_the_example_data_the_commands_default_to(wheel: zipfile.ZipFile) -> None:
    data = {"tasks.jsonl", "schemas.py", "toolcalls.jsonl", "invoices.jsonl", "invoice.schema.json",
            "invoice_prompt.txt", "tickets.jsonl", "ticket.schema.json", "agent_conversations.jsonl"}
    assert not {f"structspec/example_data/{name}" for name in data} - set(wheel.namelist())


def test_the_default_tasks_and_conversations_load_from_the_installed_wheel(wheel: zipfile.ZipFile,
                                                                           tmp_path: Path) -> None:
    site, cwd = tmp_path / "site", tmp_path / "elsewhere"
    cwd.mkdir()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    wheel.filename], check=True, capture_output=True)
    # The installed copy first on the path, run from a folder with no examples/ in it: nothing of the clone.
    code = ("import sys; sys.path.insert(0, sys.argv[1])\n"
            "from structspec.tools import tasks, cli\n"
            "from structspec.tools.benchmarks import toolbench, compare\n"
            "assert tasks.__file__.startswith(sys.argv[1]), tasks.__file__\n"
            "print(len(tasks.load_tasks()), len(toolbench.load_conversations()),"
            " len(compare.load_compare_tasks(cli.parser('compare').parse_args(['compare']))))")
    out = subprocess.run([sys.executable, "-c", code, str(site)], cwd=cwd, check=True, capture_output=True, text=True)
    shipped = len((ROOT / "examples" / "toolcalls.jsonl").read_text().splitlines())
    assert out.stdout.split() == ["36", str(shipped), "36"]


def test_license_and_command(wheel: zipfile.ZipFile) -> None:
    assert "Copyright (c) 2026 the structspec authors" in _dist_info(wheel, "licenses/LICENSE")
    assert "structspec = structspec.tools.cli:main" in _dist_info(wheel, "entry_points.txt")
