"""The bitmask trio: allocate_token_bitmask, fill_next_token_bitmask, apply_token_bitmask_inplace."""

from __future__ import annotations

import random

import pytest
import torch

from structspec.automaton import TokenFSM, apply_token_bitmask_inplace

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
