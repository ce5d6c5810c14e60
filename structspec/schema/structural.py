"""Composable specs for agents' outputs: free text, tags, sequences and triggered tags, compiled into one regex.

Regular languages are closed under concatenation, union and star, so "free text without ``</think>``, then
``</think>``, then a JSON Schema" is one regex, and one `TokenFSM`. A marker is text or a special token
(`Special`): a special token is written in the regex as a *symbol* (`structspec.vocab.SYMBOLS`), which only
that token id spells (`TokenVocab.with_symbols`), so special tokens appear only where a spec places them,
never inside free text or JSON. Modelled on XGrammar-2's structural tags::

    spec = Sequence(Tag("<think>", Text(), "</think>"), Invoice)      # think, then a JSON value
    spec = Triggered((Tag(Special("<tool_call>"), Call, Special("</tool_call>")),))  # text with calls in it

A structural spec's value is its text; `ToolCalls` and `Reasoning` parse theirs into calls and answers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from structspec.automaton.budget import TokenBudget
from structspec.errors import MarkerError, OptionError
from structspec.schema.constraint import Constraint, Regex
from structspec.schema.stops import avoiding, until
from structspec.vocab import SYMBOLS, TokenVocab, symbol_bytes

_ANY = r"[\s\S]"


@dataclass(frozen=True)
class Special:
    """A special token as a marker, by id or by its text in the tokenizer (``Special("<tool_call>")``, id
    151657 in Qwen2.5's). It is one symbol that only this token spells."""

    token: int | str

    def __post_init__(self) -> None:
        token = self.token
        if isinstance(token, bool) or not isinstance(token, (int, str)) or token == "" or (
                isinstance(token, int) and token < 0):
            raise OptionError(f"Special({token!r}) names no token: pass a token id (an int >= 0) or the token's "
                              "text, e.g. Special('<tool_call>')")


Marker = str | Special


def check_marker(marker: Any, what: str) -> None:
    """`OptionError` naming ``what`` unless ``marker`` is a non-empty str or a `Special` token."""
    if not isinstance(marker, Special) and (not isinstance(marker, str) or not marker):
        raise OptionError(f"{what} must be a non-empty str or a Special token, got {marker!r}: pass text such as "
                          "'</think>', or Special('<|im_end|>') for a special token")


def _as_tuple(spec: Any, name: str, example: str) -> None:
    """Store ``spec``'s field ``name`` (a list or tuple) as a tuple; `OptionError` naming it for a lone str or
    anything else."""
    value = getattr(spec, name)
    if isinstance(value, (str, Special)) or not isinstance(value, (list, tuple)):
        raise OptionError(f"{name}={value!r} is not a tuple: pass a tuple of them, e.g. {name}=({example},)")
    object.__setattr__(spec, name, tuple(value))  # (frozen; a list given is kept as a tuple, so it hashes)


@dataclass(frozen=True)
class Text:
    """Free text. ``stop``: the text ends with the first of these strings or special tokens (written last, part
    of the text); None: it runs to the end of the output (or of the `Tag` it is in). ``max_tokens`` bounds it
    in tokens: once that many are written, only a stop may follow (the rest of one partly written, or a stop
    token), or the end of the output; a text with it must open the output (the spec itself, a `Sequence`'s
    first part, or a `Tag`'s content there). ``max_chars`` bounds its length in characters (the stop aside);
    with text stops, the bounded text leaves out their first characters (a narrowing that keeps the language
    regular and small). ``avoid`` are strings the text never holds (a later marker's text)."""

    stop: tuple[Marker, ...] | None = None
    max_chars: int | None = None
    avoid: tuple[str, ...] = ()
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.stop is not None:
            _as_tuple(self, "stop", "'</think>'")
        _as_tuple(self, "avoid", "'<tool_call>'")
        if self.stop is not None and not self.stop:
            raise OptionError("Text(stop=()) names no stop: pass at least one stop string or Special token, or "
                              "stop=None for text that runs to the end of the output")
        if any(isinstance(s, str) and not s for s in (*(self.stop or ()), *self.avoid)):
            raise OptionError("a stop or avoided string is empty: every text would hold it; remove it")
        for stop in self.stop or ():
            check_marker(stop, "a stop")
        if not all(isinstance(a, str) for a in self.avoid):
            raise OptionError(f"avoid={self.avoid!r} holds a non-str: pass the strings the text never holds")
        for name in ("max_chars", "max_tokens"):
            bound = getattr(self, name)
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
                raise OptionError(f"{name} must be an int >= 0 or None, got {bound!r}")


@dataclass(frozen=True)
class Tag:
    """``begin``, then ``content`` (any spec: a JSON Schema, a model, a `Regex`, another structural spec), then
    ``end``; each marker is text or a `Special` token."""

    begin: Marker
    content: Any
    end: Marker

    def __post_init__(self) -> None:
        check_marker(self.begin, "a Tag's begin")
        check_marker(self.end, "a Tag's end")


@dataclass(frozen=True, init=False)
class Sequence:
    """Its parts one after another: ``Sequence(Tag("<think>", Text(), "</think>"), Answer)``."""

    parts: tuple[Any, ...]

    def __init__(self, *parts: Any) -> None:
        if not parts:
            raise OptionError("Sequence() has no parts: pass at least one spec")
        first = parts[0]
        if len(parts) > 1 and isinstance(first, Text) and first.max_tokens is not None and not first.stop:
            raise OptionError("a Text with max_tokens and no stop opens a Sequence with more parts: give it a "
                              "stop, so that the budget knows what to force once it is spent")
        for part in parts[1:]:
            unbudgeted(part)
        object.__setattr__(self, "parts", parts)


@dataclass(frozen=True)
class Triggered:
    """Free text in which writing a tag's ``begin`` marker (its trigger) commits to that tag: its content and
    end must follow, then free text again. ``at_least`` / ``at_most`` count the tags; the free text never holds
    a text trigger except as a tag's start."""

    tags: tuple[Tag, ...]
    at_least: int = 0
    at_most: int | None = None
    text: bool = True  # False: only tags, ``separator`` between them (and optionally after the last), no free text
    separator: str = ""

    def __post_init__(self) -> None:
        _as_tuple(self, "tags", "Tag('<a>', Text(), '</a>')")
        if not self.tags:
            raise OptionError("Triggered(tags=()) has no tags: pass at least one Tag")
        if not all(isinstance(t, Tag) for t in self.tags):
            raise OptionError(f"Triggered's tags must be Tags, got {self.tags!r}: wrap each as Tag(begin, content, "
                              "end)")
        for name in ("at_least", "at_most"):
            bound = getattr(self, name)
            if (bound is not None or name == "at_least") and (
                    isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
                raise OptionError(f"{name} must be an int >= 0{' or None' if name == 'at_most' else ''}, got "
                                  f"{bound!r}")
        if not isinstance(self.text, bool):
            raise OptionError(f"text must be a bool, got {self.text!r}: True for free text around the tags")
        if not isinstance(self.separator, str):
            raise OptionError(f"separator must be a str (the text between tags), got {self.separator!r}")
        if self.at_most is not None and self.at_most < max(self.at_least, 1):
            raise OptionError(f"at_most={self.at_most} is below at_least={self.at_least} (or 1): raise at_most")
        for tag in self.tags:
            unbudgeted(tag)


STRUCTURAL = (Text, Tag, Sequence, Triggered)


@dataclass
class Writer:
    """Writes a structural spec as regex text for one tokenizer; collects the special tokens it places.

    ``token_ids`` maps token texts to ids (read once, when a `Special` names a text); ``inner`` resolves any
    other spec to its `Constraint`. Changes only its own list of special tokens.
    """

    vocab: TokenVocab
    token_ids: Callable[[], Mapping[str, int]]
    inner: Callable[[Any], Constraint]
    texts: Callable[[int], str]
    specials: list[tuple[int, str]] = field(default_factory=list)
    _names: Mapping[str, int] | None = None

    def special(self, marker: Special) -> str:
        """The symbol of ``marker``'s token; `MarkerError` if the tokenizer has no such token."""
        if isinstance(marker.token, str):
            if self._names is None:
                self._names = self.token_ids()
            if marker.token not in self._names:
                raise MarkerError(f"the tokenizer has no token {marker.token!r}: name a special token it has (by "
                                  "its text or id), or use the marker as text (a str)")
            token = (self._names[marker.token], marker.token)
        else:
            if isinstance(marker.token, bool) or not isinstance(marker.token, int) or not (
                    0 <= marker.token < len(self.vocab)):
                raise MarkerError(f"Special({marker.token!r}) is no token id of this tokenizer (0 to "
                                  f"{len(self.vocab) - 1}): pass one of its ids, or its text")
            token = (marker.token, self.texts(marker.token))
        if token[0] == self.vocab.eos_token_id:
            raise MarkerError(f"Special({marker.token!r}) is the end token, which only ends the output: "
                              "use another special token as a marker")
        if token not in self.specials:
            if len(self.specials) > SYMBOLS[1] - SYMBOLS[0]:
                raise MarkerError("a spec places more than 512 distinct special tokens: use fewer")
            self.specials.append(token)
        return f"\\u{SYMBOLS[0] + self.specials.index(token):04x}"

    def marker(self, marker: Marker) -> str:
        """The regex of a marker; `MarkerError` for text the vocabulary cannot spell."""
        if isinstance(marker, Special):
            return self.special(marker)
        if not isinstance(marker, str) or not marker:
            raise OptionError(f"a marker is a non-empty str or a Special token, got {marker!r}")
        if not spellable(marker.encode(), self.vocab):
            raise MarkerError(f"the vocabulary cannot spell the marker {marker!r}: use text its tokens spell, "
                              "or a Special token")
        return re.escape(marker)

    def write(self, spec: Any) -> str:
        """The regex text of ``spec`` (a structural spec, or any spec ``inner`` resolves)."""
        if isinstance(spec, Text):
            return self.text(spec)
        if isinstance(spec, Tag):
            return f"{self.marker(spec.begin)}(?:{self.write(spec.content)}){self.marker(spec.end)}"
        if isinstance(spec, Sequence):
            return "".join(f"(?:{self.write(part)})" for part in spec.parts)
        if isinstance(spec, Triggered):
            return self.triggered(spec)
        return self.inner(spec).regex

    def text(self, spec: Text) -> str:
        words = tuple(s for s in spec.stop or () if isinstance(s, str))
        tokens = [self.special(s) for s in spec.stop or () if isinstance(s, Special)]
        for word in words:
            self.marker(word)  # spellable
        avoid = tuple(dict.fromkeys((*words, *spec.avoid)))
        if spec.max_chars is None:
            ends = [until(words, spec.avoid)] if words else []
            free = avoiding(avoid)
        else:  # a bounded count over one character: the avoided words' first characters are left out
            first = "".join(sorted({w[0] for w in avoid}))
            free = f"{f'[^{re.escape(first)}]' if first else _ANY}{{0,{spec.max_chars}}}"
            ends = [f"(?:{free})(?:{'|'.join(map(re.escape, words))})"] if words else []
        if spec.stop is None:
            return free
        if tokens:
            ends.append(f"(?:{free})(?:{'|'.join(tokens)})")
        return "|".join(f"(?:{e})" for e in ends)

    def marker_bytes(self, marker: Marker) -> bytes:
        """The bytes a marker spells in the FSM's vocabulary (a special token's are its symbol's)."""
        return symbol_bytes(int(self.special(marker)[2:], 16)) if isinstance(marker, Special) else marker.encode()

    def budget(self, spec: Any, opening: bytes = b"", end: Marker | None = None) -> TokenBudget | None:
        """The token budget of the `Text` with ``max_tokens`` that opens ``spec`` (after ``opening``; ``end``
        closes a stopless text: its `Tag`'s end), or None. A budgeted text anywhere else was refused when the spec
        holding it was made (`unbudgeted`)."""
        if isinstance(spec, Text) and spec.max_tokens is not None:
            stops = spec.stop if spec.stop is not None else (end,) if end is not None else ()
            return TokenBudget(spec.max_tokens, opening, tuple(dict.fromkeys(map(self.marker_bytes, stops))))
        if isinstance(spec, Tag):
            return self.budget(spec.content, opening + self.marker_bytes(spec.begin), spec.end)
        if isinstance(spec, Sequence):  # (its later parts hold no budget: checked when it was made)
            return self.budget(spec.parts[0], opening, end)
        return None

    def marker_text(self, marker: Marker) -> str:
        """The text a marker shows in the output (a special token's own text)."""
        return marker if isinstance(marker, str) else self.specials[int(self.special(marker)[2:], 16) - SYMBOLS[0]][1]

    def triggered(self, spec: Triggered, opening: str | None = None) -> str:
        """The regex of ``spec``; ``opening``: the regex of its first free text, where it is narrower than the
        rest (a subset of it: `ToolCalls`' text that opens with no bare call)."""
        # The free text holds no tag's begin marker as text (a special one's text too: the output then splits
        # at markers without doubt).
        begins = self.begin_texts(spec)
        tags = "|".join(f"(?:{self.write(t)})" for t in spec.tags)
        free = avoiding(begins) if spec.text else ""
        between = free if spec.text else re.escape(spec.separator)
        # without text, a separator may still follow the last tag (models end their calls on "\n")
        tail = free if spec.text else f"(?:{between})?" if spec.separator else ""
        high = "" if spec.at_most is None else spec.at_most - 1
        body = f"(?:{tags})(?:(?:{between})(?:{tags})){{{max(spec.at_least - 1, 0)},{high}}}(?:{tail})"
        return f"(?:{free if opening is None else opening})(?:{body})" + ("" if spec.at_least else "?")

    def begin_texts(self, spec: Triggered) -> tuple[str, ...]:
        """The texts of ``spec``'s begin markers (a special token's own text), which its free text never holds."""
        return tuple(dict.fromkeys(self.marker_text(t.begin) for t in spec.tags))


def spellable(text: bytes, vocab: TokenVocab) -> bool:
    """Whether some sequence of the vocabulary's text tokens spells exactly ``text``. Changes nothing."""
    ids = vocab.ids_by_bytes
    longest = max(map(len, ids), default=0)
    reach = [True] + [False] * len(text)
    for i in range(len(text)):
        if reach[i]:
            for j in range(i + 1, min(len(text), i + longest) + 1):
                if text[i:j] in ids:
                    reach[j] = True
    return reach[-1]


def unbudgeted(spec: Any) -> None:
    """`OptionError` if a `Text` inside ``spec`` has ``max_tokens``: there it would not open the output."""
    if isinstance(spec, Text) and spec.max_tokens is not None:
        raise OptionError(f"Text(max_tokens={spec.max_tokens}) does not open the output: a token budget counts "
                          "from the output's start (the spec itself, a Sequence's first part, or a Tag's content "
                          "there); bound this text with max_chars instead")
    for inner in (spec.content,) if isinstance(spec, Tag) else spec.parts if isinstance(spec, Sequence) else (
            spec.tags if isinstance(spec, Triggered) else ()):
        unbudgeted(inner)


def structural_constraint(spec: Any, writer: Writer) -> Constraint:
    """A structural spec's `Constraint`: its regex, its special tokens, its token budget, and its text as its
    value."""
    regex = writer.write(spec)
    return Constraint(regex, lambda text: text, None, (), tuple(writer.specials), budget=writer.budget(spec))


__all__ = ["STRUCTURAL", "Marker", "Regex", "Sequence", "Special", "Tag", "Text", "Triggered", "Writer",
           "check_marker", "spellable", "structural_constraint", "unbudgeted"]
