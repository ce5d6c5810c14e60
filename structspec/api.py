"""The one-liners: `generate`, `generate_result`, `stream`, `generate_batch`, `iter_batch` compile the spec
(`structspec.compile`, cached) and decode with what it returns, their options built and checked once per call;
`clear_cache` forgets compiled automata; `calibrate` measures and stores a model's pass cost, which decoding
reads.

Typical use::

    import structspec
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    lm = structspec.load("smollm2-135m")
    alice = structspec.generate(lm, Person, "Alice is 31. As JSON:")
    person = structspec.compile(Person, lm)      # to call many times: compiled once
    results = person.batch(["Alice is 31.", "Bob is 45."], batch_size=8)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Unpack, get_origin

from structspec.automaton import fsm as _fsm
from structspec.batches import check_batch, collected, decode_rows
from structspec.checks import GenerationConfigLike, check_prompt, model_argument
from structspec.compiled import Compiled, compile_with, decode_result, decode_stream, value_of
from structspec.decoding.calibrate import Calibration
from structspec.decoding.calibrate import calibrate as _calibrate
from structspec.errors import OptionError, SpecError, StructspecError
from structspec.events import Streamer
from structspec.models.loading import load
from structspec.models.prefix_cache import clear_prefix_caches
from structspec.models.protocol import Prompt
from structspec.models.transformers_lm import LM
from structspec.options import (
    BatchOneLinerKeywords,
    CompileOptions,
    GenerateOptions,
    OneLinerKeywords,
    checked_keywords,
    options_in,
)
from structspec.result import Result, StreamEvent
from structspec.schema import Regex


def generate_result(
    model: LM | str, spec: Any, prompt: Prompt, *, streamer: Streamer | None = None,
    generation_config: GenerationConfigLike | None = None, **keywords: Unpack[OneLinerKeywords],
) -> Result:
    """Compile ``spec`` for ``model`` (a loaded `LM`, or a name to `load`), generate output that matches it for
    ``prompt``, and return the output with its tokens and stats.

    The keywords (`OneLinerKeywords`) are `GenerateOptions`' (how to decode, with their defaults) and
    `CompileOptions`' (what the FSM depends on); all are checked, with the prompt, before the model loads.
    ``generation_config`` (a transformers ``GenerationConfig``) supplies ``max_new_tokens``, ``do_sample``,
    ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``no_repeat_ngram_size`` and ``eos_token_id``
    where no keyword does; any other field it sets to something structspec does not do (``num_beams=2``, ...) is
    an `OptionError`
    naming it. The model's own generation config is never read. ``streamer`` (``put``/``end``, as transformers'
    ``TextStreamer``) gets the prompt's ids, then each turn's accepted output ids (a drafted or forced run at
    once), each as a [1, n] LongTensor, then ``end()``; EOS is not output, so it is not put.

    Stopping is a result: when ``max_new_tokens`` runs out, the `Result` has ``stop_reason="max_new_tokens"``,
    ``value=None`` and the partial text, tokens and stats (likewise ``"max_context"`` when the model's context
    fills up). So is a state the vocabulary cannot spell on from: ``stop_reason="error"`` with the partial
    output and the `UnspellableError` in ``error``, as a batch row has it. A prompt that does not fit the
    model's context raises `PromptError`.
    """
    compiled, options = _compiled(model, spec, prompt, checked_keywords(keywords, OneLinerKeywords,
                                                                        generation_config, streamer))
    return decode_result(compiled, prompt, options, streamer)


def generate(
    model: LM | str, spec: Any, prompt: Prompt, *, streamer: Streamer | None = None,
    generation_config: GenerationConfigLike | None = None, **keywords: Unpack[OneLinerKeywords],
) -> Any:
    """Generate and return the validated value: a Pydantic instance, a parsed JSON value, or a `str` for a regex.

    Takes the arguments of `generate_result`; raises `TokenBudgetExceeded` (carrying the partial
    text, tokens and stats) when ``max_new_tokens`` (or the model's context) runs out,
    `InvalidOutput` when the spec's validator rejects the output, and `UnspellableError` (carrying the
    partial result too) when the output reaches a character the vocabulary cannot spell.
    """
    compiled, options = _compiled(model, spec, prompt, checked_keywords(keywords, OneLinerKeywords,
                                                                        generation_config, streamer))
    return value_of(decode_result(compiled, prompt, options, streamer), options)


def stream(
    model: LM | str, spec: Any, prompt: Prompt, *, generation_config: GenerationConfigLike | None = None,
    **keywords: Unpack[OneLinerKeywords],
) -> Iterator[StreamEvent]:
    """`generate_result` as events: a `TextChunk` per turn that accepted tokens, a `FieldDone` each time a
    top-level member of a JSON object closes, then one `Finished` with the `Result` (whatever the stop reason).

    Takes `generate_result`'s arguments but ``streamer``. The chunks' texts concatenate to ``Result.text``
    (a character split across tokens arrives whole, with the chunk that completes it); the `FieldDone`
    events, in order, are the first members of the final object; a `ToolCalls` spec yields a `CallDone` per
    finished call instead. A regex spec yields chunks only, then
    `Finished`. Options, the prompt and the spec are checked (and the spec compiled) in this call; the
    model runs as the events are read.

    Typical use::

        for event in structspec.stream(lm, Person, "Alice is 31. As JSON:"):
            if isinstance(event, structspec.FieldDone):
                print(event.name, "=", event.value)
    """
    compiled, options = _compiled(model, spec, prompt, checked_keywords(keywords, OneLinerKeywords,
                                                                        generation_config))
    return decode_stream(compiled, prompt, options)


def iter_batch(
    model: LM | str, spec: Any, prompts: list[Prompt], *, batch_size: int = 8,
    generation_config: GenerationConfigLike | None = None, **keywords: Unpack[BatchOneLinerKeywords],
) -> Iterator[tuple[int, Result]]:
    """Decode ``prompts`` ``batch_size`` rows per target pass; yields ``(index, Result)`` as each row finishes.

    ``spec`` is one spec for every row or a list with one spec per prompt (each distinct spec compiled once).
    The keywords (`BatchOneLinerKeywords`) are `generate_result`'s but ``output_logprobs`` and ``streamer``,
    checked in this call; the model runs as the results are read. A finished row's place is refilled with the
    next prompt; the prompts' shared token prefix is prefilled once. A row that cannot run (an empty prompt, a
    prompt longer than the context, a bad spec) is a `Result` with ``stop_reason="error"`` and the
    `StructspecError` in ``error``; other rows are unaffected. So is a row that reaches a character the
    vocabulary cannot spell: its `Result` is the partial output, with the `UnspellableError` (naming the row) in
    ``error``. When sampling, row ``i`` draws from its own generator seeded with ``seed + i``, so its sample does
    not depend on ``batch_size`` or refill order. ``draft`` is a name or a loaded LM (each row gets its own
    drafter); a draft model with the target's tokenizer and self-draft draft for all rows in one draft pass per
    round, another tokenizer row by row.
    """
    checked = checked_keywords(keywords, BatchOneLinerKeywords, generation_config)
    options, compile_options = options_in(GenerateOptions, checked), options_in(CompileOptions, checked)
    _check_order(spec, prompts)
    batch_size = check_batch(prompts, options, batch_size)
    specs = spec if isinstance(spec, list) else [spec] * len(prompts)
    if len(specs) != len(prompts):
        raise OptionError(f"spec is a list of {len(specs)} specs for {len(prompts)} prompts: pass one spec, or one "
                          "per prompt")
    model = model_argument(model)
    lm = load(model) if isinstance(model, str) else model
    done: dict[int, Compiled] = {}  # by id of the spec object: a repeated spec compiles once
    rows: list[Compiled | StructspecError] = []
    for row_spec in specs:
        try:  # a spec that fails is tried again for each of its rows: each row's error is its own, naming it
            if id(row_spec) not in done:
                done[id(row_spec)] = compile_with(row_spec, lm, compile_options)
            rows.append(done[id(row_spec)])
        except StructspecError as error:
            rows.append(error)
    return decode_rows(lm, rows, prompts, options, batch_size)


def generate_batch(
    model: LM | str, spec: Any, prompts: list[Prompt], *, batch_size: int = 8,
    generation_config: GenerationConfigLike | None = None, **keywords: Unpack[BatchOneLinerKeywords],
) -> list[Result]:
    """`iter_batch`, collected: one `Result` per prompt, in the prompts' order."""
    results = iter_batch(model, spec, prompts, batch_size=batch_size, generation_config=generation_config,
                         **keywords)
    return collected(len(prompts), results)


def calibrate(model: LM | str, *, store_busy: bool = False) -> Calibration:
    """Measure ``model``'s (a loaded `LM`, or a name to `load`) packed pass cost — seconds of one pass against
    the tokens it feeds, a few seconds of passes on a CPU — and store it for its name, dtype, device, kernels
    and thread count: later decoding with the model drafts by it. Decoding never measures; a model without a
    stored curve drafts by the prior for its device and dtype (`structspec.decoding.cost.prior_cost`). Measured beside other busy work, the
    curve is not stored unless ``store_busy`` (a `RuntimeWarning` says so; ``Calibration.stored`` is False).
    Runs the model; writes the cache. Also ``structspec calibrate --model NAME``."""
    model = model_argument(model)
    return _calibrate(load(model) if isinstance(model, str) else model, store_busy)


def clear_cache(disk: bool = False) -> None:
    """Forget compiled automata and every model's held prompt chunks (`structspec.models.prefix_cache`) in memory,
    and with ``disk=True`` the automata on disk too (changes the caches; converted models stay)."""
    if not isinstance(disk, bool):
        raise OptionError(f"disk must be True or False, got {disk!r}")
    _fsm.clear_cache(disk)
    clear_prefix_caches()


def _compiled(model: LM | str, spec: Any, prompt: Any, keywords: Mapping[str, Any]) -> tuple[Compiled,
                                                                                          GenerateOptions]:
    """The spec compiled for a one-liner, and its decode options made of its checked ``keywords``: every check
    before the model loads (the options, the arguments' order, the prompt's shape)."""
    options, compile_options = options_in(GenerateOptions, keywords), options_in(CompileOptions, keywords)
    _check_order(spec, prompt)
    check_prompt(prompt)
    return compile_with(spec, model, compile_options), options


def _check_order(spec: Any, prompt: Any) -> None:
    """`SpecError` when the spec and the prompt (or prompts) look swapped: a prompt where the spec goes and a
    spec (a model class, a type, a schema dict that is not a message, a `Regex`) where the prompt goes."""
    spec_like = isinstance(prompt, (type, Regex)) or get_origin(prompt) is not None or (
        isinstance(prompt, dict) and not {"role", "content"} & prompt.keys())
    if spec_like and isinstance(spec, (str, list)):
        shown = prompt.__name__ if isinstance(prompt, type) else f"a {type(prompt).__name__}"
        raise SpecError(
            f"the spec and the prompt look swapped ({shown} where the prompt goes, a {type(spec).__name__} where "
            "the spec goes): structspec takes the spec first, unlike outlines' generator(prompt); call "
            "structspec.generate(model, spec, prompt), or generate_batch(model, spec, prompts)"
        )
