"""Every ```python block in README.md and docs/ runs, page by page (a page's blocks share one namespace, in order).

A block preceded by ``<!-- skip: REASON -->`` is not run; its reason must be one of `SKIP_REASONS` (a short,
reviewed list), and each skipped block shows up as a skipped test with its reason. Blocks run with the current
directory in a temporary folder that holds the clone's ``examples/``, so they may read the example files and
write their own. Pages share loaded models (`structspec.load` memoized here, from the developer's cache as the
`smollm2` fixture loads it) only to save load time.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from tests.conftest import _USER_CACHE, _set_cache

import structspec
from structspec.models.shipped import DEFAULT_MODEL

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

# Why a block may be left out; anything else must run.
SKIP_REASONS = {
    "needs a Ray cluster": "Ray Data pipelines start a cluster of actors",
    "needs a GPU": "CUDA devices",
    "needs vLLM": "vLLM runs in a venv of its own (.ci/vllm-check runs these pages' code in its tests)",
}

FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*skip:\s*(?P<reason>[^>]*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    code: str
    skip: str | None  # the reason, or None: the block runs


def blocks(page: Path) -> list[Block]:
    """The page's python blocks in order, each with its skip marker's reason (the line right above the fence)."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.search(before)
        line = text.count("\n", 0, match.start()) + 2  # the block's first line of code, 1-based
        found.append(Block(page, line, textwrap.dedent(match["body"]), marker["reason"] if marker else None))
    return found


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


RUN_PAGES = [page for page in PAGES if any(block.skip is None for block in blocks(page))]
SKIPPED = [block for page in PAGES for block in blocks(page) if block.skip is not None]


_MODELS: dict[str, structspec.LM] = {}  # loaded once per session, whichever page asks first
_LOAD = structspec.load


def _shared_load(isolated_cache: str) -> Callable[..., structspec.LM]:
    """`structspec.load` for the blocks: a shipped model from the developer's cache, loaded once per session."""
    def load(name: str = DEFAULT_MODEL, **options: Any) -> structspec.LM:
        if options:
            raise AssertionError(f"a docs block loads {name!r} with {options}: blocks load by name only; "
                                 "mark one that needs more with a listed skip reason")
        if name not in _MODELS:
            _set_cache(_USER_CACHE)  # converted once into the developer's cache, as the smollm2 fixture does
            try:
                _MODELS[name] = _LOAD(name)
            finally:
                _set_cache(isolated_cache)
        return _MODELS[name]
    return load


def test_pages_have_runnable_blocks() -> None:
    # The collection itself: a fence pattern that matched nothing would make every page test vanish.
    assert _name(ROOT / "README.md") in {_name(page) for page in RUN_PAGES}
    assert len(RUN_PAGES) >= 10


ANY_FENCE = re.compile(r"^[ \t]*```[^\n]*\n(?P<body>.*?)^[ \t]*```[ \t]*$", re.M | re.S)
UNPUBLISHED = re.compile(r"pip install\s+(-\S+\s+)*['\"]?structspec-lm\b")


def test_no_install_command_names_the_unpublished_distribution() -> None:
    # structspec-lm is not on the package index yet: a command installing it by name fails for whoever copies it
    found = [f"{_name(page)}: {line.strip()}" for page in PAGES
             for block in ANY_FENCE.finditer(page.read_text(encoding="utf-8"))
             for line in block["body"].splitlines() if UNPUBLISHED.search(line)]
    assert not found, f"install from a clone or a built wheel instead: {found}"


def test_skip_reasons_are_listed() -> None:
    unlisted = [f"{_name(b.page)}:{b.line}: {b.skip!r}" for b in SKIPPED if b.skip not in SKIP_REASONS]
    assert not unlisted, f"skip reasons not in SKIP_REASONS: {unlisted}"


@pytest.mark.parametrize("block", SKIPPED, ids=lambda b: f"{_name(b.page)}:{b.line}")
def test_skipped_block(block: Block) -> None:
    pytest.skip(f"{block.skip} ({SKIP_REASONS.get(block.skip, 'unlisted')})")


@pytest.mark.real_model
@pytest.mark.parametrize("page", RUN_PAGES, ids=_name)
def test_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_cache: str) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(structspec, "load", _shared_load(isolated_cache))
    namespace: dict[str, Any] = {"__name__": "docs_page"}
    threads = torch.get_num_threads()  # a page may set them (performance tips); later tests keep theirs
    try:
        for block in blocks(page):
            if block.skip is None:
                # Padded to its place on the page, so a traceback names the page's own line.
                code = compile("\n" * (block.line - 1) + block.code, _name(page), "exec", dont_inherit=True)
                exec(code, namespace)  # noqa: S102
    finally:
        torch.set_num_threads(threads)
