"""The cache heals: a truncated or garbled entry of each store (automaton, token walk, pass-cost curve, converted
model, joined GGUF) is dropped with one `CacheWarning` naming it and built again; processes that build the same
entry at once all succeed (spawned processes, started together at a barrier)."""

from __future__ import annotations

import multiprocessing
import re
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import structspec
from structspec.automaton import fsm as fsm_module
from structspec.automaton import index as index_module
from structspec.automaton.fsm import TokenFSM, clear_cache
from structspec.cache import CacheWarning, cache_dir
from structspec.decoding.cost import curve_path, curve_source, pass_cost, prior_cost
from structspec.models import shipped
from structspec.testing import save_tiny_model, tiny_lm
from tests.api.cache_workers import compile_regex, join_parts, load_shipped, tiny_convert
from tests.decoding.test_budget import store


def truncate(path: Path, at: int | None = None) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def garble(path: Path, at: int | None = None) -> None:
    """Flip 16 bytes in the middle of ``path`` (or at ``at``): no longer UTF-8, JSON or the pickle checksummed."""
    data = bytearray(path.read_bytes())
    start = len(data) // 2 if at is None else at
    data[start:start + 16] = bytes(b ^ 0xFF for b in data[start:start + 16])
    path.write_bytes(bytes(data))


DAMAGE: dict[str, Callable[..., None]] = {"truncated": truncate, "garbled": garble}
REGEX = r'\{"name": "[a-z]{1,8}", "age": [0-9]{1,3}\}'


def healed(path: Path, build: Callable[[], object]) -> object:
    """``build()``, which must warn exactly once that ``path`` was damaged and dropped."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = build()
    damaged = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert len(damaged) == 1, [str(w.message) for w in caught]
    assert re.search(rf"{re.escape(str(path))} is damaged \(.+\): removed, and ", str(damaged[0].message))
    return built


def quiet(build: Callable[[], object]) -> object:
    """``build()``, which must not warn of the cache."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        return build()


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_automaton_is_dropped_with_a_warning_and_compiled_again(byte_lm, monkeypatch, damage) -> None:
    monkeypatch.setattr(fsm_module, "DISK_MIN_SECONDS", 0.0)  # every automaton stored
    clear_cache(disk=True)
    first = TokenFSM.from_regex(REGEX, byte_lm.vocab)
    [path] = cache_dir("fsm").glob("*.dfa")
    DAMAGE[damage](path)
    clear_cache()  # memory only: what a new process has
    again = healed(path, lambda: TokenFSM.from_regex(REGEX, byte_lm.vocab))
    assert again.info.source == "compiled" and path.exists()  # stored whole again
    clear_cache()
    read = quiet(lambda: TokenFSM.from_regex(REGEX, byte_lm.vocab))
    assert read.info.source == "disk"
    ids = byte_lm.tokenizer.encode('{"name": "ada", "age": 31}')
    for fsm in (again, read):  # the same language
        states = fsm.walk(fsm.initial_state, ids)
        assert states == first.walk(first.initial_state, ids) and fsm.is_final(states[-1])


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_token_walk_is_dropped_with_a_warning_and_walked_again(byte_lm, monkeypatch, damage) -> None:
    monkeypatch.setattr(index_module, "SHAPE_DISK_SECONDS", 0.0)  # every walk is stored
    clear_cache(disk=True)
    dfa = TokenFSM.from_regex('"[^"]*"x', byte_lm.vocab).index.dfa
    table, regions, _ = index_module._region(dfa, dfa.step(dfa.initial, b'"'))  # a string's characters
    walked = index_module._VocabBytes(byte_lm.vocab).shape(table, regions)
    [path] = cache_dir("shapes").glob("*.shape")
    DAMAGE[damage](path)
    again = healed(path, lambda: index_module._VocabBytes(byte_lm.vocab).shape(table, regions))
    later = index_module._VocabBytes(byte_lm.vocab)  # a new process: read from disk, never walked
    monkeypatch.setattr(later, "_walk_shape", lambda *args: pytest.fail("walked again"))
    read = quiet(lambda: later.shape(table, regions))
    for shape in (again, read):
        assert np.array_equal(shape.base, walked.base) and len(shape.levels) == len(walked.levels)


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_curve_is_dropped_with_a_warning_for_the_default_curve(monkeypatch, damage) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "healing-test"  # a curve of its own
    store(lm, {1: 1.0, 2: 1.5, 16: 3.0}, monkeypatch)
    path = curve_path(lm)
    assert path is not None and pass_cost(lm)(2) == 1.5
    DAMAGE[damage](path)
    assert healed(path, lambda: pass_cost(lm)) == prior_cost(lm)
    assert not path.exists() and quiet(lambda: pass_cost(lm)) == prior_cost(lm)


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_curve_is_not_named_as_the_stored_one(monkeypatch, damage) -> None:
    lm = tiny_lm("byte_level")
    lm.name = "healing-test"
    store(lm, {1: 1.0, 2: 1.5, 16: 3.0}, monkeypatch)
    path = curve_path(lm)
    assert path is not None and "stored in" in quiet(lambda: curve_source(lm))
    DAMAGE[damage](path)
    said = healed(path, lambda: curve_source(lm))  # read as decoding reads it
    assert "stored" not in said and "flat" in said  # what decoding then drafts by: the prior


def _conversions() -> int:
    log = cache_dir() / "conversions.log"
    return len(log.read_text().split()) if log.exists() else 0


@pytest.mark.slow
@pytest.mark.parametrize(("file", "damage", "at"), [
    ("config.json", "truncated", None), ("config.json", "garbled", None),
    ("model.safetensors", "truncated", None), ("model.safetensors", "garbled", 12),  # in its JSON header
    ("tokenizer.json", "truncated", None), ("tokenizer.json", "garbled", None),  # seen when the load fails
], ids=str)
def test_a_damaged_converted_model_is_dropped_with_a_warning_and_converted_again(
        tmp_path, monkeypatch, file: str, damage: str, at: int | None) -> None:
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(shipped, "_convert", tiny_convert, raising=False)
    converted = save_tiny_model(tmp_path / "models" / "smollm2-135m")  # converted before
    killed = save_tiny_model(tmp_path / "models" / ".smollm2-135m.x1y2z3")  # a conversion killed before its rename
    DAMAGE[damage](converted / file, at)
    lm = healed(converted, lambda: structspec.load("smollm2-135m", device="cpu", kernels="torch"))
    assert _conversions() == 1 and shipped.damage(converted, thorough=True) is None
    assert not killed.exists()  # removed by the next conversion
    assert len(lm.encode_prompt("Alice is 31")) > 0
    quiet(lambda: structspec.load("smollm2-135m", device="cpu", kernels="torch"))
    assert _conversions() == 1


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_joined_gguf_of_the_wrong_size_is_joined_again(tmp_path, monkeypatch, damage) -> None:
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))
    parts = _parts(tmp_path)
    joined = shipped._concatenated("model.gguf", parts)
    DAMAGE[damage](joined)
    killed = joined.with_name(".model.gguf.x1y2z3.tmp")  # a join killed before its rename
    killed.write_bytes(b"\0" * 1000)
    if damage == "garbled":  # the size is the parts': a garbled join is not seen (the conversion reads it)
        assert quiet(lambda: shipped._concatenated("model.gguf", parts)) == joined
        return
    assert healed(joined, lambda: shipped._concatenated("model.gguf", parts)) == joined
    assert joined.read_bytes() == b"".join(p.read_bytes() for p in parts) and not killed.exists()


def _parts(directory: Path) -> list[Path]:
    parts = [directory / f"part{i}" for i in range(3)]
    for i, part in enumerate(parts):
        part.write_bytes(bytes([i]) * 100_000)
    return parts


def _race(target: Callable[..., None], *args: object, processes: int = 2) -> None:
    """Run ``target(*args, barrier)`` in ``processes`` spawned processes at once; each must succeed."""
    spawn = multiprocessing.get_context("spawn")
    barrier = spawn.Barrier(processes)
    running = [spawn.Process(target=target, args=(*args, barrier)) for _ in range(processes)]
    for p in running:
        p.start()
    for p in running:
        p.join(timeout=300)
        if p.is_alive():  # hung: not left behind
            p.kill()
    assert [p.exitcode for p in running] == [0] * processes


@pytest.mark.slow
def test_processes_joining_one_gguf_at_once_all_succeed(tmp_path) -> None:
    parts = _parts(tmp_path)
    _race(join_parts, str(tmp_path), parts)
    assert (tmp_path / "gguf" / "model.gguf").read_bytes() == b"".join(p.read_bytes() for p in parts)


@pytest.mark.slow
def test_processes_loading_one_shipped_model_at_once_convert_it_once_and_all_succeed(tmp_path, monkeypatch) -> None:
    _race(load_shipped, str(tmp_path))
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))
    assert _conversions() == 1 and shipped.damage(tmp_path / "models" / "smollm2-135m", thorough=True) is None


@pytest.mark.slow
def test_processes_compiling_one_automaton_at_once_all_succeed(tmp_path, monkeypatch, byte_lm) -> None:
    _race(compile_regex, str(tmp_path), REGEX, byte_lm.vocab)
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))
    clear_cache()
    assert quiet(lambda: TokenFSM.from_regex(REGEX, byte_lm.vocab)).info.source == "disk"
