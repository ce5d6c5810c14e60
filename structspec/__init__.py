"""structspec: constrained structured generation with exact forward-pass accounting."""

from structspec.automaton import UnspellableError
from structspec.api import (
    Compiled,
    GenerateOptions,
    clear_cache,
    compile,
    generate,
    generate_batch,
    generate_result,
    iter_batch,
    stream,
)
from structspec.errors import (
    InvalidOutput,
    ModelNotFoundError,
    OptionError,
    PromptError,
    RegexError,
    SchemaError,
    SpecError,
    StructspecError,
    TokenBudgetExceeded,
    VocabularyMismatchError,
)
from structspec.lm import LM, from_transformers, load
from structspec.result import FieldDone, Finished, Result, Stats, StreamEvent, TextChunk
from structspec.schema import grammars
from structspec.schema import Regex, to_regex

__all__ = [
    "LM", "Compiled", "FieldDone", "Finished", "GenerateOptions", "InvalidOutput", "ModelNotFoundError", "OptionError",
    "PromptError", "Regex", "RegexError", "Result", "SchemaError", "SpecError", "Stats", "StreamEvent",
    "StructspecError", "TextChunk", "TokenBudgetExceeded", "UnspellableError", "VocabularyMismatchError",
    "clear_cache", "compile", "from_transformers", "generate", "generate_batch", "generate_result", "grammars",
    "iter_batch", "load", "stream", "to_regex",
]
