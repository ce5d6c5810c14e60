"""What a spec becomes: `Regex` (a regex as output spec) and `Constraint` (the regex that constrains decoding
and the parser of its output), and the default JSON layout `COMPACT`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from structspec.automaton.budget import TokenBudget
from structspec.automaton.parse import ParsedRegex
from structspec.errors import SpecError

COMPACT = ""
"""The default whitespace pattern: no whitespace between JSON tokens (``{"a":1,"b":[2,3]}``).

One fixed form means no runaway whitespace and long forced spans."""


@dataclass(frozen=True)
class Regex:
    """A regular expression as output spec: ``generate`` returns the matched ``str``. A pattern that is not a
    str is a `SpecError` when the spec is made."""

    pattern: str

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise SpecError(f"Regex(...) got a {type(self.pattern).__name__} as its pattern, not a str: pass the "
                            "regex text, e.g. structspec.Regex('[a-z]+')")


@dataclass(frozen=True)
class Constraint:
    """A spec resolved to the regex that constrains decoding and the parser of its output.

    ``pattern`` is what the automaton is built from: the regex text, or for a JSON Schema its parsed items
    (`ParsedRegex`), whose text `regex` writes on first read. ``narrowings`` lists where the regex admits less
    than the schema, one ``"pointer: what"`` each (digit bounds on unbounded numbers, bounds and lengths
    capped for automaton size). ``special_tokens`` are the (id, text) of the special tokens a structural spec
    places: the regex names the ``k``-th by the symbol ``chr(structspec.vocab.SYMBOLS[0] + k)``. ``thinking``
    reads a `Reasoning` spec's thinking back from the output text (None for other specs); ``events`` makes a
    stream's reader of the spec's own events (`ToolCalls`: a `CallDone` per finished call); ``budget`` bounds
    the free text that opens the output in tokens (`Text.max_tokens`, `Reasoning.max_thinking_tokens`).
    ``not_enforced`` lists the schema keywords ``strict=False`` dropped, one ``"'keyword' at /pointer"`` each (the
    warning names the same).
    """

    pattern: str | ParsedRegex
    parse: Callable[[str], Any]
    json_schema: dict[str, Any] | None  # None for a plain regex
    narrowings: tuple[str, ...] = ()
    special_tokens: tuple[tuple[int, str], ...] = ()
    thinking: Callable[[str], str] | None = None
    events: Callable[[], Any] | None = None
    budget: TokenBudget | None = None
    not_enforced: tuple[str, ...] = ()

    @property
    def regex(self) -> str:
        """The regex text, for other engines (a translated schema's is written on the first read, then kept)."""
        return str(self.pattern)
