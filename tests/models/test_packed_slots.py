"""`PackedSlots`: one KV sequence shared by a batch's rows, each row's window packed after the others', a
block-diagonal mask over it, holes instead of moved KV, shared prefix slots that survive compaction; on the
transformers LM's cache and on `FakeLM`'s alike, through the `KVCache` calls."""

from __future__ import annotations

import pytest
import torch

from structspec.models.packed_slots import PackedSlots
from structspec.models.transformers_kv import SlotKV
from structspec.testing.models import FakeKV

T, F = True, False


def test_a_packed_window_sees_its_rows_slots_and_its_own_ancestors_only() -> None:
    slots = PackedSlots(None, 2)  # the table alone: nothing here touches the KV
    slots.place(0, 2)  # row 0: slots 0, 1
    slots.place(1, 1)  # row 1: slot 2
    # row 0 feeds a pending token and two sibling roots (a tree), row 1 a chain of two
    mask = slots.window_mask([3, 2], [[-1, 0, 0], [-1, 0]])
    assert mask.shape == (1, 5, 3 + 5)
    assert mask[0].tolist() == [[T, T, F, T, F, F, F, F],
                                [T, T, F, T, T, F, F, F],
                                [T, T, F, T, F, T, F, F],  # the second root does not see its sibling
                                [F, F, T, F, F, F, T, F],  # row 1 sees its own slot, none of row 0's tokens
                                [F, F, T, F, F, F, T, T]]
    slots.keep([[0, 2], 1], [3, 2])  # row 0 keeps the pending token and the second root; row 1 a prefix of 1
    assert slots.valid.tolist() == [[T, T, F, T, F, T, F, F], [F, F, T, F, F, F, T, F]]


def _slot_kv(start: int, end: int) -> SlotKV:
    """The transformers LM's cache, one layer, slot ``t`` holding ``t`` in its keys and ``−t`` in its values."""
    keys = torch.arange(float(start), float(end)).expand(1, 2, end - start)[..., None].clone()
    return SlotKV([(keys, -keys)])


def _fake_kv(start: int, end: int) -> FakeKV:
    """FakeLM's cache, slot ``t`` holding token ``t``."""
    return FakeKV(list(range(start, end)))


def _held(cache: SlotKV | FakeKV) -> list[int]:
    """What each slot of ``cache`` holds (the transformers one: checking its values are its keys negated)."""
    if isinstance(cache, FakeKV):
        return cache.tokens
    layer = cache.layers[0]
    assert torch.equal(layer.values, -layer.keys) and torch.equal(layer.keys[0, 0], layer.keys[0, 1])
    return [int(t) for t in layer.keys[0, 0, :, 0]]


CACHES = pytest.mark.parametrize("kv", [_slot_kv, _fake_kv], ids=["transformers", "fake"])


@CACHES
def test_placing_a_row_appends_its_kv_and_leaves_its_old_slots_as_holes(kv) -> None:
    cache = kv(0, 3)
    slots = PackedSlots(cache, 2)
    slots.place(0, 3)  # what a pass already appended
    source = kv(10, 15)
    slots.place(1, 4, source)
    assert _held(cache) == [0, 1, 2, 10, 11, 12, 13] and _held(source) == [10, 11, 12, 13, 14]
    slots.place(0, 2, source)  # a refill: row 0's old slots become holes
    assert slots.valid.tolist() == [[F] * 7 + [T, T], [F] * 3 + [T] * 4 + [F, F]]
    slots.place(1, 0)  # an empty row: chunked prefill will feed its prompt
    assert not slots.valid[1].any()


@CACHES
def test_compaction_keeps_used_and_shared_slots_in_order_and_moves_the_shared_handles(kv) -> None:
    cache = kv(0, 300)
    slots = PackedSlots(cache, 2)
    slots.valid = torch.zeros(2, 300, dtype=torch.bool)
    handle = slots.place_shared(kv(1000, 1004), 3)  # slots 300..302, no row yet
    slots.valid[0, [5, 250]] = True
    slots.valid[1, [7]] = True
    slots.select([1, 0])  # rows swap: the table follows
    assert slots.valid[1, 250] and slots.compact()
    assert _held(cache) == [5, 7, 250, 1000, 1001, 1002]  # used slots, then the prefix
    assert slots.valid.tolist() == [[F, T, F, F, F, F], [T, F, T, F, F, F]]
    slots.place(0, 0, shared=handle)  # a new row of that spec attends to the prefix where it moved
    assert slots.valid[0].tolist() == [F, F, F, T, T, T]
    assert not slots.compact()


@CACHES
def test_a_copy_of_slots_is_its_own_and_appends_with_others_in_order(kv) -> None:
    cache = kv(0, 6)
    piece = cache.copy_slots(2, 5)
    cache.gather_slots(torch.tensor([5, 0]))  # the copy does not move with the cache
    assert _held(piece) == [2, 3, 4] and _held(cache) == [5, 0]
    cache.append_slots([piece, kv(7, 9)])
    assert _held(cache) == [5, 0, 2, 3, 4, 7, 8]
    assert cache.nbytes == 7 * kv(0, 1).nbytes > 0 and kv(0, 0).nbytes == 0
