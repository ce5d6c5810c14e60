"""A schema's own draft (its ``$schema``, else the latest) as jsonschema reads it: the metaschema check and
the validator outputs are checked with."""

from __future__ import annotations

from typing import Any

import jsonschema
from jsonschema.protocols import Validator

from structspec.errors import SchemaError
from structspec.schema.keywords import NAMED
from structspec.schema.pointers import join


def validator(schema: Any) -> Validator:
    """A validator for ``schema`` under its own draft, checking formats with that draft's format checker.

    A bare ``FormatChecker()`` mixes the drafts' checkers (draft 3's ``time``
    rejects the ``Z`` that RFC 3339 allows).
    """
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def check_metaschema(schema: Any) -> None:
    """Raise `SchemaError` (the metaschema keyword that fails, at the pointer of the bad value) if ``schema``
    is not a valid JSON Schema of its draft."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise SchemaError(*_keyword_at(schema, e), f"not a valid JSON Schema: {e.message}") from None


def _keyword_at(schema: dict[str, Any], error: jsonschema.SchemaError) -> tuple[str, str]:
    """The keyword of ``schema`` whose value the metaschema rejects, and the pointer of the node holding it."""
    path = list(error.path)
    if error.validator in ("dependencies", "dependentRequired") and isinstance(error.instance, dict):
        # a keyword that needs another beside it (draft 4's exclusiveMinimum needs minimum)
        needy = next((k for k, needs in error.validator_value.items() if k in error.instance
                      and isinstance(needs, list) and not set(needs) <= set(error.instance)), None)
        if needy is not None:
            return needy, join("", *path)
    node: Any = schema
    pointer = holder = ""
    keyword = str(error.validator)  # (the metaschema's, where the path names none of the schema's)
    while path and isinstance(node, dict):
        keyword, holder = path.pop(0), pointer
        node, pointer = node.get(keyword), join(pointer, keyword)
        if path and (keyword in NAMED or isinstance(node, list)):  # then a name or an index
            node, pointer = node[path[0]], join(pointer, path.pop(0))
    return keyword, holder
