"""Spec → constraint: output specs (Pydantic models, JSON Schemas, types, regexes) resolved to the regex that
constrains decoding and the parser of its output.

The wing's modules, one concept each (the spec kinds, keyword tables and JSON pointers, the keyword checker
and its per-type checks, node merging and rewriting, recursion, numeric bounds, ECMA patterns, the agents'
structural specs, the grammar catalogue), are listed one line each in docs/architecture.md.
"""

from structspec.schema.agents import agent_constraint, constraint_fsm, is_agent_spec
from structspec.schema.checker import STRICT_FIX
from structspec.schema.constraint import COMPACT, Constraint, Regex
from structspec.schema.spec import constraint_of, to_regex
from structspec.schema.stops import avoiding
from structspec.schema.validation import validator

__all__ = [
    "COMPACT", "STRICT_FIX", "Constraint", "Regex", "agent_constraint", "avoiding", "constraint_fsm", "constraint_of",
    "is_agent_spec", "to_regex", "validator",
]
