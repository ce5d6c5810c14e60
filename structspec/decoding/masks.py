"""A target pass's masks: which logits rows need the whole LM head, and the bitmask of those, filled while the
model runs.

A pass's logits rows are known before it runs (`pass_masks`: per window, a row per
state in `Window.states`), so their masks need not wait for its logits; those not computed yet (first visits)
are computed on several threads first (`structspec.decoding.fill.compute_masks`). A row whose
state allows few ids gets logits for those ids only (`restrict`: the LM head computes
only them, and no mask is needed); the rest get the whole head and a bitmask.
A `MaskFill` packs that bitmask on a worker thread of the masks' pool (on CUDA into pinned
memory, copied to the device on a side stream) during the forward pass, and
`MaskFill.apply` masks the logits when they come back. Passes with fewer than
`THREAD_ROWS` full rows are filled by `apply` itself, after the forward: there
the handoff costs more than the fill, and on CUDA the fill still runs while the device computes
the kernels the forward queued.

Typical use, around one pass::

    allowed, masks = pass_masks(windows, lm.logits_width, lm.device)
    logits = lm.forward(window.tokens, cache, len(window.states), allowed)
    masks.apply(logits)
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from structspec.automaton.fsm import TokenFSM, apply_token_bitmask_inplace
from structspec.decoding.fill import compute_masks, submit
from structspec.decoding.window import Window
from structspec.models.protocol import Allowed

FEW = 1 / 16  # a state allowing under this share of the logits gets logits for its allowed ids only

THREAD_ROWS = 64
"""Full rows from which a `MaskFill` is filled on the worker thread; fewer are filled by `apply`. Measured on the
shared 2-core CPU machine at Qwen2.5's 151,936 logits (4,748 words a row; packed rows cached), quiet to loaded:
the fill takes 15–45 µs for 1 row, 25–155 µs for 8, 55–290 µs for 32, 100–450 µs for 64; a handoff to the idle
worker and back 60–230 µs. The fill reaches the handoff at about 64 rows, and even there a threaded pass ranged
from 0.7 ms faster to 2.3 ms slower than one filled after the forward (slower with a stand-in forward that holds
the GIL between short calls, as a CUDA forward's host side does, or while other processes held the second core)."""

Filled = tuple[torch.Tensor, torch.cuda.Event | None]
"""A bitmask on the logits' device, and on CUDA the event that marks the end of its copy there."""

_side_streams: dict[torch.device, torch.cuda.Stream] = {}  # per CUDA device, the stream the masks are copied on


def pass_masks(windows: list[Window], width: int, device: torch.device) -> tuple[Allowed, MaskFill]:
    """The masks of one pass over ``windows`` (packed in order) with logits ``width`` wide on ``device``: per logits
    row, `restrict`'s answer, and the `MaskFill` of the full rows, begun; the masks not computed yet computed
    on several threads first. Changes nothing the caller holds."""
    rows = [(window.fsm, state) for window in windows for state in window.states]
    compute_masks(rows)
    allowed = restrict(rows, width)
    return allowed, MaskFill(rows, allowed, device)


def restrict(rows: list[tuple[TokenFSM, int]], width: int) -> Allowed:
    """Per logits row (its FSM and the state it is masked by): the allowed ids where they are few, so the
    LM head computes only those and the row needs no mask; None where the row needs the whole head and
    the bitmask. A state allowing one token needs no logits at all (`Allowed`). Changes nothing."""
    out: Allowed = []
    for fsm, state in rows:
        ids = fsm.allowed_token_ids(state)
        out.append(torch.tensor(ids, dtype=torch.long) if len(ids) < FEW * width else None)
    return out


class MaskFill:
    """The packed bitmask of one pass's full logits rows (those `restrict` leaves None), applied to its logits:
    filled on the worker thread while the model runs (from `THREAD_ROWS` full rows on), else by `apply` on the
    calling thread."""

    def __init__(self, rows: list[tuple[TokenFSM, int]], allowed: Allowed, device: torch.device) -> None:
        """The masks of ``rows`` (per logits row, its FSM and the state that masks it) that ``allowed``
        (`restrict`'s answer for them) leaves full, for logits on ``device``: from `THREAD_ROWS` full rows on, their
        fill begun on the worker thread (not waited for: leave ``rows`` unchanged until `apply`). Changes nothing
        the caller holds."""
        self._rows = rows
        self._full = [i for i, ids in enumerate(allowed) if ids is None]
        self._filled = _submit(rows, self._full, _indexed(device)) if len(self._full) >= THREAD_ROWS else None

    def apply(self, logits: torch.Tensor) -> None:
        """Mask the full rows of ``logits`` (one row per row given, on the device given) in one
        operation; the restricted rows hold their allowed ids only already and are left alone. Waits for the
        worker's fill and raises what it raised, or fills on the calling thread. Changes ``logits``."""
        if not self._full:
            return
        if self._filled is None:
            bitmask, copied = _fill(self._rows, self._full, logits.device)
        else:
            bitmask, copied = self._filled.result()
        if copied is not None:
            stream = torch.cuda.current_stream(bitmask.device)
            stream.wait_event(copied)
            bitmask.record_stream(stream)  # allocated on the side stream: not reused until this stream is done
        if len(self._full) == len(logits):
            apply_token_bitmask_inplace(logits, bitmask)
        else:
            masked = logits[self._full]
            apply_token_bitmask_inplace(masked, bitmask)
            logits[self._full] = masked


def _fill(rows: list[tuple[TokenFSM, int]], full: list[int], device: torch.device) -> Filled:
    """The packed masks of ``rows[i]`` for each i in ``full``, one row each, on ``device`` (on CUDA through
    pinned memory: `_to_device`). Changes nothing."""
    cuda = device.type == "cuda"
    words = -(-rows[full[0]][0].logits_width // 32)
    # every row is written below, so no initial value; pinned memory lets the copy run asynchronously
    bitmask = torch.empty((len(full), words), dtype=torch.int32, pin_memory=cuda)
    packed = bitmask.numpy()
    for r, i in enumerate(full):
        fsm, state = rows[i]
        # the index's row as is: the decode's own states need none of `fill_next_token_bitmask`'s argument checks
        packed[r] = fsm.packed_mask(state)
    return _to_device(bitmask, device) if cuda else (bitmask, None)


def _to_device(bitmask: torch.Tensor, device: torch.device) -> Filled:
    """The pinned ``bitmask`` copied to the CUDA ``device`` on its side stream, not waited for. Changes nothing."""
    if device not in _side_streams:
        _side_streams[device] = torch.cuda.Stream(device)
    side = _side_streams[device]
    with torch.cuda.stream(side):
        on_device = bitmask.to(device, non_blocking=True)
    return on_device, side.record_event()


def _submit(rows: list[tuple[TokenFSM, int]], full: list[int], device: torch.device) -> Future[Filled]:
    """`_fill` on the masks' thread pool. Changes nothing the caller holds."""
    return submit(_fill, rows, full, device)


def _indexed(device: torch.device) -> torch.device:
    """``device`` with its index: a bare "cuda" is the caller's current device, which the worker does not share."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device
