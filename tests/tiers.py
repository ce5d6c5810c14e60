"""Which fast tests `make test` reruns in its later tiers, and the guard that keeps that choice complete.

The Makefile's second tier reruns the fast tests with `load`'s default dtype forced to the other CPU's
(``$STRUCTSPEC_DEFAULT_DTYPE``). `structspec.models.device.default_dtype` alone reads that variable, so a test that
never asks it for the machine's default has the same outcome in both tiers: the tier runs only the tests marked
``dtype``. Every fast test in `DTYPE_MODULES` is marked here; others are marked by hand. The guard fails a fast
test not so marked that asks, itself or through a wider fixture it uses, naming the test and the call.

A pytest plugin: tests/conftest.py loads it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from structspec.models import device

_TESTS = Path(__file__).resolve().parent

# Modules whose every test is marked ``dtype`` here rather than test by test: each runs the CLI or a benchmark on a
# tiny model without --dtype, some in a subprocess the guard does not see.
DTYPE_MODULES = frozenset({
    "tests/tools/test_cli.py", "tests/tools/test_throughput.py", "tests/tools/test_compare.py",
    "tests/tools/test_peers.py", "tests/tools/test_cli_errors.py", "tests/lab/test_contention.py",
    "tests/lab/test_prefix_reuse.py", "tests/decoding/test_budget.py", "tests/decoding/test_prefix_cache.py",
    "tests/decoding/test_decode.py",
})
if missing := sorted(m for m in DTYPE_MODULES if not (_TESTS.parent / m).is_file()):
    raise RuntimeError(f"tests/tiers.py: DTYPE_MODULES names {', '.join(missing)}, which does not exist: "
                       "give its new path (its tests would leave the dtype tier unmarked)")

# Markers of the tests the dtype tier never runs (`-m "dtype and not slow and not real_model"`)
_NOT_IN_TIER = ("slow", "real_model")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``dtype`` every test in `DTYPE_MODULES`."""
    for item in items:
        if item.nodeid.split("::")[0] in DTYPE_MODULES:
            item.add_marker(pytest.mark.dtype)


# The tier's own value, so that an ask made while a test has set the variable itself is not counted.
_TIER_DTYPE = os.environ.get(device.DTYPE_VARIABLE)
_running: list[str] = []  # the test whose setup, call or teardown runs now
_building: list[pytest.FixtureDef] = []  # the fixtures wider than a test being built now, innermost last
_asked: dict[str, str] = {}  # test -> the first default_dtype call it made that the dtype tier changes
_asked_by_fixture: dict[pytest.FixtureDef, str] = {}  # wider fixture -> the first such call made building it
_default_dtype = device.default_dtype


def _watched_default_dtype(where: torch.device, model: str | None = None) -> torch.dtype:
    if _running and model not in device.FLOAT32_MODELS and os.environ.get(device.DTYPE_VARIABLE) == _TIER_DTYPE:
        call = f"default_dtype({where}, {model!r})"
        _asked.setdefault(_running[-1], call)
        if _building:
            _asked_by_fixture.setdefault(_building[-1], call)
    return _default_dtype(where, model)


device.default_dtype = _watched_default_dtype  # resolve_device and the tools look it up at each call


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    _running.append(item.nodeid)
    yield
    _running.pop()


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef) -> Iterator[None]:
    wider = fixturedef.scope != "function"
    if wider:
        _building.append(fixturedef)
    try:
        yield
    finally:
        if wider:
            _building.pop()


def _asking_fixtures(item: pytest.Item) -> list[str]:
    """The wider fixtures ``item`` uses that asked `default_dtype` as they were built (by this test or an earlier
    one), each with its call."""
    used = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]  # (pytest's resolution for the item)
    return [f"fixture {name!r} ({_asked_by_fixture[defs[-1]]} as it was built)"
            for name, defs in used.items() if defs and defs[-1] in _asked_by_fixture]


@pytest.fixture(autouse=True)
def dtype_marker_is_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a fast test not marked ``dtype`` that asked `default_dtype` for the machine's default (what the dtype
    tier changes), itself or through a fixture wider than a test that asked as it was built, naming the test.
    Sees this process only: a test whose subprocess loads a model without a dtype is marked by hand."""
    yield
    item = request.node
    asked = _asked.pop(item.nodeid, None)
    if any(item.get_closest_marker(m) for m in ("dtype", *_NOT_IN_TIER)):
        return
    why = [f"it called {asked}"] if asked else []
    why += [f"it uses {fixture}" for fixture in _asking_fixtures(item)]
    if why:
        pytest.fail(f"{item.nodeid} depends on the machine's default dtype, which the dtype tier of `make test` "
                    f"changes: {'; '.join(why)}. Mark it @pytest.mark.dtype (or add its module to "
                    "tests/tiers.py's DTYPE_MODULES) so that the tier reruns it.", pytrace=False)
