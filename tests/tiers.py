"""Which fast tests `make test` reruns in its later tiers, and the guard that keeps those choices complete.

The second tier reruns fast tests with `load`'s default dtype forced to the other CPU's (``$STRUCTSPEC_DEFAULT_DTYPE``).
`structspec.models.device.default_dtype` alone reads that variable, so a test that never asks it for the machine's
default has the same outcome in both tiers: the tier runs only the tests marked ``dtype`` (every test in
`DTYPE_MODULES`, others by hand).

The third tier reruns fast tests on two torch threads, where a forward pass's matmuls and reductions split
otherwise: it skips the tests marked ``thread_invariant`` (every test in `THREAD_INVARIANT_MODULES`, others by hand),
which run no torch module and never read torch's thread count.

The guard fails a fast test that did what its markers say it does not, itself or through a fixture wider than a test
that did it as it was built: an unmarked test that asked `default_dtype` for the machine's default, a
``thread_invariant`` one that ran a module's forward or read or set torch's thread count. It sees this process only:
a test whose subprocess loads a model without a dtype is marked ``dtype`` by hand. A plugin: tests/conftest.py
loads it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from structspec.models import device

_ROOT = Path(__file__).resolve().parents[1]

# Modules whose every test is marked ``dtype`` here rather than test by test: each runs the CLI or a benchmark on a
# tiny model without --dtype, some in a subprocess the guard does not see.
DTYPE_MODULES = frozenset({
    "tests/tools/test_cli.py", "tests/tools/test_throughput.py", "tests/tools/test_compare.py",
    "tests/tools/test_peers.py", "tests/tools/test_cli_errors.py", "tests/lab/test_contention.py",
    "tests/lab/test_prefix_reuse.py", "tests/decoding/test_budget.py", "tests/decoding/test_prefix_cache.py",
    "tests/decoding/test_decode.py",
})
# Modules whose every test is marked ``thread_invariant`` here: they run no torch module (schemas, regexes,
# automata, reports, FakeLM's 508 logits) and never read torch's thread count, none in a subprocess (a fast-tier
# run found no forward pass or thread-count read in any of their tests: 96 s of the tier's 495 s, one process).
THREAD_INVARIANT_MODULES = frozenset({
    "tests/schema/test_completeness.py", "tests/schema/test_schema.py", "tests/schema/test_soundness.py",
    "tests/schema/test_not_opening.py", "tests/schema/test_grammars.py", "tests/schema/test_language.py",
    "tests/schema/test_translate.py", "tests/schema/test_structural.py", "tests/automaton/test_core.py",
    "tests/automaton/test_token_walk.py", "tests/automaton/test_dfa.py", "tests/automaton/test_vocab.py",
    "tests/automaton/test_automaton.py", "tests/automaton/test_bitmask.py", "tests/automaton/test_regex_messages.py",
    "tests/decoding/test_fake_batch.py", "tests/decoding/test_fake_lm.py", "tests/decoding/test_cursor.py",
    "tests/decoding/test_masks.py", "tests/decoding/test_staged.py", "tests/api/test_tool_fuzz.py",
    "tests/api/test_argument_errors.py", "tests/api/test_tool_functions.py", "tests/api/test_errors.py",
    "tests/lab/test_vllmbench.py", "tests/lab/test_maskbench.py", "tests/integrations/test_structural_tag.py",
    "tests/integrations/test_shared_fsm.py",
})
for _listed in (DTYPE_MODULES, THREAD_INVARIANT_MODULES):
    if missing := sorted(m for m in _listed if not (_ROOT / m).is_file()):
        raise RuntimeError(f"tests/tiers.py names {', '.join(missing)}, which does not exist: give its new path "
                           "(else its tests leave their tier unmarked)")

_NOT_IN_TIERS = ("slow", "real_model")  # markers of the tests neither tier runs


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``dtype`` every test in `DTYPE_MODULES` and ``thread_invariant`` every test in
    `THREAD_INVARIANT_MODULES`."""
    for item in items:
        module = item.nodeid.split("::")[0]
        if module in DTYPE_MODULES:
            item.add_marker(pytest.mark.dtype)
        if module in THREAD_INVARIANT_MODULES:
            item.add_marker(pytest.mark.thread_invariant)


_running: list[str] = []  # the test whose setup, call or teardown runs now
_building: list[pytest.FixtureDef] = []  # the fixtures wider than a test being built now, innermost last
_did: dict[str, dict[str, str]] = {}  # test -> tier ("dtype", "threads") -> the first thing it did that the tier changes
_did_building: dict[pytest.FixtureDef, dict[str, str]] = {}  # the same for each wider fixture, as it was built


def _saw(tier: str, what: str) -> None:
    if _running:
        _did.setdefault(_running[-1], {}).setdefault(tier, what)
        if _building:
            _did_building.setdefault(_building[-1], {}).setdefault(tier, what)


# The dtype tier's own value, so that an ask made while a test has set the variable itself is not counted.
_TIER_DTYPE = os.environ.get(device.DTYPE_VARIABLE)
_default_dtype = device.default_dtype


def _watched_default_dtype(where: torch.device, model: str | None = None) -> torch.dtype:
    if model not in device.FLOAT32_MODELS and os.environ.get(device.DTYPE_VARIABLE) == _TIER_DTYPE:
        _saw("dtype", f"called default_dtype({where}, {model!r})")
    return _default_dtype(where, model)


device.default_dtype = _watched_default_dtype  # resolve_device and the tools look it up at each call


def _watched(name: str) -> Any:
    original = getattr(torch, name)

    def watched(*args: Any) -> Any:
        _saw("threads", f"called torch.{name}()")
        return original(*args)

    return watched


torch.get_num_threads, torch.set_num_threads = _watched("get_num_threads"), _watched("set_num_threads")
torch.nn.modules.module.register_module_forward_pre_hook(
    lambda module, args: _saw("threads", f"ran {type(module).__name__}.forward"))


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


def _what_it_did(item: pytest.Item, tier: str) -> list[str]:
    """What ``item`` did that ``tier`` changes: itself, then through each wider fixture it uses."""
    done = [what] if (what := _did.get(item.nodeid, {}).get(tier)) else []
    used = item._fixtureinfo.name2fixturedefs  # type: ignore[attr-defined]  # (pytest's resolution for the item)
    return done + [f"uses fixture {name!r}, which {why} as it was built" for name, defs in used.items()
                   if defs and (why := _did_building.get(defs[-1], {}).get(tier))]


@pytest.fixture(autouse=True)
def tier_markers_are_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a fast test whose markers leave out a tier that changes what it did (the module docstring), naming the
    test, what it did and the fix."""
    yield
    item = request.node
    if any(item.get_closest_marker(m) for m in _NOT_IN_TIERS):
        _did.pop(item.nodeid, None)
        return
    wrong = []
    if not item.get_closest_marker("dtype") and (did := _what_it_did(item, "dtype")):
        wrong.append(f"it {'; it '.join(did)}, so its outcome may depend on the machine's default dtype, which the "
                     "dtype tier changes: mark it @pytest.mark.dtype (or add its module to DTYPE_MODULES)")
    if item.get_closest_marker("thread_invariant") and (did := _what_it_did(item, "threads")):
        wrong.append(f"it {'; it '.join(did)}, so its outcome may depend on torch's thread count, which the "
                     "2-thread tier changes: it is marked thread_invariant (or its module is in "
                     "THREAD_INVARIANT_MODULES); take it out")
    _did.pop(item.nodeid, None)
    if wrong:
        pytest.fail(f"{item.nodeid}: {' — and '.join(wrong)}. (tests/tiers.py)", pytrace=False)
