"""`compile` and what it returns: a spec compiled for one model, called to generate.

Typical use::

    person = structspec.compile(Person, lm)     # the token FSM is built (or read from the cache) once, here
    value = person("Alice is 31. As JSON:")      # each call decodes; none compiles
    result = person.result("Bob is 45. As JSON:", max_new_tokens=40)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Unpack

from structspec.automaton.fsm import TokenFSM
from structspec.automaton.nfa import gc_paused
from structspec.batches import check_batch, collected, decode_rows
from structspec.checks import GenerationConfigLike, check_prompt, from_generation_config, model_argument
from structspec.errors import OptionError, TokenBudgetExceeded
from structspec.events import Streamer, decode_events, prompt_ids_of, put_to
from structspec.models.loading import load
from structspec.models.protocol import Prompt
from structspec.models.transformers_lm import LM
from structspec.options import (
    BatchKeywords,
    CompileKeywords,
    CompileOptions,
    GenerateKeywords,
    GenerateOptions,
    checked_keywords,
    options_in,
)
from structspec.result import Finished, Result, StreamEvent
from structspec.schema import Constraint, constraint_of
from structspec.schema.agents import agent_constraint, chat_tools, constraint_fsm, is_agent_spec


def compile(spec: Any, model: LM | str, **keywords: Unpack[CompileKeywords]) -> Compiled:  # noqa: A001
    """Compile ``spec`` into a token FSM for ``model`` (a loaded `LM`, or a name to `load`) and return it ready to
    generate: call the result to decode. The keywords are `CompileOptions`' (checked before the model loads, as
    is every spec but an agent's: tool calls, reasoning and tags are read with the tokenizer).

    The FSM is cached in memory, and on disk where its automaton took 5 ms or more to build
    (`structspec.automaton.fsm.DISK_MIN_SECONDS`); ``fsm.info`` says how long it took and whether it came
    from the cache. ``strict=False`` drops schema keywords structspec cannot enforce, with a warning naming each
    keyword and its JSON pointer, instead of raising `SchemaError`. Numbers the schema leaves unbounded get at
    most ``max_integer_digits`` integer and ``max_fraction_digits`` fraction digits (None lifts a bound), so a
    model cannot write digits until its budget runs out; `Compiled.narrowings` lists every such narrowing. A
    recursive ``$ref`` nests at most ``max_recursion_depth`` levels. An object lets the members
    ``additionalProperties`` allows follow its listed ones, as JSON Schema reads it; where it is absent, a JSON
    Schema's objects are open and a Pydantic model's closed, unless ``open_objects`` (True / False) says.
    ``eos_token_id`` (an id or a list) names the tokens that end the output, each allowed exactly where the
    output may end (default: the tokenizer's EOS); each must be the tokenizer's EOS or a special token.
    """
    return compile_with(spec, model, options_in(CompileOptions, checked_keywords(keywords, CompileKeywords)))


def compile_with(spec: Any, model: LM | str, options: CompileOptions) -> Compiled:
    """`compile` with its options built (and checked) already: the one-liners build them once per call."""
    model = model_argument(model)

    def resolve(inner: Any, whitespace: str | None = None) -> Constraint:
        return constraint_of(inner, options.whitespace_pattern if whitespace is None else whitespace, options.strict,
                             options.max_integer_digits, options.max_fraction_digits, options.max_recursion_depth,
                             options.open_objects)

    # A spec that needs no tokenizer is translated before the model loads, so its errors come first. Agents'
    # specs (tool calls, reasoning, tags) may place special tokens: they are translated for the tokenizer, and
    # their FSM reads a vocabulary in which only those ids spell their symbols.
    with gc_paused():  # a compile allocates and frees little: full collections over a loaded model find nothing
        constraint = None if is_agent_spec(spec) else resolve(spec)
    lm = load(model) if isinstance(model, str) else model
    with gc_paused():
        if constraint is None:
            constraint = agent_constraint(spec, lm.vocab, lm.tokenizer, resolve)
        fsm = constraint_fsm(constraint, lm.vocab, lm.logits_width, options.eos_token_id)
    return Compiled(constraint, fsm, lm, options, chat_tools(spec))


@dataclass(frozen=True, eq=False)
class Compiled:
    """A spec compiled for one model: its constraint (regex and parser), its token FSM, the model and the
    options it was compiled with. Calling it decodes with the FSM it holds; no call compiles again, and none
    changes what it holds (but the FSM's cache of the states and masks decoding reaches).

    The calls take `GenerateOptions`' keywords (typed as `GenerateKeywords`, a batch's as `BatchKeywords`);
    ``generation_config`` (a transformers ``GenerationConfig``) fills those a call leaves unset (see
    `structspec.generate_result`). A compile option given to a call is an `OptionError`: compile again with it.
    """

    constraint: Constraint
    fsm: TokenFSM
    lm: LM = field(repr=False)
    options: CompileOptions
    tools: list[dict[str, Any]] | None = None  # what a chat prompt's template is given as ``tools=``

    @property
    def narrowings(self) -> tuple[str, ...]:
        """Where the constraint admits less than the schema (``"pointer: what"``), e.g. digit bounds."""
        return self.constraint.narrowings

    def __call__(
        self, prompt: Prompt, *, streamer: Streamer | None = None,
        generation_config: GenerationConfigLike | None = None, **keywords: Unpack[GenerateKeywords],
    ) -> Any:
        """Generate and return the validated value: a Pydantic instance, a parsed JSON value, or a `str` for a
        regex. Takes `result`'s arguments; raises `TokenBudgetExceeded` (carrying the partial result) when
        ``max_new_tokens`` (or the model's context) runs out, `InvalidOutput` when the spec's validator
        rejects the output, `UnspellableError` (carrying the partial result) when the output reaches a character
        the vocabulary cannot spell.
        """
        options = self._options(keywords, GenerateKeywords, generation_config, streamer)
        check_prompt(prompt)
        return value_of(decode_result(self, prompt, options, streamer), options)

    def result(
        self, prompt: Prompt, *, streamer: Streamer | None = None,
        generation_config: GenerationConfigLike | None = None, **keywords: Unpack[GenerateKeywords],
    ) -> Result:
        """Generate output that matches the spec and return it with its tokens and stats; see
        `structspec.generate_result` (the same, less the compile). Stopping is a result, and so is a state the
        vocabulary cannot spell on from (``stop_reason="error"``)."""
        options = self._options(keywords, GenerateKeywords, generation_config, streamer)
        check_prompt(prompt)
        return decode_result(self, prompt, options, streamer)

    def stream(
        self, prompt: Prompt, *, generation_config: GenerationConfigLike | None = None,
        **keywords: Unpack[GenerateKeywords],
    ) -> Iterator[StreamEvent]:
        """`result` as events (see `structspec.stream`): the options and the prompt are checked in this call; the
        model runs as the events are read."""
        options = self._options(keywords, GenerateKeywords, generation_config)
        check_prompt(prompt)
        return decode_stream(self, prompt, options)

    def batch(
        self, prompts: list[Prompt], *, batch_size: int = 8, generation_config: GenerationConfigLike | None = None,
        **keywords: Unpack[BatchKeywords],
    ) -> list[Result]:
        """One `Result` per prompt, in the prompts' order, decoded ``batch_size`` rows per target pass; see
        `structspec.iter_batch` (a row that cannot run is a `Result` with ``stop_reason="error"``)."""
        options = self._options(keywords, BatchKeywords, generation_config)
        batch_size = check_batch(prompts, options, batch_size)
        return collected(len(prompts), decode_rows(self.lm, [self] * len(prompts), prompts, options, batch_size))

    def _options(
        self, keywords: dict[str, Any], taken: type[Any], config: GenerationConfigLike | None, streamer: Any = None,
    ) -> GenerateOptions:
        """The `GenerateOptions` of a call's ``keywords`` (``taken``'s names) and ``config``; `OptionError` where
        the config names other end tokens than this spec was compiled with."""
        eos = None if config is None else from_generation_config(config).get("eos_token_id")
        if eos is not None and tuple(dict.fromkeys(eos if isinstance(eos, list) else [eos])) != self.fsm.eos_token_ids:
            raise OptionError(f"generation_config.eos_token_id={eos!r} is a compile option, and this spec was compiled "
                              f"for {list(self.fsm.eos_token_ids)}: compile with structspec.compile(spec, lm, "
                              f"eos_token_id={eos!r})")
        return options_in(GenerateOptions, checked_keywords(keywords, taken, config, streamer))


def decode_result(compiled: Compiled, prompt: Prompt, options: GenerateOptions, streamer: Streamer | None) -> Result:
    """Decode one output of ``compiled`` for ``prompt`` (checked already) with ``options`` (built already), putting
    its tokens to ``streamer`` as they are accepted; its `Result`, whatever the stop reason. Runs the model."""
    prompt_ids = prompt_ids_of(compiled, prompt)
    events = decode_events(compiled, prompt_ids, options, fields=False)
    if streamer is not None:
        events = put_to(events, prompt_ids, streamer)
    *_, finished = events
    assert isinstance(finished, Finished), "the last event is Finished"
    return finished.result


def decode_stream(compiled: Compiled, prompt: Prompt, options: GenerateOptions) -> Iterator[StreamEvent]:
    """`decode_result` as events, member events where the spec has an object or events of its own; the model
    runs as they are read."""
    fields = compiled.constraint.json_schema is not None or compiled.constraint.events is not None
    return decode_events(compiled, prompt_ids_of(compiled, prompt), options, fields=fields)


def value_of(result: Result, options: GenerateOptions) -> Any:
    """``result``'s value; its error (`InvalidOutput`, `UnspellableError`, carrying the result) or
    `TokenBudgetExceeded` where it has none. Changes nothing."""
    if result.stop_reason in ("invalid", "error"):
        raise result.error  # type: ignore[misc]
    if not result.complete:
        raise TokenBudgetExceeded(options.max_new_tokens, result)
    return result.value
