"""Shared fixtures: tiny offline LMs, an isolated cache, and the real SmolLM2 (marked ``real_model``)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

import structspec
from structspec.errors import ModelNotFoundError
from structspec.testing import tiny_lm

# The developer's cache, saved before `isolated_cache` points STRUCTSPEC_CACHE at a temp dir.
_USER_CACHE = os.environ.get("STRUCTSPEC_CACHE")


def _set_cache(value: str | None) -> None:
    if value is None:
        os.environ.pop("STRUCTSPEC_CACHE", None)
    else:
        os.environ["STRUCTSPEC_CACHE"] = value


@pytest.fixture(scope="session", autouse=True)
def isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Point STRUCTSPEC_CACHE at a session temp dir so tests never touch the developer's cache."""
    path = str(tmp_path_factory.mktemp("structspec-cache"))
    _set_cache(path)
    yield path
    _set_cache(_USER_CACHE)


@pytest.fixture(scope="session")
def byte_lm() -> structspec.LM:
    """Tiny random Llama with the byte-level BPE tokenizer (SmolLM2/Qwen style)."""
    return tiny_lm("byte_level")


@pytest.fixture(scope="session")
def sp_lm() -> structspec.LM:
    """Tiny random Llama with the SentencePiece-style tokenizer (Llama 2 style)."""
    return tiny_lm("sentencepiece")


@pytest.fixture(scope="session")
def smollm2(isolated_cache: str) -> structspec.LM:
    """The shipped SmolLM2-135M, loaded from (and converted into) the developer's cache.

    Skips the test when the model's package is not installed.
    """
    _set_cache(_USER_CACHE)
    try:
        return structspec.load("smollm2-135m")
    except ModelNotFoundError as e:
        pytest.skip(f"SmolLM2 is not available: {e}")
    finally:
        _set_cache(isolated_cache)
