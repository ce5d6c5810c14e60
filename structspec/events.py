"""One output decoded as stream events: a `TextChunk` per turn that accepted tokens, a `FieldDone` per closed
top-level member of a JSON object, then `Finished` with the `Result` (whatever the stop reason, "error"
included); and the `Result` made of a decode. Reads a compiled spec through `CompiledSpec`, so it imports
nothing above it."""

from __future__ import annotations

import codecs
import json
from collections.abc import Generator, Iterator
from typing import Any, Protocol

import jsonschema
import pydantic
import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.cost import pass_cost
from structspec.decoding.drafters.factory import make_drafter
from structspec.decoding.loop import decode_steps
from structspec.decoding.row import Decoded, RowInput
from structspec.errors import InvalidOutput, PromptError
from structspec.models.protocol import LanguageModel, Prompt
from structspec.options import GenerateOptions
from structspec.result import FieldDone, Finished, Result, StreamEvent, TextChunk
from structspec.schema import Constraint
from structspec.schema.toolcalls import showing_tools


class CompiledSpec(Protocol):
    """What decoding reads of a compiled spec (`structspec.Compiled` is one): its constraint, token FSM, model
    and the tools a chat prompt's template is given."""

    @property
    def constraint(self) -> Constraint: ...

    @property
    def fsm(self) -> TokenFSM: ...

    @property
    def lm(self) -> LanguageModel: ...

    @property
    def tools(self) -> list[dict[str, Any]] | None: ...


class Streamer(Protocol):
    """transformers' streamer convention (``TextStreamer``, ``TextIteratorStreamer``)."""

    def put(self, value: torch.Tensor) -> None: ...

    def end(self) -> None: ...


def put_to(events: Iterator[StreamEvent], prompt_ids: list[int], streamer: Streamer) -> Iterator[StreamEvent]:
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


def decode_events(
    compiled: CompiledSpec, prompt_ids: list[int], options: GenerateOptions, fields: bool,
) -> Iterator[StreamEvent]:
    """Decode, yielding a `TextChunk` per turn that accepted tokens, a `FieldDone` per closed top-level
    member when ``fields``, then `Finished` with the `Result`: a state the vocabulary cannot spell on from is its
    stop reason ``"error"``, with the `UnspellableError` in ``Result.error`` (raised by no event)."""
    lm = compiled.lm
    utf8 = codecs.getincrementaldecoder("utf-8")("replace")  # as `TokenVocab.decode`, but holds split characters
    # (a spec with events of its own, such as a tool call's `CallDone`, reads them itself)
    members = (compiled.constraint.events or _Members)() if fields else None
    row = RowInput(0, compiled.fsm, prompt_ids, make_drafter(options.draft, lm), None)
    turns = _Returning(decode_steps(lm, row, options.decode_options(), pass_cost(lm)))  # the curve read once
    for ids, sources in turns:
        chunk = TextChunk(utf8.decode(compiled.fsm.vocab.text_bytes(ids)), ids, sources)
        yield chunk
        if members is not None:
            yield from members.read(chunk.text)
    if tail := utf8.decode(b"", final=True):  # a character the budget cut short, as its replacement character
        yield TextChunk(tail, [], [])
    yield Finished(result_of(compiled, turns.value))


class _Returning:
    """A decode's turns to iterate over, and then (``value``) the `Decoded` its generator returned."""

    def __init__(self, turns: Generator[tuple[list[int], list[str]], None, Decoded]) -> None:
        self.turns = turns
        self.value: Decoded

    def __iter__(self) -> Generator[tuple[list[int], list[str]], None, None]:
        self.value = yield from self.turns


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


def chat_prompt_ids(lm: LanguageModel, prompt: Prompt, tools: list[dict[str, Any]] | None) -> list[int]:
    """The prompt's token ids on ``lm``; chat messages get ``tools`` (OpenAI-style dicts) through the chat
    template, or, where the template ignores ``tools=`` (renders the same ids without them), in the system
    message (`showing_tools`): a model never gets a tool spec without seeing its tools. Changes nothing."""
    if not tools or not isinstance(prompt, list):
        return lm.encode_prompt(prompt)
    ids = lm.encode_prompt(prompt, tools=tools)
    try:
        bare = lm.encode_prompt(prompt)
    except Exception:  # a template that reads `tools` unguarded fails without them: it shows them
        return ids
    return lm.encode_prompt(showing_tools(prompt, tools)) if ids == bare else ids


def prompt_ids_of(compiled: CompiledSpec, prompt: Prompt) -> list[int]:
    """The prompt's token ids on the compiled spec's model (chat messages get the spec's tools:
    `chat_prompt_ids`); `PromptError` if it leaves no room for output in the model's context."""
    lm = compiled.lm
    ids = chat_prompt_ids(lm, prompt, compiled.tools)
    if lm.max_context is not None and len(ids) >= lm.max_context:
        raise PromptError(
            f"the prompt has {len(ids)} tokens but {lm.name} has {lm.max_context} positions for prompt and "
            "output together: shorten the prompt"
        )
    return ids


def result_of(compiled: CompiledSpec, decoded: Decoded) -> Result:
    """The `Result` of ``decoded``: its text, the parsed value where it is complete (``"invalid"`` with
    `InvalidOutput` where the spec's validator rejects it), the decode's error where it stopped on one (carrying
    the result), and the compile's cost in its stats. Changes ``decoded``'s stats and error."""
    decoded.stats.compile_seconds = compiled.fsm.info.seconds
    decoded.stats.compile_source = compiled.fsm.info.source
    text = compiled.fsm.vocab.decode(decoded.token_ids)  # (special tokens a spec placed, as their text)
    result = Result(None, text, decoded.token_ids, decoded.stop_reason, decoded.stats, decoded.sources,
                    logprobs=decoded.logprobs)
    if compiled.constraint.thinking is not None:
        result.thinking = compiled.constraint.thinking(text)
    if decoded.error is not None:
        decoded.error.carrying(result)  # (sets result.error: its own error, the decode's may be shared)
    if result.complete:
        try:
            result.value = compiled.constraint.parse(text)
        except (pydantic.ValidationError, jsonschema.ValidationError, ValueError) as e:
            result.stop_reason = "invalid"
            result.error = InvalidOutput(result, " ".join(str(e).split())[:300] or type(e).__name__)
            result.error.__cause__ = e
    return result
