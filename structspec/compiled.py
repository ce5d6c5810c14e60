"""`compile` and what it returns: a spec compiled for one model, called to generate.

Typical use::

    person = structspec.compile(Person, lm)     # the token FSM is built (or read from the cache) once, here
    value = person("Alice is 31. As JSON:")      # each call decodes; none compiles
    result = person.result("Bob is 45. As JSON:", max_new_tokens=40)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from structspec.automaton.fsm import TokenFSM
from structspec.automaton.nfa import gc_paused
from structspec.batches import check_batch, collected, decode_rows
from structspec.decoding.fastforward import FastForward
from structspec.errors import OptionError, TokenBudgetExceeded
from structspec.events import Streamer, decode_events, prompt_ids_of, put_to
from structspec.models.loading import load
from structspec.models.protocol import Prompt
from structspec.models.transformers_lm import LM
from structspec.options import GenerationConfigLike, check_prompt, from_generation_config
from structspec.result import Finished, Result, StreamEvent
from structspec.schema import COMPACT, Constraint, constraint_of
from structspec.schema.agents import agent_constraint, chat_tools, constraint_fsm, is_agent_spec
from structspec.schema.bounds import MAX_FRACTION_DIGITS, MAX_INTEGER_DIGITS
from structspec.schema.recursion import MAX_RECURSION_DEPTH
from structspec.settings import CompileOptions, Draft, GenerateOptions, options_in, takes_options


@takes_options
def compile(  # noqa: A001
    spec: Any, model: LM | str, *, whitespace_pattern: str = COMPACT, strict: bool = True,
    max_integer_digits: int | None = MAX_INTEGER_DIGITS, max_fraction_digits: int | None = MAX_FRACTION_DIGITS,
    eos_token_id: int | list[int] | None = None, max_recursion_depth: int = MAX_RECURSION_DEPTH,
    open_objects: bool | None = None,
) -> Compiled:
    """Compile ``spec`` into a token FSM for ``model`` (a loaded `LM`, or a name to `load`) and return it ready to
    generate: call the result to decode. The options are `CompileOptions`' (checked before the model loads, as
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
    options = options_in(CompileOptions, locals())  # locals(): this call's parameters, by name

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

    The calls take `GenerateOptions`' keywords; ``generation_config`` (a transformers ``GenerationConfig``)
    fills those a call leaves unset (see `structspec.generate_result`). A compile option given to a call is an
    `OptionError`: compile again with it.
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

    @takes_options
    def __call__(
        self, prompt: Prompt, *, max_new_tokens: int = 512, do_sample: bool | None = None, temperature: float = 1.0,
        top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
        fast_forward: FastForward = "exact", draft: Draft = "prompt_lookup", output_logprobs: bool = False,
        streamer: Streamer | None = None, generation_config: GenerationConfigLike | None = None,
    ) -> Any:
        """Generate and return the validated value: a Pydantic instance, a parsed JSON value, or a `str` for a
        regex. Takes `result`'s arguments; raises `TokenBudgetExceeded` (carrying the partial result) when
        ``max_new_tokens`` (or the model's context) runs out, `InvalidOutput` when the spec's validator
        rejects the output, `UnspellableError` when the output reaches a character the vocabulary cannot spell.
        """
        options = self._options(locals())
        result = self._run(prompt, options, streamer)
        if result.stop_reason == "invalid":
            raise result.error  # type: ignore[misc]
        if not result.complete:
            raise TokenBudgetExceeded(options.max_new_tokens, result)
        return result.value

    @takes_options
    def result(
        self, prompt: Prompt, *, max_new_tokens: int = 512, do_sample: bool | None = None, temperature: float = 1.0,
        top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
        fast_forward: FastForward = "exact", draft: Draft = "prompt_lookup", output_logprobs: bool = False,
        streamer: Streamer | None = None, generation_config: GenerationConfigLike | None = None,
    ) -> Result:
        """Generate output that matches the spec and return it with its tokens and stats; see
        `structspec.generate_result` (the same, less the compile). Stopping is a result."""
        return self._run(prompt, self._options(locals()), streamer)

    @takes_options
    def stream(
        self, prompt: Prompt, *, max_new_tokens: int = 512, do_sample: bool | None = None, temperature: float = 1.0,
        top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
        fast_forward: FastForward = "exact", draft: Draft = "prompt_lookup", output_logprobs: bool = False,
        generation_config: GenerationConfigLike | None = None,
    ) -> Iterator[StreamEvent]:
        """`result` as events (see `structspec.stream`): the options and the prompt are checked in this call; the
        model runs as the events are read."""
        options = self._options(locals())
        check_prompt(prompt)
        return decode_events(self, prompt_ids_of(self, prompt), options,
                             fields=self.constraint.json_schema is not None or self.constraint.events is not None)

    @takes_options
    def batch(
        self, prompts: list[Prompt], *, batch_size: int = 8, max_new_tokens: int = 512, do_sample: bool | None = None,
        temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
        fast_forward: FastForward = "exact", draft: Draft = "prompt_lookup",
        generation_config: GenerationConfigLike | None = None,
    ) -> list[Result]:
        """One `Result` per prompt, in the prompts' order, decoded ``batch_size`` rows per target pass; see
        `structspec.iter_batch` (a row that cannot run is a `Result` with ``stop_reason="error"``)."""
        options = self._options({**locals(), "output_logprobs": False})
        batch_size = check_batch(prompts, options, batch_size)
        return collected(len(prompts), decode_rows(self.lm, [self] * len(prompts), prompts, options, batch_size))

    def _options(self, arguments: dict[str, Any]) -> GenerateOptions:
        """The `GenerateOptions` among a call's ``arguments``; `OptionError` where its ``generation_config``
        names other end tokens than this spec was compiled with."""
        config = arguments["generation_config"]
        eos = None if config is None else from_generation_config(config).get("eos_token_id")
        if eos is not None and tuple(dict.fromkeys(eos if isinstance(eos, list) else [eos])) != self.fsm.eos_token_ids:
            raise OptionError(f"generation_config.eos_token_id={eos!r} is a compile option, and this spec was compiled "
                              f"for {list(self.fsm.eos_token_ids)}: compile with structspec.compile(spec, lm, "
                              f"eos_token_id={eos!r})")
        return options_in(GenerateOptions, arguments)

    def _run(self, prompt: Prompt, options: GenerateOptions, streamer: Streamer | None) -> Result:
        """Decode one output, putting its tokens to ``streamer`` as they are accepted."""
        check_prompt(prompt)
        prompt_ids = prompt_ids_of(self, prompt)
        events = decode_events(self, prompt_ids, options, fields=False)
        if streamer is not None:
            events = put_to(events, prompt_ids, streamer)
        *_, finished = events
        assert isinstance(finished, Finished), "the last event is Finished"
        return finished.result
