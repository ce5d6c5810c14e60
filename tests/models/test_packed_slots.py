"""`PackedSlots`: one KV sequence shared by a batch's rows, each row's window packed after the others', a
block-diagonal mask over it, holes instead of moved KV, shared prefix slots that survive compaction."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from structspec.models.packed_slots import PackedSlots

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


def _cache(slots: int) -> SimpleNamespace:
    """A one-layer cache whose slot ``t`` holds ``t`` in its keys and ``−t`` in its values (1 row, 2 heads)."""
    keys = torch.arange(float(slots)).expand(1, 2, slots)[..., None].clone()
    return SimpleNamespace(layers=[SimpleNamespace(is_initialized=True, keys=keys, values=-keys)])


def test_placing_a_row_appends_its_kv_and_leaves_its_old_slots_as_holes() -> None:
    cache = _cache(3)
    slots = PackedSlots(cache, 2)
    slots.place(0, 3)  # what a pass already appended
    source = _cache(5)
    slots.place(1, 4, source)
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [0, 1, 2, 0, 1, 2, 3]
    slots.place(0, 2, source)  # a refill: row 0's old slots become holes
    assert slots.valid.tolist() == [[F] * 7 + [T, T], [F] * 3 + [T] * 4 + [F, F]]
    slots.place(1, 0)  # an empty row: chunked prefill will feed its prompt
    assert not slots.valid[1].any()


def test_compaction_keeps_used_and_shared_slots_in_order_and_moves_the_shared_handles() -> None:
    cache = _cache(300)
    slots = PackedSlots(cache, 2)
    slots.valid = torch.zeros(2, 300, dtype=torch.bool)
    shared = _cache(4)
    handle = slots.place_shared(shared, 3)  # slots 300..302, no row yet
    slots.valid[0, [5, 250]] = True
    slots.valid[1, [7]] = True
    slots.select([1, 0])  # rows swap: the table follows
    assert slots.valid[1, 250] and slots.compact()
    assert cache.layers[0].keys[0, 1, :, 0].tolist() == [5, 7, 250, 0, 1, 2]  # used slots, then the prefix
    assert torch.equal(cache.layers[0].values, -cache.layers[0].keys)
    assert slots.valid.tolist() == [[F, T, F, F, F, F], [T, F, T, F, F, F]]
    slots.place(0, 0, shared=handle)  # a new row of that spec attends to the prefix where it moved
    assert slots.valid[0].tolist() == [F, F, F, T, T, T]
    assert not slots.compact()
