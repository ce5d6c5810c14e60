"""structspec: constrained structured generation with exact forward-pass accounting."""

from structspec.automaton import UnspellableError
from structspec.api import Compiled, clear_cache, compile, generate, generate_batch, generate_result, iter_batch
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
from structspec.result import Result, Stats
from structspec.schema import grammars
from structspec.schema import Regex, to_regex

__all__ = [
    "LM", "Compiled", "InvalidOutput", "ModelNotFoundError", "OptionError", "PromptError", "Regex", "RegexError", "Result",
    "SchemaError", "SpecError", "Stats", "StructspecError", "TokenBudgetExceeded", "UnspellableError",
    "VocabularyMismatchError", "clear_cache", "compile", "from_transformers", "generate", "generate_batch", "generate_result", "iter_batch",
    "grammars", "load", "to_regex",
]
