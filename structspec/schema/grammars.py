"""Named regular grammars: dates, addresses, identifiers and numbers as `Regex` specs.

The catalogue is data (``grammars/catalogue.toml`` in the repository, installed as
``structspec.grammar_data``); each entry has a pattern, a description and valid
and invalid examples. Grammars are reached by Python name or catalogue name::

    import structspec
    structspec.generate(lm, structspec.grammars.e164_phone, "Call me at")
    structspec.grammars.get("e164-phone")  # the same Regex

JSON Schema ``format`` keywords use the same patterns (see `structspec.schema.checker`).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

from structspec.errors import SpecError
from structspec.schema.constraint import Regex

_REFERENCE = re.compile(r"\$\{([a-z0-9-]+)\}")


@dataclass(frozen=True)
class Grammar:
    """One catalogue entry: ``pattern`` fully expanded, with the examples it must accept and reject."""

    name: str
    pattern: str
    description: str
    valid: tuple[str, ...]
    invalid: tuple[str, ...]


@cache
def catalogue() -> dict[str, Grammar]:
    """Every grammar by catalogue name, read once from the installed catalogue."""
    raw = tomllib.loads(files("structspec.grammar_data").joinpath("catalogue.toml").read_text("utf-8"))

    def expand(pattern: str) -> str:  # ${name} → (pattern of name), resolved recursively
        return _REFERENCE.sub(lambda m: f"({expand(raw[m.group(1)]['pattern'])})", pattern)

    return {
        name: Grammar(name, expand(e["pattern"]), e["description"], tuple(e["valid"]), tuple(e["invalid"]))
        for name, e in raw.items()
    }


def names() -> list[str]:
    """Catalogue names of every grammar, sorted (``"e164-phone"``, ``"email"``, ...)."""
    return sorted(catalogue())


def get(name: str) -> Regex:
    """The grammar called ``name`` in the catalogue (``"e164-phone"``) or in Python (``"e164_phone"``)."""
    grammar = catalogue().get(name) or catalogue().get(name.replace("_", "-"))
    if grammar is None:
        raise SpecError(f"unknown grammar {name!r}; the grammars are: {', '.join(names())}")
    return Regex(grammar.pattern)


def __getattr__(attr: str) -> Any:
    """``structspec.grammars.e164_phone``: the grammar as a `Regex`."""
    name = attr.replace("_", "-")
    if name not in catalogue():
        raise AttributeError(f"module 'structspec.schema.grammars' has no grammar {attr!r}; "
                             f"the grammars are: {', '.join(n.replace('-', '_') for n in names())}")
    return get(name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | {n.replace("-", "_") for n in catalogue()})
