"""structspec: constrained structured generation with exact forward-pass accounting.

The errors and ``__version__`` are here at once; everything else is imported on first use (PEP 562), so
``import structspec`` and ``structspec --help`` do not import torch.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import TYPE_CHECKING, Any

from structspec.openmp import short_spin

short_spin()  # before anything imports torch: libgomp reads how its threads wait once, when it loads

from structspec.errors import (  # noqa: E402
    InvalidOutput,
    InvalidSchemaError,
    MarkerError,
    ModelNotFoundError,
    OptionError,
    PromptError,
    RegexError,
    SchemaError,
    SpecError,
    StructspecError,
    StructspecWarning,
    TokenBudgetExceeded,
    ToolError,
    ToolSchemaError,
    UnspellableError,
    VocabularyMismatchError,
)

if TYPE_CHECKING:  # what the lazy names below resolve to, for type checkers and IDEs
    from structspec.api import calibrate, clear_cache, generate, generate_batch, generate_result, iter_batch, stream
    from structspec.compiled import Compiled, compile
    from structspec.models.loading import load
    from structspec.models.transformers_lm import LM, from_transformers
    from structspec.decoding.drafters.factory import SelfDraft, Staged
    from structspec.decoding.drafters.tree import TreeDrafter
    from structspec.result import (CallDone, FieldDone, Finished, Result, Stats, StreamEvent, TextChunk, ToolCall,
                                   ToolCallsValue)
    from structspec.schema import Regex, grammars, to_regex
    from structspec.options import CompileOptions, GenerateOptions
    from structspec.schema.reasoning import Reasoning
    from structspec.schema.structural import Sequence, Special, Tag, Text, Triggered
    from structspec.schema.toolcalls import ToolCalls

_LAZY = {
    "structspec.api": ("calibrate", "clear_cache", "generate", "generate_batch", "generate_result", "iter_batch",
                       "stream"),
    "structspec.compiled": ("Compiled", "compile"),
    "structspec.options": ("CompileOptions", "GenerateOptions"),
    "structspec.models.loading": ("load",),
    "structspec.models.transformers_lm": ("LM", "from_transformers"),
    "structspec.decoding.drafters.factory": ("SelfDraft", "Staged"),
    "structspec.decoding.drafters.tree": ("TreeDrafter",),
    "structspec.result": ("CallDone", "FieldDone", "Finished", "Result", "Stats", "StreamEvent", "TextChunk",
                          "ToolCall", "ToolCallsValue"),
    "structspec.schema": ("Regex", "to_regex"),
    "structspec.schema.grammars": ("grammars",),  # the module itself
    "structspec.schema.reasoning": ("Reasoning",),
    "structspec.schema.structural": ("Sequence", "Special", "Tag", "Text", "Triggered"),
    "structspec.schema.toolcalls": ("ToolCalls",),
}
_HOME = {name: module for module, names in _LAZY.items() for name in names}


def _version() -> str:
    """The installed distribution's version ("structspec-lm" on the package index; "structspec" in an older
    install); "0+unknown" in a source tree that was never installed."""
    for distribution in ("structspec-lm", "structspec"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    return "0+unknown"


__version__ = _version()


def __getattr__(name: str) -> Any:
    """A public name (or a submodule, as ``structspec.models``) imported on first use, then kept in the module."""
    if name in _HOME:
        module = importlib.import_module(_HOME[name])
        value = module if module.__name__.endswith(f".{name}") else getattr(module, name)
    else:
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":  # the submodule exists and failed importing something else
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "LM", "CallDone", "CompileOptions", "Compiled", "FieldDone", "Finished", "GenerateOptions", "InvalidOutput",
    "InvalidSchemaError", "MarkerError", "ModelNotFoundError", "OptionError", "PromptError", "Reasoning", "Regex",
    "RegexError", "Result", "SchemaError", "SelfDraft", "Sequence", "Special", "SpecError", "Staged", "Stats",
    "StreamEvent", "StructspecError", "StructspecWarning", "Tag", "Text", "TextChunk", "TokenBudgetExceeded", "ToolCall", "ToolCalls",
    "ToolCallsValue", "ToolError", "ToolSchemaError", "TreeDrafter", "Triggered", "UnspellableError",
    "VocabularyMismatchError", "__version__", "calibrate", "clear_cache", "compile", "from_transformers", "generate",
    "generate_batch", "generate_result", "grammars", "iter_batch", "load", "stream", "to_regex",
]
