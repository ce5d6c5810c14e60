"""The public entry points: `compile`, `generate`, `generate_result`, `generate_batch`, `iter_batch`.

Typical use::

    import structspec
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    lm = structspec.load("smollm2-135m")
    person = structspec.generate(lm, Person, "Alice is 31. As JSON:")
    results = structspec.generate_batch(lm, Person, ["Alice is 31.", "Bob is 45."], batch_size=8)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jsonschema
import pydantic
import torch

from structspec.automaton import fsm as _fsm
from structspec.automaton.fsm import TokenFSM
from structspec.decoding.batch import RowInput, decode_batch, shared_prefix
from structspec.decoding.drafters import Drafter, make_drafter
from structspec.decoding.fastforward import FastForward
from structspec.decoding.loop import decode
from structspec.decoding.row import Decoded, DecodeOptions
from structspec.decoding.sampling import SamplingConfig
from structspec.errors import InvalidOutput, OptionError, PromptError, StructspecError, TokenBudgetExceeded
from structspec.lm import LM, Prompt, load
from structspec.result import Result, Stats
from structspec.schema import COMPACT, Constraint, constraint_of
from structspec.schema.bounds import MAX_FRACTION_DIGITS, MAX_INTEGER_DIGITS


@dataclass(frozen=True)
class Compiled:
    """A spec compiled for one tokenizer: the constraint (regex, parser) and its token FSM."""

    constraint: Constraint
    fsm: TokenFSM

    @property
    def narrowings(self) -> tuple[str, ...]:
        """Where the constraint admits less than the schema (``"pointer: what"``), e.g. digit bounds."""
        return self.constraint.narrowings


def compile(  # noqa: A001
    spec: Any, model: LM | str, whitespace_pattern: str = COMPACT, strict: bool = True,
    max_integer_digits: int | None = MAX_INTEGER_DIGITS, max_fraction_digits: int | None = MAX_FRACTION_DIGITS,
) -> Compiled:
    """Compile ``spec`` into a token FSM for ``model``'s tokenizer (cached in memory and on disk).

    ``strict=False`` drops schema keywords structspec cannot enforce, with a
    warning naming each keyword and its JSON pointer, instead of raising
    `SchemaError`.

    Numbers the schema leaves unbounded get at most ``max_integer_digits`` integer
    and ``max_fraction_digits`` fraction digits (None lifts a bound), so a model
    cannot write digits until its budget runs out; `Compiled.narrowings` lists
    every such narrowing.

    Pay and measure the compile cost ahead of generation; ``fsm.info`` says how
    long it took and whether it came from the cache.
    """
    lm = load(model) if isinstance(model, str) else model
    constraint = constraint_of(spec, whitespace_pattern, strict, max_integer_digits, max_fraction_digits)
    return Compiled(constraint, TokenFSM.from_regex(constraint.regex, lm.vocab, lm.logits_width))


def generate_result(
    model: LM | str,
    spec: Any,
    prompt: Prompt,
    *,
    max_new_tokens: int = 512,
    do_sample: bool | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    whitespace_pattern: str = COMPACT,
    strict: bool = True,
    max_integer_digits: int | None = MAX_INTEGER_DIGITS,
    max_fraction_digits: int | None = MAX_FRACTION_DIGITS,
    fast_forward: FastForward = "exact",
    draft: Drafter | LM | str | None = "prompt_lookup",
    output_logprobs: bool = False,
) -> Result:
    """Generate output that matches ``spec`` and return it with its tokens and stats.

    ``do_sample=None`` samples when ``temperature``, ``top_k`` or ``top_p`` is set
    and decodes greedily otherwise. ``fast_forward`` ("off" or "exact") says
    whether tokens the FSM forces are appended without a model call; ``strict``
    and the digit bounds are as in `compile`. ``draft`` says where speculative drafts come from:
    ``"prompt_lookup"`` (the default: copies from the prompt, free and
    lossless), a loaded LM (draft model; another tokenizer is translated through
    text), ``"self"`` (the target's first layers), ``"threshold"`` (self-draft
    with threshold decoding), ``"auto"`` (prompt lookup, plus self-draft on a
    GPU), a `Drafter`, or None (no drafts). Drafts are verified by the target, so
    greedy output is token-identical whatever the drafter.
    Stopping is a result: when ``max_new_tokens`` runs out, the `Result` has
    ``stop_reason="max_new_tokens"``, ``value=None`` and the partial text,
    tokens and stats (likewise ``"max_context"`` when the model's context fills
    up). A prompt that does not fit the model's context raises `PromptError`.
    ``output_logprobs=True`` fills ``Result.logprobs``: each output token's log-probability under the
    target's masked (and, when sampling, warped) distribution at the pass that chose or verified it
    (0.0 for tokens the FSM forced).
    """
    options = _options(max_new_tokens, do_sample, temperature, top_k, top_p, seed, fast_forward, output_logprobs)
    lm = load(model) if isinstance(model, str) else model
    prompt_ids = _prompt_ids(lm, prompt)
    compiled = compile(spec, lm, whitespace_pattern, strict, max_integer_digits, max_fraction_digits)
    return _result(lm, compiled, decode(lm, compiled.fsm, prompt_ids, options, make_drafter(draft, lm)))


def generate(model: LM | str, spec: Any, prompt: Prompt, **options: Any) -> Any:
    """Generate and return the validated value: a Pydantic instance, a parsed JSON value, or a `str` for a regex.

    Takes the options of `generate_result`; raises `TokenBudgetExceeded` (carrying the partial
    text, tokens and stats) when ``max_new_tokens`` (or the model's context) runs out, and
    `InvalidOutput` when the spec's validator rejects the output.
    """
    result = generate_result(model, spec, prompt, **options)
    if result.stop_reason == "invalid":
        raise result.error  # type: ignore[misc]
    if not result.complete:
        raise TokenBudgetExceeded(options.get("max_new_tokens", 512), result)
    return result.value


def iter_batch(
    model: LM | str,
    spec: Any,
    prompts: list[Prompt],
    *,
    batch_size: int = 8,
    max_new_tokens: int = 512,
    do_sample: bool | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    whitespace_pattern: str = COMPACT,
    strict: bool = True,
    max_integer_digits: int | None = MAX_INTEGER_DIGITS,
    max_fraction_digits: int | None = MAX_FRACTION_DIGITS,
    fast_forward: FastForward = "exact",
    draft: LM | str | None = "prompt_lookup",
) -> Iterator[tuple[int, Result]]:
    """Decode ``prompts`` ``batch_size`` rows per target pass; yields ``(index, Result)`` as each row finishes.

    ``spec`` is one spec for every row or a list with one spec per prompt.
    Options are `generate_result`'s. A finished row's place is refilled with the
    next prompt; the prompts' shared token prefix is prefilled once. A row that
    cannot run (an empty prompt, a prompt longer than the context, a bad spec)
    is a `Result` with ``stop_reason="error"`` and the `StructspecError` in
    ``error``; other rows are unaffected. When sampling, row ``i`` draws from
    its own generator seeded with ``seed + i``, so its sample does not depend on
    ``batch_size`` or refill order. ``draft`` is a name or a loaded LM (each row
    gets its own drafter); a draft model with the target's tokenizer and self-draft
    draft for all rows in one draft pass per round, another tokenizer row by row.
    """
    options = _options(max_new_tokens, do_sample, temperature, top_k, top_p, seed, fast_forward)
    if not isinstance(prompts, list):
        raise OptionError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
    specs = spec if isinstance(spec, list) else [spec] * len(prompts)
    if len(specs) != len(prompts):
        raise OptionError(f"spec is a list of {len(specs)} specs for {len(prompts)} prompts: pass one spec, or one per prompt")
    if batch_size < 1:
        raise OptionError(f"batch_size must be ≥ 1, got {batch_size}")
    if isinstance(draft, Drafter):
        raise OptionError("a Drafter instance holds one row's state: pass a drafter name or a loaded LM")
    lm = load(model) if isinstance(model, str) else model
    compiled: dict[int, Compiled] = {}  # by id of the spec object: a repeated spec compiles once
    row_compiled: dict[int, Compiled] = {}
    rows: list[RowInput] = []
    for i, (row_spec, prompt) in enumerate(zip(specs, prompts)):
        try:
            prompt_ids = _prompt_ids(lm, prompt)
            if id(row_spec) not in compiled:
                compiled[id(row_spec)] = compile(row_spec, lm, whitespace_pattern, strict, max_integer_digits,
                                                 max_fraction_digits)
            generator = torch.Generator().manual_seed(seed + i) if seed is not None else None
            row_compiled[i] = compiled[id(row_spec)]
            rows.append(RowInput(i, row_compiled[i].fsm, prompt_ids, make_drafter(draft, lm), generator))
        except StructspecError as error:
            yield i, Result(None, "", [], "error", Stats(), error=_in_row(error, i))
    prefix = shared_prefix([row.prompt_ids for row in rows])
    for i, decoded in decode_batch(lm, iter(rows), options, batch_size, prefix):
        yield i, _result(lm, row_compiled[i], decoded)


def generate_batch(model: LM | str, spec: Any, prompts: list[Prompt], **options: Any) -> list[Result]:
    """`iter_batch`, collected: one `Result` per prompt, in the prompts' order."""
    results: list[Result | None] = [None] * len(prompts) if isinstance(prompts, list) else []
    for i, result in iter_batch(model, spec, prompts, **options):
        results[i] = result
    return results  # type: ignore[return-value]


def clear_cache(disk: bool = False) -> None:
    """Forget compiled automata held in memory, and with ``disk=True`` those on disk too (changes the caches;
    converted models stay)."""
    _fsm.clear_cache(disk)


def _options(
    max_new_tokens: int, do_sample: bool | None, temperature: float, top_k: int | None, top_p: float | None,
    seed: int | None, fast_forward: FastForward, output_logprobs: bool = False,
) -> DecodeOptions:
    if do_sample is None:
        do_sample = temperature != 1.0 or top_k is not None or top_p is not None
    sampling = SamplingConfig(do_sample, temperature, top_k, top_p)
    return DecodeOptions(max_new_tokens, sampling, seed, fast_forward, output_logprobs)


def _prompt_ids(lm: LM, prompt: Prompt) -> list[int]:
    """The prompt's token ids; `PromptError` if it leaves no room for output in the model's context."""
    ids = lm.encode_prompt(prompt)
    if lm.max_context is not None and len(ids) >= lm.max_context:
        raise PromptError(
            f"the prompt has {len(ids)} tokens but {lm.name} has {lm.max_context} positions for prompt and "
            "output together: shorten the prompt"
        )
    return ids


def _in_row(error: StructspecError, row: int) -> StructspecError:
    """``error`` with the batch row it concerns in its message (its type and fields unchanged)."""
    error.args = (f"row {row}: {error}",)
    error.row = row  # type: ignore[attr-defined]
    return error


def _result(lm: LM, compiled: Compiled, decoded: Decoded) -> Result:
    decoded.stats.compile_seconds = compiled.fsm.info.seconds
    decoded.stats.compile_source = compiled.fsm.info.source
    text = lm.vocab.decode(decoded.token_ids)
    result = Result(None, text, decoded.token_ids, decoded.stop_reason, decoded.stats, decoded.sources,
                    logprobs=decoded.logprobs)
    if result.complete:
        try:
            result.value = compiled.constraint.parse(text)
        except (pydantic.ValidationError, jsonschema.ValidationError, ValueError) as e:
            result.stop_reason = "invalid"
            result.error = InvalidOutput(result, " ".join(str(e).split())[:300] or type(e).__name__)
            result.error.__cause__ = e
    return result
