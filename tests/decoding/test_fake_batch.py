"""Batches, token trees and lookahead on `FakeLM` (no network): every batched row equals the same row decoded alone,
bit for bit, in every draft mode, with refill, mixed specs and prompt lengths; and the fake's slot pass sees exactly
the slots its mask allows, so the oracle would catch a wrong mask, a kept rejected token or a wrong position."""

from __future__ import annotations

from functools import cache
from typing import Annotated, Literal

import pytest
import torch
from pydantic import BaseModel, Field

import structspec
from structspec import Regex
from structspec.models.packed_slots import PackedSlots
from structspec.models.prefix_cache import CHUNK
from structspec.testing import FakeLM


class Order(BaseModel):
    customer: Annotated[str, Field(pattern=r"[A-Z][a-z]{1,8}")]
    city: Literal["Paris", "London", "Tokyo", "Berlin"]
    paid: bool


# mixed specs and prompt lengths (one over a prefill chunk): rows finish at different times and are refilled
SPECS = [Order, Regex(r"(red|green|blue) (small|large) [a-z]{2,6}"), Order,
         {"type": "array", "items": {"enum": ["Oslo", "Lima"]}, "maxItems": 3}, Regex(r"[a-z]{3,30}"), Order,
         Regex(r"(yes|no)"), {"type": "string"}]
PROMPTS = ['Alice from Paris, paid: true. {"customer": "Alice", "city": "Paris", "paid": true}', "Bob",
           "Carol from London has not paid. " * 6, "x y z", "Dave, Tokyo", "Eve paid.", "Is it?",
           "Frank from Berlin, paid: false. Frank lives in Berlin."]
MODES = {"off": {"fast_forward": "off"}, "exact": {}, "prompt_lookup": {"draft": "prompt_lookup"},
         "self": {"draft": structspec.SelfDraft()}, "staged": {"draft": structspec.Staged()},
         "tree": {"draft": structspec.TreeDrafter()}, "lookahead": {"draft": "lookahead"}}
N = 32


def alone(lm: FakeLM, **options: object) -> list[structspec.Result]:
    return [structspec.generate_result(lm, s, p, max_new_tokens=N, **options) for s, p in zip(SPECS, PROMPTS)]


@cache
def alone_in(mode: str) -> tuple[structspec.Result, ...]:
    """Each row decoded alone in ``mode`` on a fresh `FakeLM` (the oracle; deterministic, so computed once)."""
    return tuple(alone(FakeLM(), **MODES[mode]))


def batched(lm: FakeLM, batch_size: int, **options: object) -> list[structspec.Result]:
    return structspec.generate_batch(lm, SPECS, PROMPTS, batch_size=batch_size, max_new_tokens=N, **options)


@pytest.mark.parametrize("mode", list(MODES))
def test_every_batched_row_equals_the_row_decoded_alone(mode: str) -> None:
    single = alone_in(mode)
    assert {r.stop_reason for r in single} >= {"fsm_complete", "max_new_tokens"}  # rows end at different times
    lm = FakeLM()
    batch = batched(lm, 3, **MODES[mode])  # 8 rows 3 at a time: refilled as rows finish
    assert [(r.token_ids, r.stop_reason) for r in batch] == [(r.token_ids, r.stop_reason) for r in single]
    # a batch feeds a row its window or less (drafts that do not pay are cut), never more
    assert all(b.stats.target_forward_passes >= a.stats.target_forward_passes for a, b in zip(single, batch))
    assert lm.passes < sum(r.stats.target_forward_passes + r.stats.prefill_passes for r in single)


def test_plain_rows_take_one_shared_pass_per_token_and_a_prefill_each() -> None:
    lm = FakeLM()
    single = alone_in("off")
    batch = batched(lm, 8, fast_forward="off")  # every row at once
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    assert [r.stats.target_forward_passes for r in batch] == [r.stats.target_forward_passes for r in single]
    # every row is in every pass until it stops: the longest row's passes, plus a prefill per prompt (but a
    # one-token prompt, fed by its first pass)
    assert [r.stats.prefill_passes for r in batch] == [int(len(lm.encode_prompt(p)) > 1) for p in PROMPTS]
    assert lm.passes == max(r.stats.target_forward_passes for r in single) + sum(r.stats.prefill_passes for r in batch)


@pytest.mark.parametrize("declared", ["not_invariant", "capped"])
def test_shared_prefix_chunked_prefill_and_a_capped_pass_keep_every_row(declared: str) -> None:
    # The fake is batch-invariant whatever it declares: declared otherwise, the batch takes its other paths (a
    # spec's shared prompt prefix, prompts fed by the decode passes; a cap on a pass's tokens), which must still
    # give each row exactly its tokens alone.
    def lm() -> FakeLM:
        fake = FakeLM()
        if declared == "not_invariant":
            fake.batch_invariant = False
        else:
            fake.max_pass_tokens = 6
        return fake

    instruction = "Extract the order as JSON with the customer's first name and city. Text: "
    prompts = [instruction + p for p in PROMPTS]
    options = {"max_new_tokens": N, "draft": "prompt_lookup"}
    single = [structspec.generate_result(lm(), s, p, **options) for s, p in zip(SPECS, prompts)]
    batch = structspec.generate_batch(lm(), SPECS, prompts, batch_size=4, **options)
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    if declared == "not_invariant":  # Order's three rows share the instruction's slots
        reused = [r.stats.prefix_tokens_reused for r, s in zip(batch, SPECS) if s is Order]
        assert len(set(reused)) == 1 and reused[0] >= len(FakeLM().encode_prompt(instruction)) - 2


def test_sampled_rows_keep_their_samples_in_a_batch() -> None:
    for mode in ("prompt_lookup", "self"):
        batch = batched(FakeLM(), 3, seed=5, temperature=1.0, **MODES[mode])
        for i, (spec, prompt) in enumerate(zip(SPECS, PROMPTS)):
            one = structspec.generate_result(FakeLM(), spec, prompt, seed=5 + i, temperature=1.0, max_new_tokens=N,
                                             **MODES[mode])
            assert one.token_ids == batch[i].token_ids, (mode, i)


def test_compacted_holes_keep_every_row(monkeypatch: pytest.MonkeyPatch) -> None:
    compactions: list[bool] = []  # per call: whether it gathered (the target's slots and the draft model's)
    counted = PackedSlots.compact
    monkeypatch.setattr(PackedSlots, "compact", lambda slots: compactions.append(counted(slots)) or compactions[-1])
    monkeypatch.setattr(PackedSlots, "slack", 0)  # compact as soon as holes outnumber used slots
    single = alone_in("lookahead")
    batch = batched(FakeLM(), 3, draft="lookahead")
    assert sum(compactions) >= 2
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]


def test_trees_and_lookahead_alone_equal_plain_masked_decoding_in_fewer_passes() -> None:
    plain = alone_in("off")
    for mode in ("tree", "lookahead"):
        lm = FakeLM()
        drafted = alone(lm, **MODES[mode])
        assert [r.token_ids for r in drafted] == [r.token_ids for r in plain], mode
        assert lm.passes == sum(r.stats.target_forward_passes + r.stats.prefill_passes for r in drafted)
        assert sum(r.stats.target_forward_passes for r in drafted) < sum(r.stats.target_forward_passes for r in plain)
        assert lm.fed == [n for r in drafted for n in r.stats.tokens_fed], mode  # every pass, counted by the model


def test_a_long_prompt_reuses_the_held_chunks_of_an_earlier_one() -> None:
    lm = FakeLM()
    head = "The ledger of the northern warehouse lists every order. " * 12  # over two chunks
    prompts = [head + "Alice from Paris paid.", head + "Bob from Tokyo did not pay."]
    assert len(lm.encode_prompt(head)) > 2 * CHUNK
    batch = structspec.generate_batch(lm, Order, prompts, batch_size=2, max_new_tokens=N)
    single = [structspec.generate_result(FakeLM(), Order, p, max_new_tokens=N) for p in prompts]
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    # the second prompt's whole chunks before its last token, all within the shared head, come from the first's
    assert [r.stats.prefix_tokens_reused for r in batch] == [0, (len(lm.encode_prompt(head)) - 1) // CHUNK * CHUNK]


def _pass(lm: FakeLM, cache: object, window: list[int], positions: list[int], attend: torch.Tensor) -> torch.Tensor:
    return lm.forward_slots([window], [positions], attend[None], cache, [(0, j) for j in range(len(window))])


def test_the_slot_pass_sees_exactly_the_slots_its_mask_allows() -> None:
    lm = FakeLM()
    a, b = [5, 6, 7], [8, 9]
    alone_a = lm.forward(a, lm.new_cache(), 3)
    alone_b = lm.forward(b, lm.new_cache(), 2)
    T, F = True, False
    # rows a and b packed in one window, each seeing its own tokens, causally
    mask = torch.tensor([[T, F, F, F, F], [T, T, F, F, F], [T, T, T, F, F], [F, F, F, T, F], [F, F, F, T, T]])
    packed = _pass(lm, lm.new_cache(), a + b, [0, 1, 2, 0, 1], mask)
    assert torch.equal(packed, torch.cat([alone_a, alone_b]))
    leaky = mask.clone()
    leaky[4, 2] = True  # b's second token also sees a's last: another prefix, other logits
    assert torch.equal(_pass(lm, lm.new_cache(), a + b, [0, 1, 2, 0, 1], leaky)[:4], packed[:4])
    assert not torch.equal(_pass(lm, lm.new_cache(), a + b, [0, 1, 2, 0, 2], leaky)[4], packed[4])
    assert not torch.equal(_pass(lm, lm.new_cache(), a + b, [0, 1, 2, 0, 2], mask)[4], packed[4])  # position
    # a rejected sibling: kept as a slot the next token attends to, the logits change; a hole, they do not
    cache = lm.new_cache()
    _pass(lm, cache, [5, 6, 1], [0, 1, 1], torch.tensor([[T, F, F], [T, T, F], [T, F, T]]))  # 6 and 1 siblings
    kept = _pass(lm, cache, [7], [2], torch.tensor([[T, T, F, T]]))
    assert torch.equal(kept, alone_a[2:])
    assert not torch.equal(_pass(lm, cache, [7], [2], torch.tensor([[T, T, T, F, T]])), alone_a[2:])


def test_a_draft_model_drafts_for_all_rows_in_shared_packed_passes() -> None:
    draft = FakeLM(seed=7)  # another fake: its drafts are mostly rejected
    read: list[int] = []  # per draft slot pass: the rows whose logits it read
    forward_slots = draft.forward_slots
    draft.forward_slots = lambda *a, **k: (read.append(len(a[4])), forward_slots(*a, **k))[1]
    single = alone(FakeLM(), draft=FakeLM(seed=7))
    batch = batched(FakeLM(), 4, draft=draft)
    assert [r.token_ids for r in batch] == [r.token_ids for r in single]
    stats = [r.stats.drafts["draft_model"] for r in batch]
    assert sum(d.drafted for d in stats) > sum(d.accepted for d in stats) > 0
    assert max(read) == 4  # one draft pass serves every row of the batch
    assert len(read) < sum(d.draft_passes for d in stats)


def test_staged_drafting_shares_the_packed_draft_passes_of_the_batch() -> None:
    # Staged self-draft checks a prompt-lookup guess in a draft pass: in a batch every asking row's new tokens and
    # guess ride in one pass over the batch's packed draft cache, not a pass over a cache of the row's own.
    lm = FakeLM()
    draft = lm.early_exit()  # the model `Staged()` drafts with: made once, so every row shares it
    batch = batched(lm, 4, draft=structspec.Staged())
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone_in("staged")]
    stats = [r.stats.drafts["staged_self_draft"] for r in batch]
    assert sum(d.drafted for d in stats) > 0
    assert 0 < draft.passes < sum(d.draft_passes for d in stats)  # shared passes, each counted once
