"""`fill_bitmasks`: a batch of outputs over many schemas, filled on several threads from fresh automata (every
first mask computed concurrently, DFA rows built with the GIL released), gives the masks one thread gives, step
after step, round after round; errors and ended outputs as a one-by-one fill; the arguments checked."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

import structspec
from structspec import UnspellableError
from structspec.automaton.fsm import TokenFSM
from structspec.decoding import ENDED, Cursor, compute_masks, fill_bitmasks, mask_threads
from structspec.errors import OptionError
from structspec.testing import FakeLM
from structspec.vocab import TokenVocab

STEPS = 60


def schemas() -> list[dict]:
    """Twelve different objects: names, strings, enums, numbers, arrays, nesting."""
    out = []
    for i in range(12):
        properties = {f"field_{i}": {"type": "string", "maxLength": 1 + i},
                      "kind": {"enum": [f"k{j}_{i}" for j in range(1 + i % 4)]},
                      "count": {"type": "integer", "minimum": 0, "maximum": 10 ** (1 + i % 3)}}
        if i % 3 == 0:
            properties["tags"] = {"type": "array", "items": {"type": "string"}, "maxItems": 3}
        if i % 4 == 1:
            properties["inner"] = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
        out.append({"type": "object", "properties": properties, "required": sorted(properties)[: 2 + i % 3]})
    return out


@pytest.fixture(scope="module")
def lm() -> FakeLM:
    return FakeLM()


@pytest.fixture(scope="module")
def regexes() -> list[str]:
    return [structspec.to_regex(schema, "[ ]?", open_objects=False) for schema in schemas()]


def compile_all(regexes: list[str], lm: FakeLM) -> list[TokenFSM]:
    """Every regex compiled afresh: no DFA row or mask built yet."""
    structspec.clear_cache(disk=True)
    return [TokenFSM.from_regex(regex, lm.vocab, lm.logits_width) for regex in regexes]


def paths(fsms: list[TokenFSM]) -> list[list[int]]:
    """Per FSM, random allowed tokens for up to `STEPS` steps, EOS half the time where it is allowed. Computes
    masks."""
    rng = np.random.default_rng(7)
    out = []
    for fsm in fsms:
        cursor, tokens = Cursor(fsm), []
        while len(tokens) < STEPS and not cursor.is_terminated():
            ending = fsm.is_final(cursor.state) and rng.random() < 0.5
            tokens.append(fsm.eos_token_id if ending else int(rng.choice(fsm.allowed_token_ids(cursor.state))))
            assert cursor.accept(tokens[-1:])
        out.append(tokens)
    return out


def replay(fsms: list[TokenFSM], tokens: list[list[int]], fill) -> list[torch.Tensor]:
    """The batch's masks at each step, the cursors advancing in lockstep (an ended one stays ended)."""
    cursors = [Cursor(fsm) for fsm in fsms]
    bitmask = fsms[0].allocate_token_bitmask(len(fsms))
    found = []
    for k in range(STEPS):
        for cursor, path in zip(cursors, tokens):
            if k and k - 1 < len(path):
                assert cursor.accept([path[k - 1]])
        fill(cursors, bitmask)
        found.append(bitmask.clone())
    return found


def one_by_one(cursors: list[Cursor], bitmask: torch.Tensor) -> None:
    for row, cursor in enumerate(cursors):
        cursor.fill_bitmask(bitmask, row)


@pytest.mark.parametrize("threads", [2, 4])
def test_a_batch_filled_on_threads_from_fresh_automata_equals_one_thread(lm: FakeLM, regexes: list[str],
                                                                         threads: int) -> None:
    fsms = compile_all(regexes, lm)
    tokens = paths(fsms)
    assert sum(len(t) < STEPS for t in tokens) >= 1 and max(map(len, tokens)) == STEPS  # (ended rows, and long)
    expected = replay(compile_all(regexes, lm), tokens, one_by_one)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as the interpreter lets them
    try:
        for _ in range(3):
            found = replay(compile_all(regexes, lm), tokens, lambda c, b: fill_bitmasks(c, b, threads=threads))
            assert all(torch.equal(f, e) for f, e in zip(found, expected))
    finally:
        sys.setswitchinterval(switch)


def test_rows_place_each_cursor_and_an_ended_one_allows_eos_alone(lm: FakeLM, regexes: list[str]) -> None:
    fsms = compile_all(regexes[:3], lm)
    cursors = [Cursor(fsm) for fsm in fsms]
    cursors[1].states.append(ENDED)  # (as accepting EOS in a final state leaves it)
    bitmask = fsms[0].allocate_token_bitmask(5)
    fill_bitmasks(cursors, bitmask, rows=[4, 0, 2], threads=3)
    alone = fsms[0].allocate_token_bitmask(5)
    for row, cursor in zip([4, 0, 2], cursors):
        cursor.fill_bitmask(alone, row)
    assert torch.equal(bitmask, alone)
    assert (bitmask[[1, 3]] == -1).all()  # rows not named: untouched


def test_only_masks_not_computed_are_computed_and_one_thread_computes_none(lm: FakeLM, regexes: list[str]) -> None:
    fsm, other = compile_all(regexes[:2], lm)
    rows = [(fsm, fsm.initial_state), (other, other.initial_state), (fsm, fsm.initial_state)]
    compute_masks(rows, threads=1)  # (the reads that follow compute them)
    assert not fsm.mask_ready(fsm.initial_state) and not other.mask_ready(other.initial_state)
    compute_masks(rows, threads=2)
    assert fsm.mask_ready(fsm.initial_state) and other.mask_ready(other.initial_state)
    assert 1 <= mask_threads() <= 8


def test_an_unspellable_state_raises_as_a_one_by_one_fill_does(lm: FakeLM) -> None:
    vocab = TokenVocab(tuple(None if b and b"@" in b else b for b in lm.vocab.token_bytes), lm.vocab.eos_token_id,
                       lm.vocab.fingerprint + ":no-at")
    mail = TokenFSM.from_regex("[a-z]{3}@[a-z]{2}", vocab, lm.logits_width)
    word = TokenFSM.from_regex("[a-z]{3,9}", vocab, lm.logits_width)
    stuck, fine = Cursor(mail), Cursor(word)
    assert stuck.accept([lm.tokenizer.convert_tokens_to_ids(c) for c in "abc"])
    bitmask = mail.allocate_token_bitmask(2)
    with pytest.raises(UnspellableError, match="'@'"):
        fill_bitmasks([fine, stuck], bitmask, threads=2)
    with pytest.raises(UnspellableError, match="'@'"):
        one_by_one([fine, stuck], bitmask)


@pytest.mark.parametrize("threads", [0, -1, 1.5, True, "2"])
def test_threads_must_be_a_positive_int(lm: FakeLM, regexes: list[str], threads: object) -> None:
    fsm = compile_all(regexes[:1], lm)[0]
    with pytest.raises(OptionError, match="threads must be an int ≥ 1"):
        fill_bitmasks([Cursor(fsm)], fsm.allocate_token_bitmask(1), threads=threads)


def test_rows_must_pair_with_the_cursors(lm: FakeLM, regexes: list[str]) -> None:
    fsm = compile_all(regexes[:1], lm)[0]
    with pytest.raises(OptionError, match="2 rows for 1 cursors"):
        fill_bitmasks([Cursor(fsm)], fsm.allocate_token_bitmask(2), rows=[0, 1])
