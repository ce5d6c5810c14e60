"""The pass-cost curve is an input: measured only by an explicit calibration, stored with what it depends
on, read by decoding (which never measures); a curve measured beside busy work is reported, not stored."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

import structspec
from structspec.decoding import calibrate
from structspec.decoding.cost import curve_path, pass_cost, prior_cost
from structspec.testing import CountingLM, tiny_lm

SPEC = structspec.Regex(r"[a-z]{3,8}")


@pytest.fixture(autouse=True)
def idle_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The machine as calibration sees it: idle (other test workers may be busy beside this one)."""
    monkeypatch.setattr(calibrate, "others_running", lambda: 0)


def _counting_passes(lm: structspec.LM, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The tokens each of ``lm``'s packed passes feeds, from now on."""
    passes: list[int] = []
    forward_slots = lm.forward_slots
    monkeypatch.setattr(lm, "forward_slots", lambda windows, *a, **k: (passes.append(sum(map(len, windows))),
                                                                       forward_slots(windows, *a, **k))[1])
    return passes


def test_decoding_a_model_without_a_curve_measures_nothing_and_drafts_by_the_default(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "calibrate-never-test"  # named and batchable: a curve of its own could be stored, and is not
    monkeypatch.setattr(calibrate, "measure", lambda lm: pytest.fail("a decode measured the pass cost"))
    monkeypatch.setattr(calibrate, "others_running", lambda: pytest.fail("a decode read the machine's load"))
    alone = structspec.generate_result(lm, SPEC, "abc abc", max_new_tokens=8)
    rows = structspec.generate_batch(lm, SPEC, ["abc", "defg"], batch_size=2, max_new_tokens=8)
    assert alone.error is None and all(r.error is None for r in rows)
    assert not curve_path(lm).exists() and pass_cost(lm) == prior_cost(lm)


def test_calibrate_measures_and_stores_the_curve_decoding_then_reads(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "calibrate-stores-test"
    passes = _counting_passes(lm, monkeypatch)
    calibration = structspec.calibrate(lm)
    # every point timed after a warm-up pass
    assert passes == [n for n in calibrate.TOKENS for _ in range(calibrate.REPEATS + 1)]
    assert calibration.stored and calibration.path == curve_path(lm) and calibration.busy == 0
    assert calibration.path.exists()
    cost = calibration.cost
    assert [n for n, _ in cost.points] == list(calibrate.TOKENS) and cost(1) == 1.0
    assert sorted(calibration.seconds) == list(calibrate.TOKENS)
    # a curve never falls: a wider pass costs at least a narrower one (a stall does not steer drafting)
    assert [c for _, c in cost.points] == sorted(c for _, c in cost.points)
    assert pass_cost(lm) == cost
    monkeypatch.setattr(calibrate, "measure", lambda lm: pytest.fail("a decode measured the pass cost"))
    rows = structspec.generate_batch(lm, SPEC, ["abc", "defg"], batch_size=2, max_new_tokens=8)
    assert all(r.error is None for r in rows) and pass_cost(lm) == cost


def test_a_model_without_a_name_of_its_own_is_refused_and_a_batch_still_runs() -> None:
    lm = tiny_lm("byte_level")
    lm.name = ""
    with pytest.raises(structspec.OptionError, match="no name of its own .*: load it by name or directory"):
        structspec.calibrate(lm)
    assert pass_cost(lm) == prior_cost(lm)
    rows = structspec.generate_batch(lm, SPEC, ["abc", "defg"], batch_size=2, max_new_tokens=8)
    assert all(r.error is None and 3 <= len(r.text) <= 8 for r in rows)


def test_a_capped_model_is_measured_within_its_cap() -> None:
    lm = CountingLM(tiny_lm("byte_level"))
    lm.name = "calibrate-capped-test"
    lm.max_pass_tokens = 16
    fed = []
    forward_slots = lm.forward_slots
    lm.forward_slots = lambda windows, *a, **k: (fed.append(sum(map(len, windows))), forward_slots(windows, *a, **k))[1]
    cost = calibrate.calibrate(lm).cost
    assert max(fed) == 16 and max(n for n, _ in cost.points) == 16


def test_a_curve_measured_beside_a_busy_process_is_reported_and_not_stored(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "calibrate-busy-test"
    monkeypatch.setattr(calibrate, "measure", lambda lm: {1: 1.0, 2: 9.0})
    monkeypatch.setattr(calibrate, "others_running", lambda: 2)
    with pytest.warns(RuntimeWarning, match="ran 2 thread.*not stored .*the default curve.*store_busy=True"):
        busy = structspec.calibrate(lm)
    assert not busy.stored and busy.busy == 2 and busy.cost(2) == 9.0
    assert not curve_path(lm).exists() and pass_cost(lm) == prior_cost(lm)
    kept = structspec.calibrate(lm, store_busy=True)  # told to: stored, busy as it was
    assert kept.stored and kept.busy == 2 and pass_cost(lm) == kept.cost


def test_the_curve_is_keyed_by_the_thread_count_and_the_dtype(monkeypatch) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "calibrate-key-test"
    monkeypatch.setattr(calibrate, "measure", lambda lm: {1: 1.0, 4: 3.0})
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = structspec.calibrate(lm)
    assert one.path.name.endswith("-float32-cpu-t1-packed.json") and pass_cost(lm) == one.cost
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert curve_path(lm) != one.path and pass_cost(lm) == prior_cost(lm)  # not this one's
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    half = tiny_lm("byte_level", dtype=torch.bfloat16)
    half.name = lm.name
    assert curve_path(half) != one.path and pass_cost(half) == prior_cost(half)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat, which only Linux has")
def test_a_busy_process_is_seen_running(monkeypatch) -> None:
    monkeypatch.undo()  # the real probe, not the idle fixture's
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # started and spinning
        assert calibrate.others_running() >= 1
    finally:
        busy.kill()


def test_without_a_stored_curve_a_model_drafts_by_the_prior_of_its_device_and_dtype(monkeypatch) -> None:
    from structspec.decoding import cost
    from structspec.testing.models import FakeLM

    full, half = tiny_lm("byte_level"), tiny_lm("byte_level", dtype=torch.bfloat16)
    assert prior_cost(full) == cost.FLAT_COST and prior_cost(FakeLM()) == cost.FLAT_COST  # tiny, or no weights
    monkeypatch.setattr(cost, "TINY_PARAMETERS", 0)  # as if they were real models
    assert prior_cost(full) == cost.CPU_COST
    monkeypatch.setattr(cost, "native_bf16", lambda: False)
    assert prior_cost(half) == cost.EMULATED_COST and "half precision" in cost.curve_source(half)
    monkeypatch.setattr(cost, "native_bf16", lambda: True)
    assert prior_cost(half) == cost.CPU_COST
    monkeypatch.setattr(type(full), "device", property(lambda self: torch.device("cuda")), raising=False)
    assert prior_cost(full) == cost.FLAT_COST and "flat" in cost.curve_source(full)
