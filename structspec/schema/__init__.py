"""Spec → constraint: output specs (Pydantic models, JSON Schemas, types, regexes) resolved to the regex that
constrains decoding and the parser of its output.

Modules, each one concept: `constraint` (the `Regex` and `Constraint` types), `spec`
(resolving a spec), `keywords` (keyword tables, JSON types), `pointers` (JSON pointers
and `$ref`), `validation` (a schema's draft: metaschema check, output validator),
`checker` (rejecting what the translation would ignore), `reach` (property counts,
dependentRequired, uniqueItems, ``not``, overlapping ``oneOf`` and recursive ``$ref`` as nodes it can
translate), `difference` (a regex less a finite set of texts, for ``not`` and ``oneOf``), `merge` (two nodes
as one),
`emit` (the checker's rewrites, and the regex they emit), `translate` (the checked schema as parsed regex
items, each node once and shared; leaves as outlines-core's text), `bounds` (numeric
bounds as digit regexes), `patterns` (ECMA patterns as JSON-safe regexes) and
`grammars` (the named-grammar catalogue).
"""

from structspec.schema.constraint import COMPACT, Constraint, Regex
from structspec.schema.spec import constraint_of, to_regex
from structspec.schema.validation import validator

__all__ = ["COMPACT", "Constraint", "Regex", "constraint_of", "to_regex", "validator"]
