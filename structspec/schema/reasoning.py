"""`Reasoning`: think first, then answer in a spec — free thinking up to an end marker, then the spec's value.

A thinking budget (``max_thinking_chars``) bounds the thinking in characters: once it is spent, the end marker
is the only way on, so fast-forward writes it without a model call (vLLM's "thinking budget", counted in
characters so that the language stays regular and the mask stays the token FSM's own). ``Result.value`` is the
answer's value; ``Result.thinking`` keeps the thinking text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from structspec.errors import OptionError
from structspec.schema.constraint import Constraint
from structspec.schema.structural import Marker, Text, Writer


@dataclass(frozen=True)
class Reasoning:
    """Thinking, then ``spec``'s value.

    ``begin``: a marker the output opens with (None where the prompt already opened the thinking, or the model
    writes none); ``end``: the marker that closes the thinking (text or a `Special` token; ``"</think>"`` by
    default); ``max_thinking_chars``: the thinking budget in characters, after which ``end`` is forced (None:
    no budget; with a text ``end`` a budgeted thinking holds no ``end``'s first character, a narrowing);
    ``separator``: a regex of what may stand between ``end`` and the answer (default: up to two spaces or
    newlines; bounded, so a model cannot write whitespace until its budget runs out).

    Typical use::

        spec = structspec.Reasoning(Answer, begin="<think>\\n", max_thinking_chars=400)
        result = structspec.generate_result(lm, spec, prompt)
        print(result.thinking, result.value)
    """

    spec: Any
    begin: Marker | None = None
    end: Marker = "</think>"
    max_thinking_chars: int | None = None
    separator: str = r"[ \n]{0,2}"

    def __post_init__(self) -> None:
        Text(stop=(self.end,), max_chars=self.max_thinking_chars)  # checks the marker and budget now
        if isinstance(self.spec, Reasoning):
            raise OptionError("Reasoning(Reasoning(...)): think once, then answer; pass the answer's spec")
        if not isinstance(self.separator, str):
            raise OptionError(f"separator must be a regex str, got {self.separator!r}")


def reasoning_constraint(spec: Reasoning, writer: Writer, answer: Constraint) -> Constraint:
    """``spec``'s `Constraint`, ``answer`` being its inner spec's: thinking, the end marker, the separator and
    the answer's regex; its value is the answer's, and ``thinking`` reads the thinking text back."""
    opening = writer.marker(spec.begin) if spec.begin is not None else ""
    thinking = writer.write(Text(stop=(spec.end,), max_chars=spec.max_thinking_chars))
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
                      tuple(writer.specials), thinking=lambda text: split(text)[0])
