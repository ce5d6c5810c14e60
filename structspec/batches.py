"""Many prompts decoded ``batch_size`` rows per target pass, each row with its own compiled spec; a row that
cannot run is a `Result` with ``stop_reason="error"``, the other rows unaffected."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from structspec.checks import check_option, check_prompt
from structspec.decoding.batch import decode_batch, spec_prefixes
from structspec.decoding.cost import pass_cost
from structspec.decoding.drafters.factory import check_row_draft, make_row_drafter
from structspec.decoding.row import RowInput
from structspec.errors import OptionError, StructspecError
from structspec.events import CompiledSpec, prompt_ids_of, result_of
from structspec.models.protocol import Prompt
from structspec.models.transformers_lm import LM
from structspec.options import GenerateOptions
from structspec.result import Result, Stats


def check_batch(prompts: Any, options: GenerateOptions, batch_size: Any) -> int:
    """``batch_size`` as an int; `OptionError` unless ``prompts`` is a list and ``options`` suit a batch.
    Changes nothing."""
    if not isinstance(prompts, list):
        raise OptionError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
    check_row_draft(options.draft)
    return check_option("batch_size", batch_size)


def decode_rows(
    lm: LM, specs: list[CompiledSpec | StructspecError], prompts: list[Prompt], options: GenerateOptions,
    batch_size: int,
) -> Iterator[tuple[int, Result]]:
    """Yield ``(index, Result)`` as each row finishes, prompt ``i`` decoded under ``specs[i]`` (an error there
    is that row's `Result`). A finished row's place is refilled with the next prompt; the shared token prefix of
    each spec's prompts is prefilled once where the model allows (`decode_batch`). Row ``i`` samples from its own
    generator seeded with ``seed + i``. Runs the model as the results are read."""
    rows: list[RowInput] = []
    for i, (compiled, prompt) in enumerate(zip(specs, prompts)):
        try:
            if isinstance(compiled, StructspecError):
                raise compiled
            check_prompt(prompt)
            generator = torch.Generator().manual_seed(options.seed + i) if options.seed is not None else None
            rows.append(RowInput(i, compiled.fsm, prompt_ids_of(compiled, prompt), make_row_drafter(options.draft, lm),
                                 generator))
        except StructspecError as error:
            yield i, Result(None, "", [], "error", Stats(), error=in_row(error, i))
    prefixes = spec_prefixes(rows)
    cost = pass_cost(lm)  # the model's curve, read once for every row
    for i, decoded in decode_batch(lm, iter(rows), options.decode_options(), batch_size, cost, prefixes):
        result = result_of(specs[i], decoded)  # type: ignore[arg-type]
        if result.stop_reason == "error":
            in_row(result.error, i)  # type: ignore[arg-type]
        yield i, result


def collected(count: int, results: Iterator[tuple[int, Result]]) -> list[Result]:
    """The ``count`` results of ``results`` in their rows' order."""
    ordered: list[Result | None] = [None] * count
    for i, result in results:
        ordered[i] = result
    return ordered  # type: ignore[return-value]


def in_row(error: StructspecError, row: int) -> StructspecError:
    """``error``, changed to name the batch row it concerns in its message and ``row`` (its type and other fields
    unchanged)."""
    error.args = (f"row {row}: {error}",)
    error.row = row  # type: ignore[attr-defined]
    return error

