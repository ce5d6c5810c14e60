"""The bitmask trio: allocate_token_bitmask, fill_next_token_bitmask, apply_token_bitmask_inplace."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from structspec.automaton import TokenFSM, apply_token_bitmask_inplace
from structspec.automaton import dfa as dfa_module
from structspec.errors import OptionError

SCHEMA_REGEX = r'\{"name":"[a-z ]{0,8}","age":(0|[1-9][0-9]{0,2}),"tags":\[("[a-z]+"(,"[a-z]+")*)?\]\}'
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.fixture(params=["byte_lm", "sp_lm"])
def lm(request: pytest.FixtureRequest):
    """Each tokenizer family in turn: `tiny_lm("byte_level")` and `tiny_lm("sentencepiece")` (conftest)."""
    return request.getfixturevalue(request.param)


def _random_states(fsm: TokenFSM, count: int, seed: int = 0) -> list[int]:
    """States met on random walks from the initial state, in order met (repeats kept)."""
    rng, states = random.Random(seed), []
    while len(states) < count:
        state = fsm.initial_state
        while len(states) < count:
            states.append(state)
            choices = [t for t in fsm.allowed_token_ids(state).tolist() if t != fsm.eos_token_id]
            if not choices:
                break
            state = fsm.next_state(state, rng.choice(choices))
    return states


def _masked(fsm: TokenFSM, states: list[int], width: int, dtype: torch.dtype = torch.float32,
            device: str = "cpu") -> torch.Tensor:
    """Random logits [len(states), width] after fill + apply."""
    logits = torch.randn(len(states), width, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    bitmask = fsm.allocate_token_bitmask(len(states))
    for row, state in enumerate(states):
        fsm.fill_next_token_bitmask(bitmask, row, state)
    apply_token_bitmask_inplace(logits, bitmask)
    return logits


@pytest.mark.parametrize("device", DEVICES)
def test_fill_and_apply_allow_exactly_the_allowed_ids(lm, device: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, lm.vocab, lm.logits_width)
    states = _random_states(fsm, 40)
    logits = _masked(fsm, states, lm.logits_width, device=device)
    assert logits.device.type == device
    for row, state in enumerate(states):
        finite = torch.isfinite(logits[row]).nonzero().flatten().tolist()
        assert finite == fsm.allowed_token_ids(state).tolist()


def test_bit_j_of_word_i_is_token_32i_plus_j(lm) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, lm.vocab, lm.logits_width)
    bitmask = fsm.allocate_token_bitmask(1)
    for state in _random_states(fsm, 10, seed=1):
        fsm.fill_next_token_bitmask(bitmask, 0, state)
        words = bitmask[0].tolist()
        allowed = set(fsm.allowed_token_ids(state).tolist())
        assert all(((words[t // 32] >> (t % 32)) & 1) == (t in allowed) for t in range(32 * len(words)))


@pytest.mark.parametrize("logits_width", [31, 32, 33, 500, 512, 513])
def test_the_bitmask_has_ceil_width_over_32_words(byte_lm, logits_width: int) -> None:
    bitmask = TokenFSM.from_regex("[a-c]+", byte_lm.vocab, logits_width).allocate_token_bitmask(3)
    assert bitmask.shape == (3, -(-logits_width // 32)) and bitmask.dtype == torch.int32


@pytest.mark.parametrize("device", DEVICES)
def test_logits_wider_than_the_bitmask_disallow_the_extra_ids(lm, device: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, lm.vocab, lm.logits_width)
    states = _random_states(fsm, 12)
    width = 32 * fsm.allocate_token_bitmask(1).shape[1] + 70
    logits = _masked(fsm, states, width, device=device)
    assert not torch.isfinite(logits[:, len(lm.vocab):]).any()
    for row, state in enumerate(states):
        assert torch.isfinite(logits[row]).nonzero().flatten().tolist() == fsm.allowed_token_ids(state).tolist()


def test_logits_narrower_than_the_bitmask_ignore_the_ids_past_them(lm) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, lm.vocab, lm.logits_width)
    states = _random_states(fsm, 12)
    width = 100
    logits = _masked(fsm, states, width)
    assert logits.shape == (len(states), width)
    for row, state in enumerate(states):
        allowed = [t for t in fsm.allowed_token_ids(state).tolist() if t < width]
        assert torch.isfinite(logits[row]).nonzero().flatten().tolist() == allowed


@pytest.mark.parametrize("device", DEVICES)
def test_bfloat16_logits_are_masked_like_float32(lm, device: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, lm.vocab, lm.logits_width)
    states = _random_states(fsm, 20, seed=2)
    half = _masked(fsm, states, lm.logits_width, torch.bfloat16, device)
    full = _masked(fsm, states, lm.logits_width, torch.float32, device)
    assert half.dtype == torch.bfloat16
    assert torch.equal(torch.isfinite(half), torch.isfinite(full))
    assert torch.equal(half[torch.isfinite(half)], full[torch.isfinite(full)].to(torch.bfloat16))


def test_unfilled_rows_stay_unmasked(lm) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, lm.vocab, lm.logits_width)
    logits = torch.zeros(3, lm.logits_width)
    bitmask = fsm.allocate_token_bitmask(3)
    fsm.fill_next_token_bitmask(bitmask, 1, fsm.initial_state)
    assert apply_token_bitmask_inplace(logits, bitmask) is None
    assert torch.isfinite(logits[[0, 2]]).all()
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == fsm.allowed_token_ids(fsm.initial_state).tolist()


def test_mask_logits_inplace_is_the_trio_row_by_row(lm) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, lm.vocab, lm.logits_width)
    states = _random_states(fsm, 8, seed=3)
    logits = torch.randn(len(states), lm.logits_width, generator=torch.Generator().manual_seed(0))
    assert fsm.mask_logits_inplace(logits, states) is None  # in place, as the trio's apply
    assert torch.equal(logits, _masked(fsm, states, lm.logits_width))


# A CPU bitmask is checked when first filled, then remembered (structspec.automaton.bitmask): later fills copy
# the row by address, with the compiled core or through numpy without it. These hold on both paths.
CORES = ["compiled", "python"]


@pytest.fixture(params=CORES)
def core(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(dfa_module, "CORE", None)
    elif dfa_module.CORE is None:
        pytest.skip("the compiled core is not built")
    return request.param


def _row(fsm: TokenFSM, state: int) -> torch.Tensor:
    return torch.from_numpy(fsm.packed_mask(state).copy())


def test_a_bitmask_filled_again_and_again_gets_each_states_row(byte_lm, core: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, byte_lm.vocab, byte_lm.logits_width)
    states = _random_states(fsm, 30, seed=4)
    bitmask = fsm.allocate_token_bitmask(3)
    for k, state in enumerate(states):
        fsm.fill_next_token_bitmask(bitmask, k % 3, state)
        assert torch.equal(bitmask[k % 3], _row(fsm, state))
    assert torch.equal(bitmask[(len(states) - 2) % 3], _row(fsm, states[-2]))  # other rows kept


def test_a_bitmask_changed_in_place_is_checked_again_and_no_old_storage_is_written(byte_lm, core: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, byte_lm.vocab, byte_lm.logits_width)
    state, words = fsm.initial_state, -(-byte_lm.logits_width // 32)
    bitmask = fsm.allocate_token_bitmask(2)
    fsm.fill_next_token_bitmask(bitmask, 1, state)
    old = bitmask[:]  # the storage it had
    before = old.clone()
    bitmask.set_(torch.zeros(3, words, dtype=torch.int32))  # other storage, another shape
    fsm.fill_next_token_bitmask(bitmask, 2, state)
    assert torch.equal(old, before) and not bitmask[:2].any() and torch.equal(bitmask[2], _row(fsm, state))
    bitmask.resize_(1, words)  # fewer rows, the same address
    with pytest.raises(OptionError, match=r"row 1 is not a row of this bitmask \(1 rows\)"):
        fsm.fill_next_token_bitmask(bitmask, 1, state)
    bitmask.data = torch.zeros(1, words, dtype=torch.int64)  # another dtype
    with pytest.raises(OptionError, match="torch.int64 tensor"):
        fsm.fill_next_token_bitmask(bitmask, 0, state)


def test_a_new_bitmask_each_step_is_written_not_an_old_one(byte_lm, core: str) -> None:
    # (a freed tensor's id, and its memory, are reused by the next: each new one is checked)
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, byte_lm.vocab, byte_lm.logits_width)
    for state in _random_states(fsm, 40, seed=5):
        bitmask = fsm.allocate_token_bitmask(1)
        fsm.fill_next_token_bitmask(bitmask, 0, state)
        assert torch.equal(bitmask[0], _row(fsm, state))
        del bitmask


def test_rows_laid_out_otherwise_are_written_where_they_are(byte_lm, core: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, byte_lm.vocab, byte_lm.logits_width)
    words = -(-byte_lm.logits_width // 32)
    state = fsm.initial_state
    big = torch.full((4, words), 7, dtype=torch.int32)
    part = big[1:3]  # rows of another tensor: at an offset
    column_major = torch.full((words, 3), 7, dtype=torch.int32).t()  # rows not contiguous
    for bitmask, rows in ((part, 2), (column_major, 3)):
        for _ in range(2):  # checked, then remembered (or not: the column-major one)
            fsm.fill_next_token_bitmask(bitmask, rows - 1, state)
            assert torch.equal(bitmask[rows - 1], _row(fsm, state)) and (bitmask[0] == 7).all()
    assert (big[[0, 3]] == 7).all()


@pytest.mark.parametrize(("row", "state", "message"), [
    (2, 0, r"row 2 is not a row of this bitmask \(2 rows\)"), (-1, 0, "row -1 is not a row"),
    (True, 0, "row True is not a row"), (1.0, 0, "row 1.0 is not a row"),
    (0, 10**6, "state 1000000 is not a state this FSM has reached"), (0, True, "state True is not a state"),
    (0, -1, "state -1 is not a state"),
])
def test_a_remembered_bitmask_refuses_what_a_new_one_does(byte_lm, core: str, row, state, message: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, byte_lm.vocab, byte_lm.logits_width)
    bitmask = fsm.allocate_token_bitmask(2)
    fsm.fill_next_token_bitmask(bitmask, 0, fsm.initial_state)
    with pytest.raises(OptionError, match=message):
        fsm.fill_next_token_bitmask(bitmask, row, fsm.initial_state if state == 0 else state)
    wider = TokenFSM.from_regex(SCHEMA_REGEX, byte_lm.vocab, byte_lm.logits_width + 64)  # another logits width
    with pytest.raises(OptionError, match="words per row but this FSM's logits width"):
        wider.fill_next_token_bitmask(bitmask, 0, wider.initial_state)


def test_a_numpy_row_and_state_fill_as_ints_do(byte_lm, core: str) -> None:
    fsm = TokenFSM.from_regex(SCHEMA_REGEX, byte_lm.vocab, byte_lm.logits_width)
    bitmask = fsm.allocate_token_bitmask(2)
    fsm.fill_next_token_bitmask(bitmask, 0, fsm.initial_state)
    fsm.fill_next_token_bitmask(bitmask, np.int64(1), np.int32(fsm.initial_state))
    assert torch.equal(bitmask[1], _row(fsm, fsm.initial_state))
