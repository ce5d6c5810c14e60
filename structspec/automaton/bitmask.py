"""A caller's CPU bitmask, checked once: where its rows are, so a packed mask row is copied there by address.

An engine fills the same bitmask row after row, step after step. Checking the tensor each time (its type,
dtype, shape, device, strides) and taking numpy's view of it cost several times the copy of the row itself, so
`TokenFSM.fill_next_token_bitmask` checks a bitmask the first time it meets it and `remember`s it here, and later
calls ask `checked`: the same tensor object (a weak reference, so nothing is kept alive and a new tensor that
reuses a freed one's ``id`` is not taken for it), at the same address with the same shape and dtype (so a
tensor resized, or set to other storage, in place is checked again). The row is copied by the compiled core
(`copy_row`), or, without it, through numpy's view of the tensor.
"""

from __future__ import annotations

import weakref

import numpy as np
import torch

from structspec.automaton import dfa as dfa_module


class Rows:
    """A CPU int32 bitmask [count, words] whose rows are contiguous, as it was when checked: row ``r`` starts at
    ``address + r * pitch`` bytes."""

    __slots__ = ("tensor", "address", "shape", "count", "words", "pitch")

    def __init__(self, tensor: weakref.ref[torch.Tensor], address: int, shape: torch.Size, pitch: int) -> None:
        self.tensor, self.address, self.shape, self.pitch = tensor, address, shape, pitch
        self.count, self.words = shape

    def write(self, bitmask: torch.Tensor, row: int, packed: np.ndarray) -> None:
        """Copy ``packed`` (``words`` int32) into row ``row`` of ``bitmask`` (the tensor these rows are of, and
        ``0 ≤ row < count``: not checked here). Changes ``bitmask`` only."""
        core = dfa_module.CORE
        if core is not None:
            core.copy_row(self.address + row * self.pitch, packed)
        else:
            bitmask.numpy()[row] = packed


_CHECKED: dict[int, Rows] = {}  # id(bitmask) -> its rows; an entry leaves when its tensor is freed
_INT32 = torch.int32


def checked(bitmask: object) -> Rows | None:
    """The rows `remember` kept for ``bitmask``, or None if it kept none or the tensor changed since (another
    address, shape or dtype). Changes nothing."""
    rows = _CHECKED.get(id(bitmask))
    if (rows is None or rows.tensor() is not bitmask or bitmask.data_ptr() != rows.address  # type: ignore[attr-defined]
            or bitmask.shape != rows.shape or bitmask.dtype is not _INT32):  # type: ignore[attr-defined]
        return None
    return rows


def remember(bitmask: torch.Tensor) -> Rows | None:
    """Keep where the rows of ``bitmask`` (a 2-D torch.int32 tensor the caller checked) are, for `checked`, and
    return them; None (nothing kept) unless it is on the CPU with contiguous rows."""
    if bitmask.device.type != "cpu" or (bitmask.shape[1] > 1 and bitmask.stride(1) != 1):
        return None
    key = id(bitmask)

    def forget(ref: weakref.ref[torch.Tensor]) -> None:  # the tensor was freed: its id may be reused
        if (rows := _CHECKED.get(key)) is not None and rows.tensor is ref:
            del _CHECKED[key]

    rows = Rows(weakref.ref(bitmask, forget), bitmask.data_ptr(), bitmask.shape, 4 * bitmask.stride(0))
    _CHECKED[key] = rows
    return rows
