"""Token-tree verification: greedy output equals plain masked decoding, single-row and batched; a tree saves
target passes where a chain guesses wrong; the slot mask, positions and keep of a tree, exactly."""

from __future__ import annotations

import math
from typing import Literal

import pytest
import torch
from pydantic import BaseModel

import structspec
from structspec import Regex
from structspec.decoding.batch import decode_batch, spec_prefixes
from structspec.decoding import cost
from structspec.decoding.cost import FLAT_COST
from structspec.decoding.candidate import Candidate
from structspec.decoding.drafters.factory import make_drafter, make_row_drafter
from structspec.decoding.row import DecodeOptions, RowInput
from structspec.models.packed_slots import PackedSlots
from structspec.decoding.drafters.tree import TreeDrafter
from structspec.decoding.verify import accept_tree
from structspec.decoding.window import Window
from tests.numerics import logprobs_approx


class Character(BaseModel):
    name: str
    armor: Literal["leather", "plate", "chain"]
    weapon: Literal["sword", "axe", "bow"]
    strength: int


class Gear(BaseModel):
    armor: Literal["leather", "plate", "chain"]
    weapon: Literal["sword", "axe", "bow"]
    color: Literal["red", "green", "blue"]
    size: Literal["small", "large"]


# a document repeating phrases (prompt lookup matches several places), enum fields, strings to copy
DOC = ("The knight Aldric Stone wears plate and carries a sword. Aldric Stone is strong. "
       "The knight Aldric Stone rides north with the knight Mira Vale.")
CHOICES = Regex(r"([abc][xyz]){6}")  # at most a handful of tokens allowed anywhere: all of them are siblings
CASES = [(Character, DOC), (Gear, "Pick the gear."), (CHOICES, "Pick."),
         ({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, DOC)]
N = 48


def plain(lm: structspec.LM, spec: object, prompt: str, **options: object) -> structspec.Result:
    return structspec.generate_result(lm, spec, prompt, max_new_tokens=N, fast_forward="off", draft=None, **options)


def tree(lm: structspec.LM, spec: object, prompt: str, **options: object) -> structspec.Result:
    return structspec.generate_result(lm, spec, prompt, max_new_tokens=N, draft=TreeDrafter(), **options)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_tree_greedy_equals_plain_masked_decoding(kind: str, request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(kind)
    nodes = passes = accepted = 0
    for spec, prompt in CASES:
        base, got = plain(lm, spec, prompt), tree(lm, spec, prompt)
        assert got.token_ids == base.token_ids, spec
        assert got.stop_reason == base.stop_reason
        nodes, passes = nodes + got.stats.tree_nodes, passes + got.stats.target_forward_passes
        accepted += got.stats.drafts["tree"].accepted
    assert nodes > 2 * passes and accepted > 0  # trees, not chains, were fed, and some branch was verified


@pytest.mark.slow
def test_tree_logprobs_equal_plain_logprobs(byte_lm: structspec.LM) -> None:
    base = plain(byte_lm, Character, DOC, output_logprobs=True)
    got = tree(byte_lm, Character, DOC, output_logprobs=True)
    assert got.token_ids == base.token_ids
    assert got.logprobs == logprobs_approx(base.logprobs, byte_lm.dtype)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_batched_tree_rows_equal_plain_and_the_row_alone(kind: str, request: pytest.FixtureRequest,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    lm = request.getfixturevalue(kind)
    monkeypatch.setattr(cost, "prior_cost", lambda lm: FLAT_COST)  # every window whole, as alone
    specs, prompts = [spec for spec, _ in CASES] * 2, [prompt for _, prompt in CASES] * 2
    base = [plain(lm, spec, prompt) for spec, prompt in zip(specs, prompts)]
    alone = [tree(lm, spec, prompt) for spec, prompt in zip(specs, prompts)]
    ids = [lm.encode_prompt(prompt) for prompt in prompts]
    for batch_size in (1, 3, 5):
        rows = [RowInput(i, structspec.compile(spec, lm).fsm, p, TreeDrafter(), None)
                for i, (spec, p) in enumerate(zip(specs, ids))]
        out = dict(decode_batch(lm, iter(rows), DecodeOptions(N), batch_size, FLAT_COST, spec_prefixes(rows)))
        assert [out[i].token_ids for i in range(len(rows))] == [r.token_ids for r in base], batch_size
        assert [out[i].stop_reason for i in range(len(rows))] == [r.stop_reason for r in base]
        # the same trees in any batch: the same passes choose the same tokens
        passes = [out[i].stats.target_forward_passes for i in range(len(rows))]
        assert passes == [r.stats.target_forward_passes for r in alone], batch_size


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_a_tree_saves_passes_where_the_chain_guesses_wrong(kind: str, request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(kind)
    for spec, prompt in [(CHOICES, "Pick."), (Gear, "Pick the gear.")]:
        chain = structspec.generate_result(lm, spec, prompt, max_new_tokens=N, draft="prompt_lookup")
        got = tree(lm, spec, prompt)
        assert got.token_ids == chain.token_ids
        assert got.stats.target_forward_passes < chain.stats.target_forward_passes, spec
    # every allowed token is a sibling at the root, so each pass keeps at least one verified token and the
    # target's next: at most half as many passes as tokens
    got = tree(lm, CHOICES, "Pick.")
    assert got.stats.target_forward_passes <= math.ceil(len(got.token_ids) / 2)


@pytest.mark.slow
def test_sampled_rows_draft_chains(byte_lm: structspec.LM) -> None:
    drafter = TreeDrafter()
    assert make_drafter(drafter, byte_lm) is drafter  # a Drafter: draft= takes the instance as it is
    copied = make_row_drafter(drafter, byte_lm)  # a batch row gets its own copy of a tree drafter
    assert isinstance(copied, TreeDrafter) and copied is not drafter and copied.max_nodes == drafter.max_nodes
    got = tree(byte_lm, Character, DOC, do_sample=True, seed=3)
    assert got.stats.tree_nodes == 0
    assert got.complete or got.stop_reason == "max_new_tokens"


def test_accept_tree_follows_the_targets_choice_from_the_root() -> None:
    tokens, parents = [5, 7, 9, 9, 4], [-1, -1, 0, 1, 3]  # two roots; node 3 (9) under node 1 (7), 4 under 3
    assert accept_tree([7, 0, 9, 1, 4, 8], tokens, parents) == ([1, 3, 4], 8)
    assert accept_tree([7, 0, 9, 1, 2, 8], tokens, parents) == ([1, 3], 2)
    assert accept_tree([5, 9, 0, 0, 0, 0], tokens, parents) == ([0, 2], 0)
    assert accept_tree([6, 0, 0, 0, 0, 0], tokens, parents) == ([], 6)
    assert accept_tree([1, 2, 3], [1, 2], [-1, 0]) == ([0, 1], 3)  # a chain is the tree with parents i − 1
    assert accept_tree([1, 0, 3], [1, 2], [-1, 0]) == ([0], 0)


def test_tree_window_mask_positions_and_keep() -> None:
    tree = Candidate([5, 7, 9], [0, 0, 0], ["tree"] * 3, [None] * 3, parents=[-1, -1, 0])
    window = Window(None, (11,), tree, start=2, state=0)  # type: ignore[arg-type]  # no FSM: nothing masks here
    assert window.parents == [-1, 0, 0, 1]  # both roots follow the pending token
    assert window.positions == [2, 3, 3, 4]  # siblings share a position
    slots = PackedSlots(None, 2)  # the hole table alone: nothing here touches the KV
    slots.place(0, 2)  # row 0 holds 2 prompt slots (0, 1), row 1 one (2)
    slots.place(1, 1)
    mask = slots.window_mask([4, 2], [window.parents, [-1, 0]])  # [1, 4 + 2, 3 + 6]: row 0's window, then row 1's
    T, F = True, False
    assert mask[0].tolist() == [[T, T, F, T, F, F, F, F, F],
                                [T, T, F, T, T, F, F, F, F],
                                [T, T, F, T, F, T, F, F, F],  # the second root sees the pending token, not its sibling
                                [T, T, F, T, T, F, T, F, F],  # node 2 sees its parent (the first root), not the second
                                [F, F, T, F, F, F, F, T, F],  # row 1 sees its own slot, none of row 0's tokens
                                [F, F, T, F, F, F, F, T, T]]
    assert torch.equal(slots.window_mask([4, 2], [[-1, 0, 1, 2], [-1, 0]]), slots.window_mask([4, 2]))
    slots.keep([[0, 2], 1], [4, 2])  # row 0 keeps the pending token and the second root; row 1 a prefix of 1
    assert slots.valid.tolist() == [[T, T, F, T, F, T, F, F, F], [F, F, T, F, F, F, F, T, F]]
