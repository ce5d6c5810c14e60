"""A JSON value written as structspec writes it for a schema (compact, keys in ``properties`` order)."""

from __future__ import annotations

import json
from typing import Any

def in_layout(value: Any, node: Any, root: Any) -> str:
    """``value`` as structspec writes it: compact JSON, object keys in the schema's ``properties`` order."""
    return json.dumps(_ordered(value, node, root), separators=(",", ":"), ensure_ascii=False)


def _ordered(value: Any, node: Any, root: Any, depth: int = 0) -> Any:
    node = _resolve(node, root)
    if depth > 50 or not isinstance(node, dict):
        return value
    if isinstance(value, dict):
        props = _properties_for(value, node, root)
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        extra = node.get("additionalProperties", True)
        return {k: _ordered(value[k], props.get(k, extra), root, depth + 1) for k in keys}
    if isinstance(value, list):
        prefix = node.get("prefixItems") or (node["items"] if isinstance(node.get("items"), list) else [])
        rest = node.get("items") if isinstance(node.get("items"), dict) else True
        return [_ordered(v, prefix[i] if i < len(prefix) else rest, root, depth + 1) for i, v in enumerate(value)]
    return value


def _properties_for(value: dict[str, Any], node: dict[str, Any], root: Any) -> dict[str, Any]:
    """The ``properties`` of ``node``, or of its first branch whose properties cover ``value``'s keys."""
    if "properties" in node:
        return node["properties"]
    branches = [_resolve(b, root) for k in ("allOf", "anyOf", "oneOf") for b in node.get(k, [])]
    with_props = [b for b in branches if isinstance(b, dict) and isinstance(b.get("properties"), dict)]
    for b in with_props:
        if set(value) <= set(b["properties"]):
            return b["properties"]
    return with_props[0]["properties"] if with_props else {}


def _resolve(node: Any, root: Any) -> Any:
    for _ in range(20):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#")):
            return node
        target = root
        for part in filter(None, node["$ref"][1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        node = target
    return node
