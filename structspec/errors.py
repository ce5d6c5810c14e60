"""Every error structspec raises on bad input, each saying what to change."""

from __future__ import annotations

from typing import Any


class StructspecError(Exception):
    """Base class of every structspec error."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt from its message and attributes, not by calling its __init__ again (whose arguments differ by
        # class): an error raised in another process (a Ray actor, vLLM's engine core) arrives whole.
        return _rebuild, (type(self), self.args), self.__dict__


def _rebuild(cls: type[StructspecError], args: tuple[Any, ...]) -> StructspecError:
    """An error of class ``cls`` with message ``args``, its attributes to be set by unpickling."""
    return cls.__new__(cls, *args)


class SchemaError(StructspecError, ValueError):
    """A schema uses a feature structspec cannot enforce exactly.

    Raised at compile time, before any model call, naming the keyword and the
    JSON pointer of the schema node that holds it.
    """

    def __init__(self, keyword: str, pointer: str, reason: str) -> None:
        self.keyword = keyword
        self.pointer = pointer or "/"
        self.reason = reason
        super().__init__(f"unsupported schema keyword {keyword!r} at {self.pointer}: {reason}")


class RegexError(StructspecError, ValueError):
    """A regular expression that cannot be compiled into a token FSM."""

    def __init__(self, pattern: object, reason: str) -> None:
        self.pattern = pattern = str(pattern)  # (a parsed regex is written out)
        self.reason = reason
        shown = pattern if len(pattern) <= 200 else pattern[:200] + "…"
        super().__init__(f"invalid regex {shown!r}: {reason}")


class SpecError(StructspecError, TypeError):
    """An output spec of a kind structspec does not know (not a schema, regex or type)."""


class OptionError(StructspecError, ValueError):
    """A bad option: out of range or of the wrong type (``temperature=0`` with sampling, ``top_p=1.5``, ...), a
    keyword no call of that kind takes, or one the model cannot serve (a calibration of a model without a name)."""


class PromptError(StructspecError, ValueError):
    """An empty or malformed prompt."""


class VocabularyMismatchError(StructspecError, ValueError):
    """The tokenizer has token ids the model cannot produce."""


class ModelNotFoundError(StructspecError, LookupError):
    """A model name that is neither a shipped model nor a local directory."""


class TokenBudgetExceeded(StructspecError):
    """`generate` could not return a value: `max_new_tokens` (or the model's context) ran out before the
    output was complete.

    Carries the partial `Result` (text, token ids, sources, stats) so nothing
    generated is lost; `generate_result` returns that result instead of raising.
    """

    def __init__(self, max_new_tokens: int, result: Any) -> None:
        self.max_new_tokens = max_new_tokens
        self.result = result
        self.text: str = result.text
        self.token_ids: list[int] = result.token_ids
        self.stats = result.stats
        self.sources: list[str] = result.sources
        budget = (
            "the model's context filled up" if result.stop_reason == "max_context"
            else f"max_new_tokens={max_new_tokens} ran out"
        )
        fix = "shorten the prompt" if result.stop_reason == "max_context" else "raise max_new_tokens"
        super().__init__(f"{budget} before the output was complete (partial output: {self.text[-120:]!r}); {fix}")


class UnspellableError(StructspecError, ValueError):
    """Decoding reached a state where the constraint needs a character no token of this vocabulary (within
    the model's logits) can start: masking would leave nothing to choose.

    Met when the output first reaches the state (the automaton stays lazy; drafts and forced runs stop
    short of such states, so only the output itself reaches one); ``characters`` are some of those it needs
    next. A decode that meets it stops with the partial `Result` (``stop_reason="error"``) of the output that
    reached the state, forced text included, holding the error in ``error``: `generate_result`, `stream`'s
    `Finished` and each batch row return it (a row's error names it in ``row``; the other rows are
    unaffected), and `generate`, which must return a value, raises it. It carries that result: ``text``,
    ``token_ids``, ``sources`` and ``stats`` (the decode's passes, drafts and timings); these are None when
    it is raised outside a decode (`TokenFSM.allowed_token_ids`).
    """

    def __init__(self, state: int, characters: list[str]) -> None:
        self.state = state
        self.characters = characters
        self.result: Any = None
        self.text: str | None = None
        self.token_ids: list[int] | None = None
        self.sources: list[str] | None = None
        self.stats: Any = None
        super().__init__(self._message())

    def carrying(self, result: Any) -> UnspellableError:
        """A new error of this state and characters that carries ``result``, the output that reached the state,
        and quotes its text in its message (``result.error`` is set to it). This error is unchanged: a verdict
        on a state may be shared by every output that reaches it."""
        error = UnspellableError(self.state, self.characters)
        error.result, error.text, error.token_ids = result, result.text, result.token_ids
        error.sources, error.stats = result.sources, result.stats
        error.args = (error._message(),)
        result.error = error
        return error

    def _message(self) -> str:
        shown = ", ".join(repr(c) for c in self.characters) or "nothing"
        where = "here" if self.text is None else f"after the partial output {self.text[-120:]!r}"
        return (f"no token of this vocabulary can come next: the constraint needs {shown} {where} (FSM state "
                f"{self.state}); use a tokenizer that spells it, or a constraint that does not require it")


class InvalidOutput(StructspecError, ValueError):
    """The output matched the spec's constraint but its validator rejected it (a Pydantic validator, or a
    keyword kept for validation only): `generate` could not return a value.

    Carries the `Result` (``stop_reason="invalid"``, the text, tokens and stats)
    and the validator's own error as ``__cause__``.
    """

    def __init__(self, result: Any, reason: str) -> None:
        self.result = result
        self.text: str = result.text
        self.stats = result.stats
        super().__init__(f"the output does not validate ({reason}); output: {self.text[-200:]!r}")


class InvalidSchemaError(SchemaError):
    """A schema that is not a valid JSON Schema of its draft (``{"type": "strin"}``), raised at compile time
    naming the keyword and the JSON pointer of its node, with the nearest valid value where there is one."""

    def __init__(self, keyword: str, pointer: str, reason: str) -> None:
        super().__init__(keyword, pointer, reason)
        self.args = (f"invalid JSON Schema: keyword {keyword!r} at {self.pointer}: {reason}",)


class ToolError(SpecError, ValueError):
    """A tool set `ToolCalls` cannot use (a tool without a name, two tools with one name, a ``choice`` that
    names no tool), raised when the spec is made, before any model call."""


class ToolSchemaError(SchemaError):
    """A tool's parameters schema that does not compile: names the tool, the keyword and its JSON pointer."""

    def __init__(self, tool: str, error: SchemaError) -> None:
        super().__init__(error.keyword, error.pointer, error.reason)
        self.tool = tool
        self.args = (f"tool {tool!r}: {error}",)


class MarkerError(SpecError, ValueError):
    """A marker a structural spec cannot place: a special token the tokenizer does not have, or a text marker
    its vocabulary cannot spell; raised at compile time, before any model call."""


class StructspecWarning(UserWarning):
    """A spec that compiles but likely not as meant (a misspelled keyword, a format structspec does not know, a
    keyword ``strict=False`` dropped): said once per compile, naming the keyword, its JSON pointer and the fix.
    ``warnings.filterwarnings("error", category=structspec.StructspecWarning)`` makes them errors."""


DROPPED_WARNING = "strict=False: these schema keywords are not enforced: "
"""How the `StructspecWarning` naming the keywords ``strict=False`` dropped begins (a filter's ``message``: a job
lists them in its lines instead, from `structspec.schema.Constraint.not_enforced`)."""
