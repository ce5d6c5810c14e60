"""Many prompts decoded ``batch_size`` rows per target pass, each row with its own compiled spec; a row that
cannot run is a `Result` with ``stop_reason="error"``, the other rows unaffected."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from structspec.decoding.batch import RowInput, decode_batch, shared_prefix
from structspec.decoding.drafters import Drafter, make_drafter
from structspec.errors import OptionError, StructspecError, UnspellableError
from structspec.events import decode_events, prompt_ids_of, result_of
from structspec.models.protocol import Prompt
from structspec.models.transformers_lm import LM
from structspec.options import check_option, check_prompt
from structspec.result import Result, Stats

if TYPE_CHECKING:
    from structspec.compiled import Compiled
    from structspec.settings import GenerateOptions


def check_batch(prompts: Any, options: GenerateOptions, batch_size: Any) -> int:
    """``batch_size`` as an int; `OptionError` unless ``prompts`` is a list and ``options`` suit a batch.
    Changes nothing."""
    if not isinstance(prompts, list):
        raise OptionError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
    if isinstance(options.draft, Drafter):
        raise OptionError("a Drafter instance holds one row's state: pass a drafter name or a loaded LM")
    return check_option("batch_size", batch_size)


def decode_rows(
    lm: LM, specs: list[Compiled | StructspecError], prompts: list[Prompt], options: GenerateOptions,
    batch_size: int,
) -> Iterator[tuple[int, Result]]:
    """Yield ``(index, Result)`` as each row finishes, prompt ``i`` decoded under ``specs[i]`` (an error there
    is that row's `Result`). A finished row's place is refilled with the next prompt; the prompts' shared token
    prefix is prefilled once. Row ``i`` samples from its own generator seeded with ``seed + i``."""
    rows: list[RowInput] = []
    for i, (compiled, prompt) in enumerate(zip(specs, prompts)):
        try:
            if isinstance(compiled, StructspecError):
                raise compiled
            check_prompt(prompt)
            generator = torch.Generator().manual_seed(options.seed + i) if options.seed is not None else None
            rows.append(RowInput(i, compiled.fsm, prompt_ids_of(lm, prompt), make_drafter(options.draft, lm),
                                 generator))
        except StructspecError as error:
            yield i, Result(None, "", [], "error", Stats(), error=in_row(error, i))
    prefix = shared_prefix([row.prompt_ids for row in rows])
    todo = {row.index: row for row in rows}
    while todo:
        taken: list[int] = []  # rows the batch has started
        try:
            for i, decoded in decode_batch(lm, _taking(list(todo.values()), taken), options.decode_options(),
                                           batch_size, prefix):
                del todo[i]
                yield i, result_of(specs[i], decoded)  # type: ignore[arg-type]
        except UnspellableError:
            # The batch cannot say whose state it was: its rows in flight are decoded again, each alone (as the
            # batch would have, seeded alike), and the one that reaches the state gets its partial output.
            for i in [i for i in taken if i in todo]:
                yield i, _alone(specs[i], todo.pop(i).prompt_ids, options, i)  # type: ignore[arg-type]


def collected(count: int, results: Iterator[tuple[int, Result]]) -> list[Result]:
    """The ``count`` results of ``results`` in their rows' order."""
    ordered: list[Result | None] = [None] * count
    for i, result in results:
        ordered[i] = result
    return ordered  # type: ignore[return-value]


def in_row(error: StructspecError, row: int) -> StructspecError:
    """``error`` with the batch row it concerns in its message (its type and fields unchanged)."""
    error.args = (f"row {row}: {error}",)
    error.row = row  # type: ignore[attr-defined]
    return error


def _taking(rows: list[RowInput], taken: list[int]) -> Iterator[RowInput]:
    """``rows``, each one's index appended to ``taken`` as it is taken."""
    for row in rows:
        taken.append(row.index)
        yield row


def _alone(compiled: Compiled, prompt_ids: list[int], options: GenerateOptions, row: int) -> Result:
    """Batch row ``row`` decoded on its own, seeded as in the batch; reaching a state the vocabulary cannot
    spell on from, its `Result` is the partial output with the error (naming the row) in ``error``."""
    seeded = replace(options, seed=None if options.seed is None else options.seed + row)
    try:
        *_, finished = decode_events(compiled, prompt_ids, seeded, fields=False)
    except UnspellableError as error:
        in_row(error, row)
        return error.result
    return finished.result  # type: ignore[union-attr]
