"""The packed pass-cost curve: measured once on a named model's first batch, stored, read back after; discarded
when measured beside another busy process; keyed by what it depends on."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

import structspec
from structspec.decoding import calibrate
from structspec.decoding.budget import DEFAULT_COST, curve_path
from structspec.testing import CountingLM, tiny_lm


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine as calibration sees it: idle (other test workers may be busy beside this one)."""
    monkeypatch.setattr(calibrate, "others_running", lambda: 0)


def test_the_packed_curve_is_measured_once_then_read_back(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "calibrate-once-test"
    passes = []
    forward_slots = lm.forward_slots
    monkeypatch.setattr(lm, "forward_slots", lambda windows, *a, **k: (passes.append(sum(map(len, windows))),
                                                                       forward_slots(windows, *a, **k))[1])
    cost = calibrate.packed_cost(lm)
    # every point timed after a warm-up pass
    assert passes == [n for n in calibrate.TOKENS for _ in range(calibrate.REPEATS + 1)]
    assert curve_path(lm, packed=True).exists() and not curve_path(lm).exists()  # its own file
    assert [n for n, _ in cost.curves[1]] == list(calibrate.TOKENS) and cost(1) == 1.0
    assert calibrate.packed_cost(lm) == cost and len(passes) == len(calibrate.TOKENS) * (calibrate.REPEATS + 1)
    # a curve never falls: a wider pass costs at least a narrower one (a stall does not steer drafting)
    assert [c for _, c in cost.curves[1]] == sorted(c for _, c in cost.curves[1])


def test_no_curve_is_measured_for_a_nameless_model_and_a_batch_still_runs(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = ""
    monkeypatch.setattr(calibrate, "measure", lambda lm: (_ for _ in ()).throw(AssertionError("measured")))
    assert calibrate.packed_cost(lm) == DEFAULT_COST
    rows = structspec.generate_batch(lm, structspec.Regex(r"[a-z]{3,8}"), ["abc", "defg"], batch_size=2,
                                     max_new_tokens=8)
    assert all(r.error is None and 3 <= len(r.text) <= 8 for r in rows)


def test_a_capped_model_is_measured_within_its_cap() -> None:
    lm = CountingLM(tiny_lm("byte_level"))
    lm.name = "calibrate-capped-test"
    lm.max_pass_tokens = 16
    fed = []
    forward_slots = lm.forward_slots
    lm.forward_slots = lambda windows, *a, **k: (fed.append(sum(map(len, windows))), forward_slots(windows, *a, **k))[1]
    cost = calibrate.packed_cost(lm)
    assert max(fed) == 16 and max(n for n, _ in cost.curves[1]) == 16


def test_a_curve_measured_beside_a_busy_process_is_discarded_and_not_measured_again(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "calibrate-busy-test"
    measured = []
    monkeypatch.setattr(calibrate, "measure", lambda lm: measured.append(1) or {(1, 1): 1.0, (1, 2): 9.0})
    monkeypatch.setattr(calibrate, "others_running", lambda: 1)
    assert calibrate.packed_cost(lm) == DEFAULT_COST and not curve_path(lm, packed=True).exists()
    assert calibrate.packed_cost(lm) == DEFAULT_COST and measured == [1]  # once a process, not every call


def test_the_curve_is_keyed_by_the_thread_count(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "calibrate-threads-test"
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = curve_path(lm, packed=True)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert curve_path(lm, packed=True) != one and one.name.endswith("-t1-packed.json")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat, which only Linux has")
def test_a_busy_process_is_seen_running(monkeypatch) -> None:
    monkeypatch.undo()  # the real probe, not the idle fixture's
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # started and spinning
        assert calibrate.others_running() >= 1
    finally:
        busy.kill()
