"""A `ToolCalls` turn's text read into its value: the calls where the grammar put them (after a begin marker, or
bare where the turn opens with one), their arguments validated by their tools' parsers, whole or as the turn
streams; and, in an ``auto`` turn's free text, calls written without the markers (`unmarked_calls`)."""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jsonschema

from structspec.result import CallDone, ToolCall, ToolCallsValue

NAME, ARGUMENTS = '{"name": ', ', "arguments": '  # a call's JSON opens with these, around its name
FENCES = ("```json\n", "```\n", "")  # what bare calls open with, as small models write them (closed by "\n```")
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def parse_turn(text: str, markers: tuple[str, str], parsers: dict[str, Callable[[str], Any]],
               unmarked: bool = False, bare: bool = False) -> ToolCallsValue:
    """The `ToolCallsValue` of a turn's text: the text before the first begin marker, then each call, read where
    the grammar put it — the JSON after a begin marker, decoded as one value (so marker text inside its strings
    is argument text), then its end marker — and its arguments validated by the tool's parser (which raises on
    invalid ones). ``bare``: a turn that opens with a bare call past any whitespace (`bare_opening`) is bare
    calls, one a line (the whitespace is its text). ``unmarked``: also look in the free text for calls written
    without the markers (an ``auto`` turn), kept in ``unmarked_calls`` with a warning. `ValueError` for a call
    that is not whole."""
    if bare and (opened := bare_opening(text)) is not None:
        return ToolCallsValue(text[:_SPACE.match(text).end()],
                              [call for call, _ in bare_calls(text, opened, parsers, whole=True)])
    begin, end = markers
    at, calls, free = text.find(begin), [], []
    free.append(text if at < 0 else text[:at])
    while at >= 0:
        found = locate_call(text, at + len(begin), end)
        if found is None:
            raise ValueError(f"the call opened at character {at} is not whole: {text[at:at + 80]!r}")
        name, arguments, stop = found
        if name not in parsers:
            raise ValueError(f"the call at character {at} names no tool: {name!r}")
        calls.append(ToolCall(name, parsers[name](arguments)))
        at = text.find(begin, stop)
        free.append(text[stop:] if at < 0 else text[stop:at])
    value = ToolCallsValue(free[0], calls)
    if unmarked and (written := unmarked_calls("".join(free), parsers)):
        warnings.warn(f"the model wrote {len(written)} call(s) to {', '.join(sorted({c.name for c in written}))} "
                      f"as text, without the {begin} markers: they are in unmarked_calls, not in calls; where a "
                      "call is needed, use choice='required' or name the tool", stacklevel=2)
        value = ToolCallsValue(free[0], calls, written)
    return value


def locate_call(text: str, at: int, end: str) -> tuple[str, str, int] | None:
    """The call whose JSON follows ``at`` (just after its begin marker), as the grammar writes it: its tool's name,
    its arguments' JSON text, and where its end marker ends (``end=""``: a bare call, where its ``}`` ends); None
    where ``text`` holds less than that (a turn still streaming). JSON strings are decoded whole, so marker text
    inside them is no marker. Changes nothing."""
    try:
        at = _SPACE.match(text, at).end()
        if not text.startswith(NAME, at):
            return None
        name, at = _DECODER.raw_decode(text, at + len(NAME))
        if not isinstance(name, str) or not text.startswith(ARGUMENTS, at):
            return None
        start = at + len(ARGUMENTS)
        _, at = _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        return None
    if not text.startswith("}", at):
        return None
    if not end:
        return name, text[start:at], at + 1
    close = _SPACE.match(text, at + 1).end()
    return (name, text[start:at], close + len(end)) if text.startswith(end, close) else None


def bare_opening(text: str) -> int | None:
    """Where the first call of a turn that opens with bare calls begins: past any whitespace and a fence (one of
    `FENCES`), at a ``{``; None for a turn that does not open so (yet). Changes nothing."""
    at = _SPACE.match(text).end()
    return next((at + len(f) for f in FENCES if text.startswith(f + "{", at)), None)


def bare_calls(text: str, at: int, parsers: dict[str, Callable[[str], Any]],
               whole: bool = False) -> Iterator[tuple[ToolCall, int]]:
    """The bare calls of ``text`` from ``at`` (where the first opens), one a line up to anything else (a closing
    fence), each with where it ends: those it holds whole (a turn streaming), or, ``whole``, every one
    (`ValueError` where one is not whole or its arguments fail the tool's parser; a stream skips the latter).
    Changes nothing."""
    at = _SPACE.match(text, at).end()
    while text.startswith("{", at):
        found = locate_call(text, at, "")
        if found is None:
            if whole:
                raise ValueError(f"the bare call at character {at} is not whole: {text[at:at + 80]!r}")
            return
        name, arguments, at = found
        if name not in parsers and whole:
            raise ValueError(f"the bare call ending at character {at} names no tool: {name!r}")
        try:
            call = ToolCall(name, parsers[name](arguments))
        except (KeyError, ValueError, jsonschema.ValidationError):
            if whole:
                raise
        else:
            yield call, at
        at = _SPACE.match(text, at).end()


def unmarked_calls(text: str, parsers: dict[str, Callable[[str], Any]]) -> list[ToolCall]:
    """Calls to the given tools written in free ``text`` without markers, as small models often write them: a
    JSON object ``{"name": ..., "arguments": {...}}`` (or ``"parameters"``), bare or in a fenced block, whose
    arguments the tool's parser accepts. Changes nothing."""
    found, at = [], text.find("{")
    while at >= 0:
        try:
            value, stop = _DECODER.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        call = _as_call(value, parsers)
        if call is not None:
            found.append(call)
        at = text.find("{", stop if call is not None else at + 1)
    return found


def _as_call(value: Any, parsers: dict[str, Callable[[str], Any]]) -> ToolCall | None:
    if not isinstance(value, dict) or value.get("name") not in parsers:
        return None
    arguments = value.get("arguments", value.get("parameters"))
    if isinstance(arguments, str):  # (OpenAI's wire format: the arguments as a JSON string)
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    try:
        return ToolCall(value["name"], parsers[value["name"]](json.dumps(arguments)))
    except (ValueError, jsonschema.ValidationError):  # (not a valid call of that tool: text, as it was written)
        return None


class CallReader:
    """Reads a `ToolCalls` turn as it streams; `read` yields a `CallDone` for each call its chunk closes, as
    `parse_turn` reads it. A call whose arguments fail their tool's validator yields none (the result says so)."""

    def __init__(self, markers: tuple[str, str], parsers: dict[str, Callable[[str], Any]],
                 bare: bool = False) -> None:
        self.markers, self.parsers, self.bare = markers, parsers, bare
        self.text, self.at = "", 0

    def read(self, chunk: str) -> Iterator[CallDone]:
        """Scan ``chunk`` (the text after what was read before). Changes the reader's position."""
        self.text += chunk
        if self.bare and (opened := bare_opening(self.text)) is not None:
            for call, stop in bare_calls(self.text, max(self.at, opened), self.parsers):
                self.at = stop
                yield CallDone(call, self.text[:stop])
            return
        begin, end = self.markers
        while (opened := self.text.find(begin, self.at)) >= 0:
            found = locate_call(self.text, opened + len(begin), end)
            if found is None:
                return  # (the call is still being written)
            name, arguments, self.at = found
            try:
                call = ToolCall(name, self.parsers[name](arguments))
            except (ValueError, jsonschema.ValidationError):
                continue
            yield CallDone(call, self.text[: self.at])
