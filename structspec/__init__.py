"""structspec: constrained structured generation with exact forward-pass accounting."""

from structspec.api import Compiled, compile, generate, generate_result
from structspec.errors import (
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
from structspec.schema.translate import Regex, to_regex

__all__ = [
    "LM", "Compiled", "ModelNotFoundError", "OptionError", "PromptError", "Regex", "RegexError", "Result",
    "SchemaError", "SpecError", "Stats", "StructspecError", "TokenBudgetExceeded",
    "VocabularyMismatchError", "compile", "from_transformers", "generate", "generate_result",
    "grammars", "load", "to_regex",
]
