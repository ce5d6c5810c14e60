"""Enum and const nodes: their values checked against what the regex translation can write, and kept to those
of the node's type. Records its rewrites in the walk; changes no schema."""

from __future__ import annotations

from typing import Any

from structspec.errors import SchemaError
from structspec.schema.keywords import has_type
from structspec.schema.walk import Walk

def check_literals(walk: Walk, node: dict[str, Any], ptr: str, keyword: str, values: list[Any]) -> None:
    """Check the ``values`` of ``node``'s ``enum`` or ``const`` (``keyword``): none is refused, objects and arrays
    are unenforced, numbers narrowed to the spelling the schema gives them; with a ``type`` beside them, the node
    becomes the enum of the values of that type."""
    if not values:
        raise SchemaError(keyword, ptr, "an empty enum admits no value; list at least one")
    walk.reject_others(node, ptr, {keyword, "type"})
    if any(isinstance(v, (dict, list)) for v in values):
        walk.unenforced(node, keyword, ptr, "object and array values are not supported")
        return
    if any(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        walk.rewrites.narrow(ptr, f"the numbers of {keyword} are written as the schema states them, not in "
                             "other spellings of the same value (1.0 or 1e0 for 1)")
    if "type" in node:  # a value must match both: keep the values of the node's type
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        typed = [v for v in values if any(has_type(v, t) for t in types)]
        if not typed:
            raise SchemaError(keyword, ptr, f"no value has the node's type {node['type']!r}")
        walk.rewrites.replace(node, {"enum": typed})
