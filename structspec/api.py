"""The public entry points: `compile`, `generate`, `generate_result`, `stream`, `generate_batch`, `iter_batch`.

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

import codecs
import json
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from typing import Any, Protocol, get_origin

import jsonschema
import pydantic
import torch

from structspec.automaton import fsm as _fsm
from structspec.automaton.fsm import TokenFSM, check_eos_token_ids
from structspec.automaton.nfa import gc_paused
from structspec.decoding.batch import RowInput, decode_batch, shared_prefix
from structspec.decoding.drafters import SHORT_NAMES, Drafter, make_drafter
from structspec.decoding.fastforward import FastForward
from structspec.decoding.loop import decode_steps
from structspec.decoding.row import Decoded, DecodeOptions
from structspec.decoding.sampling import SamplingConfig
from structspec.errors import (
    InvalidOutput,
    OptionError,
    PromptError,
    SpecError,
    StructspecError,
    TokenBudgetExceeded,
    UnspellableError,
)
from structspec.lm import LM, Prompt, load
from structspec.options import (
    RULES,
    GenerationConfigLike,
    check_choice,
    check_option,
    check_prompt,
    from_generation_config,
    implies_sampling,
)
from structspec.result import FieldDone, Finished, Result, Stats, StreamEvent, TextChunk
from structspec.schema import COMPACT, Constraint, Regex, constraint_of
from structspec.schema.agents import agent_constraint, chat_tools, is_agent_spec, symbol_vocab
from structspec.schema.bounds import MAX_FRACTION_DIGITS, MAX_INTEGER_DIGITS
from structspec.schema.reach import MAX_RECURSION_DEPTH


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
    eos_token_id: int | list[int] | None = None, max_recursion_depth: int = MAX_RECURSION_DEPTH,
    open_objects: bool | None = None,
) -> Compiled:
    """Compile ``spec`` into a token FSM for ``model``'s tokenizer (cached in memory, and on disk where its
    automaton took 5 ms or more to build: `structspec.automaton.fsm.DISK_MIN_SECONDS`).

    ``strict=False`` drops schema keywords structspec cannot enforce, with a
    warning naming each keyword and its JSON pointer, instead of raising
    `SchemaError`.

    Numbers the schema leaves unbounded get at most ``max_integer_digits`` integer
    and ``max_fraction_digits`` fraction digits (None lifts a bound), so a model
    cannot write digits until its budget runs out; `Compiled.narrowings` lists
    every such narrowing. A recursive ``$ref`` (a tree of nodes) nests at most
    ``max_recursion_depth`` levels; at the deepest level the member that would recurse is not offered.
    An object lets the members ``additionalProperties`` allows follow its listed ones, as JSON Schema reads
    it; where it is absent, a JSON Schema's objects are open and a Pydantic model's closed (Pydantic ignores
    undeclared members; listed in `Compiled.narrowings`), unless ``open_objects`` (True / False) says.

    ``eos_token_id`` (an id or a list, as transformers takes it) names the tokens that end the output, each
    allowed exactly where the output may end (default: the tokenizer's EOS); the first is the FSM's
    ``eos_token_id``. Each must be the tokenizer's EOS or a special token (`OptionError` otherwise).

    Pay and measure the compile cost ahead of generation; ``fsm.info`` says how
    long it took and whether it came from the cache.
    """
    lm = load(model) if isinstance(model, str) else model

    def resolve(inner: Any, whitespace: str | None = None) -> Constraint:
        return constraint_of(inner, whitespace_pattern if whitespace is None else whitespace, strict,
                             max_integer_digits, max_fraction_digits, max_recursion_depth, open_objects)

    with gc_paused():  # a compile allocates and frees little: full collections over a loaded model find nothing
        # Agents' specs (tool calls, reasoning, tags) may place special tokens: their FSM reads a vocabulary in
        # which only those ids spell their symbols.
        constraint = agent_constraint(spec, lm.vocab, lm.tokenizer, resolve) if is_agent_spec(spec) else resolve(spec)
        fsm = TokenFSM.from_regex(constraint.pattern, symbol_vocab(constraint, lm.vocab), lm.logits_width, eos_token_id)
        return Compiled(constraint, fsm)


class Streamer(Protocol):
    """transformers' streamer convention (``TextStreamer``, ``TextIteratorStreamer``)."""

    def put(self, value: torch.Tensor) -> None: ...

    def end(self) -> None: ...


@dataclass(frozen=True)
class GenerateOptions:
    """The keywords of `generate_result`, `generate`, `stream`, `iter_batch` and `generate_batch`, checked when
    made (before any model loads).

    ``do_sample=None`` samples when ``temperature``, ``top_k`` or ``top_p`` is set and decodes greedily
    otherwise. ``seed`` seeds the sampler. ``eos_token_id`` (an id or a list) names the tokens that end the
    output, as in `compile` (default: the tokenizer's EOS); decoding stops with "eos" on any of them.
    ``whitespace_pattern``, ``strict``, the digit bounds, ``max_recursion_depth`` and ``open_objects`` are as
    in `compile`.
    ``fast_forward`` ("off" or "exact") says whether tokens the FSM forces are
    appended without a model call. ``draft`` says where speculative drafts come from: ``"prompt_lookup"``
    (the default: copies from the prompt, free and lossless), a loaded LM (draft model; another tokenizer
    is translated through text), ``"self"`` (the target's first layers), ``"threshold"`` (self-draft with
    threshold decoding), ``"staged"`` (self-draft whose own drafts come from prompt lookup; ``Staged(lm)``
    stages a draft model), ``"tree"`` (prompt lookup's chain plus sibling branches, verified as one token
    tree; greedy rows), ``"lookahead"`` (lookahead decoding: n-grams from the target's own Jacobi step on
    guessed tokens, verified in the same token tree; greedy rows), ``"auto"`` (prompt lookup, plus
    self-draft on a GPU), a `Drafter`, or None (no drafts). Drafts are verified by the target, so greedy
    output is token-identical whatever the drafter.
    ``output_logprobs=True`` fills ``Result.logprobs``: each output token's log-probability under the
    target's masked (and, when sampling, warped) distribution at the pass that chose or verified it (0.0
    for tokens the FSM forced).
    """

    max_new_tokens: int = 512
    do_sample: bool | None = None
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    eos_token_id: int | list[int] | None = None
    whitespace_pattern: str = COMPACT
    strict: bool = True
    max_integer_digits: int | None = MAX_INTEGER_DIGITS
    max_fraction_digits: int | None = MAX_FRACTION_DIGITS
    max_recursion_depth: int = MAX_RECURSION_DEPTH
    open_objects: bool | None = None
    fast_forward: FastForward = "exact"
    draft: Drafter | LM | str | None = "prompt_lookup"
    output_logprobs: bool = False

    def __post_init__(self) -> None:
        for name in [f.name for f in fields(self) if f.name in RULES]:  # by type and range, as its rule takes it
            object.__setattr__(self, name, check_option(name, getattr(self, name)))  # (frozen: set once, here)
        if isinstance(self.draft, str):
            check_choice("draft", self.draft, SHORT_NAMES)
        self.decode_options()  # checks fast_forward now

    @classmethod
    def of(cls, keywords: dict[str, Any], generation_config: GenerationConfigLike | None = None) -> GenerateOptions:
        """The options ``keywords`` name, the honoured fields of ``generation_config`` where no keyword is
        given, defaults elsewhere. `OptionError` for an unknown keyword or a config field structspec does not
        do. Does not change the config."""
        names = [f.name for f in fields(cls)]
        if unknown := sorted(set(keywords) - set(names)):
            raise OptionError(f"unknown option {unknown[0]!r}: the options are {', '.join(names)}")
        if generation_config is None:
            return cls(**keywords)
        taken = from_generation_config(generation_config)
        if "do_sample" not in taken and "do_sample" not in keywords:
            # transformers' rule for the config (sampling only with do_sample=True); structspec's for keywords
            taken["do_sample"] = implies_sampling(
                keywords.get("temperature", 1.0), keywords.get("top_k"), keywords.get("top_p"))
        if not {**taken, **keywords}["do_sample"]:  # greedy: transformers ignores the config's sampling values
            for name in ("temperature", "top_k", "top_p"):
                taken.pop(name, None)
        return cls(**{**taken, **keywords})

    def decode_options(self) -> DecodeOptions:
        """What the decode loop needs of these options."""
        do_sample = self.do_sample
        if do_sample is None:
            do_sample = implies_sampling(self.temperature, self.top_k, self.top_p)
        sampling = SamplingConfig(do_sample, self.temperature, self.top_k, self.top_p)
        return DecodeOptions(self.max_new_tokens, sampling, self.seed, self.fast_forward, self.output_logprobs)

    def compile(self, spec: Any, lm: LM) -> Compiled:
        """`compile` with these options' whitespace, strictness, digit bounds, end tokens, recursion depth and
        open objects."""
        return compile(spec, lm, self.whitespace_pattern, self.strict, self.max_integer_digits,
                       self.max_fraction_digits, self.eos_token_id, self.max_recursion_depth, self.open_objects)

    def check_model(self, lm: LM) -> None:
        """`OptionError` unless ``eos_token_id`` is unset or names end tokens ``lm``'s tokenizer has (its EOS
        or special tokens). Changes nothing."""
        if self.eos_token_id is not None:
            check_eos_token_ids(lm.vocab, self.eos_token_id)


def generate_result(
    model: LM | str, spec: Any, prompt: Prompt, *, streamer: Streamer | None = None,
    generation_config: GenerationConfigLike | None = None, **options: Any,
) -> Result:
    """Generate output that matches ``spec`` and return it with its tokens and stats.

    ``options`` are `GenerateOptions`' fields (``max_new_tokens=512``, ``do_sample``, ``temperature``,
    ``top_k``, ``top_p``, ``seed``, ``draft``, ``fast_forward``, ``output_logprobs``, ...).
    ``generation_config`` (a transformers ``GenerationConfig``) supplies ``max_new_tokens``, ``do_sample``,
    ``temperature``, ``top_k``, ``top_p`` and ``eos_token_id`` where no keyword does; any other field it
    sets to something structspec does not do (``num_beams=2``, ``repetition_penalty=1.1``, ...) is an
    `OptionError` naming it. The model's own generation config is never read.
    ``streamer`` (``put``/``end``, as transformers' ``TextStreamer``) gets the prompt's ids, then each
    turn's accepted output ids (a drafted or forced run at once), each as a [1, n] LongTensor, then
    ``end()``; EOS is not output, so it is not put.
    Stopping is a result: when ``max_new_tokens`` runs out, the `Result` has
    ``stop_reason="max_new_tokens"``, ``value=None`` and the partial text,
    tokens and stats (likewise ``"max_context"`` when the model's context fills
    up). A prompt that does not fit the model's context raises `PromptError`; a state the vocabulary cannot
    spell on from raises `UnspellableError`, carrying the partial result.
    """
    return _generate(model, spec, prompt, GenerateOptions.of(options, generation_config), streamer)


def generate(
    model: LM | str, spec: Any, prompt: Prompt, *, streamer: Streamer | None = None,
    generation_config: GenerationConfigLike | None = None, **options: Any,
) -> Any:
    """Generate and return the validated value: a Pydantic instance, a parsed JSON value, or a `str` for a regex.

    Takes the arguments of `generate_result`; raises `TokenBudgetExceeded` (carrying the partial
    text, tokens and stats) when ``max_new_tokens`` (or the model's context) runs out,
    `InvalidOutput` when the spec's validator rejects the output, and `UnspellableError` (carrying the
    partial result too) when the output reaches a character the vocabulary cannot spell.
    """
    checked = GenerateOptions.of(options, generation_config)
    result = _generate(model, spec, prompt, checked, streamer)
    if result.stop_reason == "invalid":
        raise result.error  # type: ignore[misc]
    if not result.complete:
        raise TokenBudgetExceeded(checked.max_new_tokens, result)
    return result.value


def stream(
    model: LM | str, spec: Any, prompt: Prompt, *, generation_config: GenerationConfigLike | None = None,
    **options: Any,
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
    checked = GenerateOptions.of(options, generation_config)
    lm, compiled, prompt_ids = _prepare(model, spec, prompt, checked)
    return _events(lm, compiled, prompt_ids, checked,
                   fields=compiled.constraint.json_schema is not None or compiled.constraint.events is not None)


def iter_batch(
    model: LM | str, spec: Any, prompts: list[Prompt], *, batch_size: int = 8,
    generation_config: GenerationConfigLike | None = None, **options: Any,
) -> Iterator[tuple[int, Result]]:
    """Decode ``prompts`` ``batch_size`` rows per target pass; yields ``(index, Result)`` as each row finishes.

    ``spec`` is one spec for every row or a list with one spec per prompt.
    ``generation_config`` and ``options`` are `generate_result`'s (``output_logprobs`` aside). A finished
    row's place is refilled with the next prompt; the prompts' shared token prefix is prefilled once. A row
    that cannot run (an empty prompt, a prompt longer than the context, a bad spec)
    is a `Result` with ``stop_reason="error"`` and the `StructspecError` in
    ``error``; other rows are unaffected. So is a row that reaches a character the
    vocabulary cannot spell: its `Result` is the partial output, with the
    `UnspellableError` (naming the row) in ``error``. When sampling, row ``i`` draws from
    its own generator seeded with ``seed + i``, so its sample does not depend on
    ``batch_size`` or refill order. ``draft`` is a name or a loaded LM (each row
    gets its own drafter); a draft model with the target's tokenizer and self-draft
    draft for all rows in one draft pass per round, another tokenizer row by row.
    """
    checked = GenerateOptions.of(options, generation_config)
    if checked.output_logprobs:
        raise OptionError("output_logprobs=True is not supported in batches yet: use generate_result per prompt")
    _check_order(spec, prompts)
    if not isinstance(prompts, list):
        raise OptionError(f"prompts must be a list of prompts, got {type(prompts).__name__}")
    specs = spec if isinstance(spec, list) else [spec] * len(prompts)
    if len(specs) != len(prompts):
        raise OptionError(f"spec is a list of {len(specs)} specs for {len(prompts)} prompts: pass one spec, or one per prompt")
    batch_size = check_option("batch_size", batch_size)
    if isinstance(checked.draft, Drafter):
        raise OptionError("a Drafter instance holds one row's state: pass a drafter name or a loaded LM")
    lm = load(model) if isinstance(model, str) else model
    checked.check_model(lm)
    compiled: dict[int, Compiled] = {}  # by id of the spec object: a repeated spec compiles once
    row_compiled: dict[int, Compiled] = {}
    rows: list[RowInput] = []
    for i, (row_spec, prompt) in enumerate(zip(specs, prompts)):
        try:
            check_prompt(prompt)
            prompt_ids = _prompt_ids(lm, prompt, row_spec)
            if id(row_spec) not in compiled:
                compiled[id(row_spec)] = checked.compile(row_spec, lm)
            generator = torch.Generator().manual_seed(checked.seed + i) if checked.seed is not None else None
            row_compiled[i] = compiled[id(row_spec)]
            rows.append(RowInput(i, row_compiled[i].fsm, prompt_ids, make_drafter(checked.draft, lm), generator))
        except StructspecError as error:
            yield i, Result(None, "", [], "error", Stats(), error=_in_row(error, i))
    prefix = shared_prefix([row.prompt_ids for row in rows])
    todo = {row.index: row for row in rows}
    while todo:
        taken: list[int] = []  # rows the batch has started
        try:
            for i, decoded in decode_batch(lm, _taking(list(todo.values()), taken), checked.decode_options(),
                                           batch_size, prefix):
                del todo[i]
                yield i, _result(lm, row_compiled[i], decoded)
        except UnspellableError:
            # The batch cannot say whose state it was: its rows in flight are decoded again, each alone (as the
            # batch would have, seeded alike), and the one that reaches the state gets its partial output.
            for i in [i for i in taken if i in todo]:
                yield i, _alone(lm, row_compiled[i], todo.pop(i).prompt_ids, checked, i)


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


def _prepare(model: LM | str, spec: Any, prompt: Prompt, options: GenerateOptions) -> tuple[LM, Compiled, list[int]]:
    """The loaded model, the compiled spec and the prompt's ids: every check before the first pass (the
    arguments' order and the prompt's shape before the model loads)."""
    _check_order(spec, prompt)
    check_prompt(prompt)
    lm = load(model) if isinstance(model, str) else model
    options.check_model(lm)
    prompt_ids = _prompt_ids(lm, prompt, spec)
    return lm, options.compile(spec, lm), prompt_ids


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


def _generate(
    model: LM | str, spec: Any, prompt: Prompt, options: GenerateOptions, streamer: Streamer | None,
) -> Result:
    """Decode one output, putting its tokens to ``streamer`` as they are accepted."""
    lm, compiled, prompt_ids = _prepare(model, spec, prompt, options)
    events = _events(lm, compiled, prompt_ids, options, fields=False)
    if streamer is not None:
        events = _put(events, prompt_ids, streamer)
    *_, finished = events
    assert isinstance(finished, Finished), "the last event is Finished"
    return finished.result


def _taking(rows: list[RowInput], taken: list[int]) -> Iterator[RowInput]:
    """``rows``, each one's index appended to ``taken`` as it is taken."""
    for row in rows:
        taken.append(row.index)
        yield row


def _alone(lm: LM, compiled: Compiled, prompt_ids: list[int], options: GenerateOptions, row: int) -> Result:
    """Batch row ``row`` decoded on its own, seeded as in the batch; reaching a state the vocabulary cannot
    spell on from, its `Result` is the partial output with the error (naming the row) in ``error``."""
    seeded = replace(options, seed=None if options.seed is None else options.seed + row)
    try:
        *_, finished = _events(lm, compiled, prompt_ids, seeded, fields=False)
    except UnspellableError as error:
        _in_row(error, row)
        return error.result
    return finished.result  # type: ignore[union-attr]


def _put(events: Iterator[StreamEvent], prompt_ids: list[int], streamer: Streamer) -> Iterator[StreamEvent]:
    """``events``, each chunk's token ids put to ``streamer`` as it passes: transformers' order (the prompt's
    ids, then new ids as [1, n] LongTensors, as its assisted decoding puts them, then ``end()``)."""
    streamer.put(torch.tensor([prompt_ids]))
    try:
        for event in events:
            if isinstance(event, TextChunk) and event.token_ids:
                streamer.put(torch.tensor([event.token_ids]))
            yield event
    finally:
        streamer.end()  # also on an error, so a thread reading a TextIteratorStreamer is not left waiting


def _events(
    lm: LM, compiled: Compiled, prompt_ids: list[int], options: GenerateOptions, fields: bool,
) -> Iterator[StreamEvent]:
    """Decode, yielding a `TextChunk` per turn that accepted tokens, a `FieldDone` per closed top-level
    member when ``fields``, then `Finished`."""
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # as `TokenVocab.decode`, but holds split characters
    # (a spec with events of its own, such as a tool call's `CallDone`, reads them itself)
    members = (compiled.constraint.events or _Members)() if fields else None
    turns = decode_steps(lm, compiled.fsm, prompt_ids, options.decode_options(), make_drafter(options.draft, lm))
    out: list[int] = []
    out_sources: list[str] = []
    while True:
        try:
            ids, sources = next(turns)
        except StopIteration as stop:
            decoded: Decoded = stop.value
            break
        except UnspellableError as error:  # the output that reached the state goes with it, with the loop's stats
            error.attach(_result(lm, compiled, error.decoded))
            raise
        out += ids
        out_sources += sources
        chunk = TextChunk(utf8.decode(compiled.fsm.vocab.text_bytes(ids)), ids, sources)
        yield chunk
        if members is not None:
            yield from members.read(chunk.text)
    if tail := utf8.decode(b"", final=True):  # a character the budget cut short, as its replacement character
        yield TextChunk(tail, [], [])
    yield Finished(_result(lm, compiled, decoded))


class _Members:
    """Top-level members of a JSON object read from its text as it arrives; `read` yields a `FieldDone` at each
    ``,`` or ``}`` that closes one. Output that is not an object yields none."""

    def __init__(self) -> None:
        self.text = ""
        self.depth = 0  # of objects and arrays, outside strings
        self.in_string = self.escaped = False
        self.start = self.colon = -1  # the current member's first character and its ``:``, at depth 1
        self.done = False  # the top-level value closed, or is not an object

    def read(self, chunk: str) -> Iterator[FieldDone]:
        """Scan ``chunk`` (the text after what was read before). Changes the reader's position."""
        first = len(self.text)
        self.text += chunk
        for i in range(first, len(self.text)):
            if self.done:
                return
            c = self.text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif self.depth == 0:
                if not c.isspace():  # the top-level value starts
                    self.done = c != "{"
                    self.depth, self.start = 1, i + 1
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c == ":" and self.depth == 1:
                self.colon = i
            elif c in ",}" and self.depth == 1:
                if self.colon > self.start:  # not the empty object's ``}``
                    name = json.loads(self.text[self.start : self.colon])
                    yield FieldDone(name, json.loads(self.text[self.colon + 1 : i]), self.text[: i + 1])
                self.start, self.colon = i + 1, -1
                self.done = c == "}"
            elif c in "}]":
                self.depth -= 1


def _prompt_ids(lm: LM, prompt: Prompt, spec: Any = None) -> list[int]:
    """The prompt's token ids (chat messages get ``spec``'s tools in the chat template); `PromptError` if it
    leaves no room for output in the model's context."""
    tools = chat_tools(spec)
    ids = lm.encode_prompt(prompt, tools=tools) if tools and isinstance(prompt, list) else lm.encode_prompt(prompt)
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
    text = compiled.fsm.vocab.decode(decoded.token_ids)  # (special tokens a spec placed, as their text)
    result = Result(None, text, decoded.token_ids, decoded.stop_reason, decoded.stats, decoded.sources,
                    logprobs=decoded.logprobs)
    if compiled.constraint.thinking is not None:
        result.thinking = compiled.constraint.thinking(text)
    if result.complete:
        try:
            result.value = compiled.constraint.parse(text)
        except (pydantic.ValidationError, jsonschema.ValidationError, ValueError) as e:
            result.stop_reason = "invalid"
            result.error = InvalidOutput(result, " ".join(str(e).split())[:300] or type(e).__name__)
            result.error.__cause__ = e
    return result
