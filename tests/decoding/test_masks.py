"""`MaskFill`: the masks of a pass's full rows filled on the worker thread while the model runs mask the logits
exactly as a fill after it does, pass after pass, and a fill that fails fails the pass's `apply`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding import masks
from structspec.decoding.masks import MaskFill, restrict
from structspec.models.protocol import Allowed
from structspec.testing import FakeLM

# Wide states (the free strings) need the bitmask; narrow ones (digits, a quote, a brace) are restricted.
RECORD = r'\{"name": "[^"\\]{0,12}", "count": [0-9]{1,3}, "tags": \[("[a-z]{1,6}"(, )?){0,3}\]\}'
FREE = r'[^\n]{1,40}'
Rows = list[tuple[TokenFSM, int]]  # per logits row, its FSM and the state that masks it
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def lm() -> FakeLM:
    return FakeLM()


@pytest.fixture(scope="module")
def walks(lm: FakeLM) -> Rows:
    """States that decoding reaches in two FSMs over one vocabulary: random walks of allowed tokens."""
    rng = np.random.default_rng(0)
    out = []
    for regex in (RECORD, FREE):
        fsm = TokenFSM.from_regex(regex, lm.vocab, lm.logits_width)
        for _ in range(6):
            state = fsm.initial_state
            while state is not None:
                out.append((fsm, state))
                ids = fsm.allowed_token_ids(state)
                state = fsm.next_state(state, int(rng.choice(ids)))
    return out


def expected(logits: torch.Tensor, rows: Rows, allowed: Allowed) -> torch.Tensor:
    """The masked logits by definition: a full row keeps its allowed ids and is -inf elsewhere; a restricted row
    is left as it came."""
    out = logits.clone()
    for i, ((fsm, state), ids) in enumerate(zip(rows, allowed)):
        if ids is None:
            keep = torch.from_numpy(fsm.allowed_token_ids(state).astype(np.int64))
            out[i] = float("-inf")
            out[i, keep] = logits[i, keep]
    return out


def passes(walks: Rows, lm: FakeLM, sizes: list[int], seed: int = 0) -> Iterator[tuple[Rows, Allowed, torch.Tensor]]:
    """Per pass: its rows (drawn from ``walks``), `restrict`'s answer, and random logits for them."""
    gen = torch.Generator().manual_seed(seed)
    for n in sizes:
        picks = torch.randint(len(walks), (n,), generator=gen).tolist()
        rows = [walks[i] for i in picks]
        yield rows, restrict(rows, lm.logits_width), torch.randn(n, lm.logits_width, generator=gen) * 3


class _Index:
    """A stand-in for ``fsm`` (and its index) that runs ``before`` ahead of each packed mask it reads there."""

    def __init__(self, fsm: TokenFSM, before: Callable[[], object]) -> None:
        self.logits_width, self.fsm, self.before = fsm.logits_width, fsm, before

    @property
    def index(self) -> _Index:
        return self

    def packed_mask(self, state: int) -> np.ndarray:
        self.before()
        return self.fsm.index.packed_mask(state)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("thread_rows", [1, masks.THREAD_ROWS])  # every pass on the worker; the shipped threshold
def test_overlapped_masks_equal_masks_filled_after_the_pass_bit_for_bit(walks: Rows, lm: FakeLM, device: str, thread_rows: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masks, "THREAD_ROWS", thread_rows)
    sizes = [1, 2, 7, 8, 9, 33, 64, 3, 64, 1]
    mixed = 0
    for rows, allowed, logits in passes(walks, lm, sizes):
        logits = logits.to(device)
        ours, theirs = logits.clone(), logits.clone()
        fill = MaskFill(rows, allowed, torch.device(device))
        fill.apply(ours)
        with monkeypatch.context() as never:
            never.setattr(masks, "THREAD_ROWS", len(rows) + 1)
            MaskFill(rows, allowed, torch.device(device)).apply(theirs)  # filled on this thread, after the forward
        assert torch.equal(ours, theirs)
        assert torch.equal(ours.cpu(), expected(logits.cpu(), rows, allowed))
        mixed += any(ids is None for ids in allowed) and any(ids is not None for ids in allowed)
    assert mixed >= 5, "the passes should mix restricted and full rows"


def test_the_masks_pool_fills_pass_after_pass(walks: Rows, lm: FakeLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masks, "THREAD_ROWS", 1)
    fillers = set()
    for rows, allowed, logits in passes(walks, lm, [5, 12, 1, 30] * 15, seed=1):
        watched = [(_Index(fsm, lambda: fillers.add(threading.current_thread().name)), state) for fsm, state in rows]
        ours = logits.clone()
        MaskFill(watched, allowed, torch.device("cpu")).apply(ours)
        assert torch.equal(ours, expected(logits, rows, allowed))
    assert fillers and all(name.startswith("structspec-masks") for name in fillers)


@pytest.mark.parametrize("thread_rows", [1, 100])
def test_a_pass_without_full_rows_changes_nothing(walks: Rows, lm: FakeLM, thread_rows: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masks, "THREAD_ROWS", thread_rows)
    narrow = [(fsm, state) for fsm, state in walks if restrict([(fsm, state)], lm.logits_width) != [None]]
    rows = narrow[:3] * 3
    logits = torch.randn(len(rows), lm.logits_width)
    ours = logits.clone()
    MaskFill(rows, restrict(rows, lm.logits_width), torch.device("cpu")).apply(ours)
    assert torch.equal(ours, logits)
    MaskFill([], [], torch.device("cpu")).apply(torch.empty(0, lm.logits_width))


def _boom() -> None:
    raise RuntimeError("the fill failed")


@pytest.mark.parametrize("thread_rows", [1, 100])  # on the worker; on the calling thread
def test_a_failing_fill_raises_from_apply(walks: Rows, lm: FakeLM, thread_rows: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masks, "THREAD_ROWS", thread_rows)
    fsm, state = next((fsm, state) for fsm, state in walks if restrict([(fsm, state)], lm.logits_width) == [None])
    failing = MaskFill([(_Index(fsm, _boom), state)] * 3, [None] * 3, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="the fill failed"):
        failing.apply(torch.randn(3, lm.logits_width))
    logits = torch.randn(3, lm.logits_width)  # the next pass is not hurt
    ours = logits.clone()
    MaskFill([(fsm, state)] * 3, [None] * 3, torch.device("cpu")).apply(ours)
    assert torch.equal(ours, expected(logits, [(fsm, state)] * 3, [None] * 3))


def test_a_mask_fill_returns_before_the_fill_ends(walks: Rows, lm: FakeLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(masks, "THREAD_ROWS", 1)
    fsm, state = next((fsm, state) for fsm, state in walks if restrict([(fsm, state)], lm.logits_width) == [None])
    gate, opened = threading.Event(), []
    gated = _Index(fsm, lambda: opened.append(gate.wait(timeout=10)))  # a fill on the caller's thread times out
    rows = [(gated, state), (fsm, state)]
    fill = MaskFill(rows, [None, None], torch.device("cpu"))
    gate.set()  # only once the fill was begun and `MaskFill` returned
    logits = torch.randn(2, lm.logits_width)
    ours = logits.clone()
    fill.apply(ours)
    assert opened == [True]
    assert torch.equal(ours, expected(logits, [(fsm, state)] * 2, [None, None]))
