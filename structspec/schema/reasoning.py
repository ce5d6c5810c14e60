"""`Reasoning`: think first, then answer in a spec — free thinking up to an end marker, then the spec's value.

A thinking budget bounds the thinking in tokens (``max_thinking_tokens``, vLLM's "thinking budget") or in
characters (``max_thinking_chars``): once it is spent, the end marker is the only way on, so fast-forward
writes it without a model call where it is one token. ``Result.value`` is the answer's value;
``Result.thinking`` keeps the thinking text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from structspec.automaton.parse import parse, write
from structspec.errors import OptionError, RegexError
from structspec.schema.constraint import Constraint
from structspec.schema.structural import Marker, Text, Writer, check_marker, unbudgeted


@dataclass(frozen=True)
class Reasoning:
    """Thinking, then ``spec``'s value.

    ``begin``: a marker the output opens with (None where the prompt already opened the thinking, or the model
    writes none); ``end``: the marker that closes the thinking (text or a `Special` token; ``"</think>"`` by
    default); ``max_thinking_tokens``: the thinking budget in tokens (``begin`` aside), after which ``end`` is
    forced — the rest of it where the thinking already wrote its first part (None: no budget);
    ``max_thinking_chars``: a budget in characters (with a text ``end`` a thinking so bounded holds no
    ``end``'s first character, a narrowing);
    ``separator``: a regex of what may stand between ``end`` and the answer (default: up to two spaces or
    newlines; bounded, so a model cannot write whitespace until its budget runs out).

    Typical use::

        spec = structspec.Reasoning(Answer, begin="<think>\\n", max_thinking_tokens=128)
        result = structspec.generate_result(lm, spec, prompt)
        print(result.thinking, result.value)
    """

    spec: Any
    begin: Marker | None = None
    end: Marker = "</think>"
    max_thinking_chars: int | None = None
    separator: str = r"[ \n]{0,2}"
    max_thinking_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.begin is not None:
            check_marker(self.begin, "begin")
        check_marker(self.end, "end")
        self.thinking()  # checks the budgets now
        unbudgeted(self.spec)  # the answer does not open the output
        if isinstance(self.spec, Reasoning):
            raise OptionError("Reasoning(Reasoning(...)): think once, then answer; pass the answer's spec")
        if not isinstance(self.separator, str):
            raise OptionError(f"separator must be a regex str, got {self.separator!r}")
        try:
            write(parse(self.separator))  # (the automaton's reader: Python's syntax, less what no automaton holds)
        except RegexError as error:
            raise OptionError(f"separator={self.separator!r} is no regex structspec reads ({error.reason}): pass a "
                              "regex of what may stand between the end marker and the answer, such as "
                              "r'[ \\n]{0,2}', or re.escape(text) for text") from None

    def thinking(self) -> Text:
        """The thinking as a `Text`: up to ``end``, within the budgets."""
        try:
            return Text(stop=(self.end,), max_chars=self.max_thinking_chars, max_tokens=self.max_thinking_tokens)
        except OptionError as error:  # name Reasoning's own keywords
            raise OptionError(str(error).replace("max_chars", "max_thinking_chars").replace(
                "max_tokens", "max_thinking_tokens")) from None


def reasoning_constraint(spec: Reasoning, writer: Writer, answer: Constraint) -> Constraint:
    """``spec``'s `Constraint`, ``answer`` being its inner spec's: thinking, the end marker, the separator and
    the answer's regex; its value is the answer's, and ``thinking`` reads the thinking text back."""
    opening = writer.marker(spec.begin) if spec.begin is not None else ""
    thought = spec.thinking()
    thinking = writer.write(thought)
    budget = writer.budget(thought, writer.marker_bytes(spec.begin) if spec.begin is not None else b"")
    regex = f"{opening}(?:{thinking})(?:{spec.separator})(?:{answer.regex})"
    begin = writer.marker_text(spec.begin) if spec.begin is not None else ""
    end = writer.marker_text(spec.end)
    separator = re.compile(spec.separator)

    def split(text: str) -> tuple[str, str]:
        """(thinking, answer) of ``text``; the thinking is all of it until the end marker is written."""
        body = text[len(begin):] if text.startswith(begin) else text
        thought, marked, rest = body.partition(end)
        if not marked:
            return thought, ""
        gap = separator.match(rest)
        return thought, rest[gap.end() if gap else 0:]

    return Constraint(regex, lambda text: answer.parse(split(text)[1]), None, answer.narrowings,
                      tuple(writer.specials), thinking=lambda text: split(text)[0], budget=budget,
                      not_enforced=answer.not_enforced)
