"""Recursive ``$ref`` unrolled to a depth: each reference inlined where one is recursive, the deepest level
leaving out the member that would recurse (a narrowing the caller lists). No input is changed."""

from __future__ import annotations

from typing import Any

from structspec.errors import SchemaError
from structspec.schema.keywords import ANNOTATIONS, LITERALS, NAMED, VALIDATION
from structspec.schema.pointers import Document, join

MAX_RECURSION_DEPTH = 3
"""How many levels a recursive definition nests by default (the ``max_recursion_depth`` option)."""


def unroll(schema: Any, depth: int, text: str | None = None) -> tuple[Document, list[str]]:
    """``schema`` with every ``$ref`` inlined when one is recursive (``schema`` itself otherwise): a recursive
    definition nests at most ``depth`` levels, and at the deepest level a member that would recurse is not
    offered (an optional property left out, an array kept empty, an ``anyOf``/``oneOf`` branch dropped).
    Returns the document of that schema and the narrowings made ("pointer: what"). `SchemaError` where a
    required member would recurse past ``depth``. ``text`` is the schema's JSON text if known (without
    ``"$ref"`` in it, no walk looks for cycles). Does not change ``schema``."""
    document = Document(schema)
    recursive = set() if text is not None and '"$ref"' not in text else _recursive_refs(schema, document)
    if not recursive:  # (no reference reaches itself: nothing to unroll)
        return document, []
    narrowed: dict[str, None] = {}
    done: dict[tuple[int, tuple[str, ...]], tuple[Any, Any]] = {}  # (id(node), chain) → (node, its expansion)
    fixed: dict[int, bool] = {}  # id(node) → whether no recursive $ref is reachable from it

    def chainless(node: Any) -> bool:
        """Whether ``node``'s expansion is the same under every chain: no recursive ``$ref`` is reachable from
        it (following references; only recursive ones close cycles). Memoized by node."""
        if isinstance(node, list):
            return all(map(chainless, node))
        if not isinstance(node, dict):
            return True
        found = fixed.get(id(node))
        if found is None:
            fixed[id(node)] = False  # (while it is being decided)
            ref = node.get("$ref")
            found = fixed[id(node)] = not (isinstance(ref, str) and (
                ref in recursive or not chainless(document.resolve(node)))) and all(map(chainless, _children(node)))
        return found

    def expand(node: Any, chain: tuple[str, ...], ptr: str) -> Any:
        # Only recursive refs enter the chain, kept sorted: a node's expansion depends on how often each one
        # encloses it, not on the path. So a subschema used in many places expands once per count (a tree
        # walk of the document's DAG is exponential in its nesting), and shares the result; one that reaches no
        # recursive ref expands once.
        if not isinstance(node, (dict, list)):
            return node
        key = (id(node), () if chainless(node) else chain)
        if key in done:
            return done[key][1]
        if isinstance(node, list):
            out: Any = [expand(n, chain, join(ptr, i)) for i, n in enumerate(node)]
        elif isinstance(node.get("$ref"), str):
            ptr = document.pointer(node, ptr)
            ref = node["$ref"]
            if chain.count(ref) >= depth:
                narrowed[f"{ptr or '/'}: recursive {ref!r} nests at most {depth} levels (max_recursion_depth)"] = None
                return False
            inner = tuple(sorted(chain + (ref,))) if ref in recursive else chain
            target = expand(document.resolve(node), inner, ptr)
            rest = expand({k: v for k, v in node.items() if k != "$ref"}, chain, ptr)
            out = target if not any(k in VALIDATION for k in rest) else rest | {"allOf": [target]}
        else:
            ptr = document.pointer(node, ptr)
            members = {}
            for key_, value in node.items():
                if key_ in ("$defs", "definitions"):  # inlined where they are referred to
                    continue
                if key_ in LITERALS or key_ in ANNOTATIONS:
                    members[key_] = value
                elif key_ in NAMED and isinstance(value, dict):
                    members[key_] = {n: expand(v, chain, join(ptr, key_, n)) for n, v in value.items()}
                else:
                    members[key_] = expand(value, chain, join(ptr, key_))
            out = _without_false(members)
        done[key] = (node, out)  # holding the node keeps its id from being reused
        return out

    unrolled = expand(schema, ("#",), "")
    if unrolled is False:
        raise SchemaError("$ref", "", f"every value recurses deeper than max_recursion_depth={depth}: raise it")
    return Document(unrolled), list(narrowed)


def _without_false(node: dict[str, Any]) -> Any:
    """``node`` with its members of schema ``false`` (cut recursion) not offered, or False if it needs one."""
    props = node.get("properties", {})
    if any(props.get(n) is False for n in node.get("required", [])) or False in node.get("allOf", []):
        return False
    if any(v is False for v in props.values()):
        node = node | {"properties": {n: v for n, v in props.items() if v is not False}}
    if node.get("items") is False and "prefixItems" not in node:
        if node.get("minItems", 0) > 0:
            return False
        node = {k: v for k, v in node.items() if k != "items"} | {"maxItems": 0}
    for key in ("anyOf", "oneOf"):
        if key in node and False in node[key]:
            kept = [b for b in node[key] if b is not False]
            if not kept:
                return False
            node = node | {key: kept}
    return node


def _recursive_refs(schema: Any, document: Document) -> set[str]:
    """The ``$ref`` values (``"#"`` for the root) whose target reaches the same ``$ref`` again. Changes
    nothing."""
    def refs_under(node: Any, found: set[str]) -> set[str]:
        if isinstance(node, list):
            for n in node:
                refs_under(n, found)
        elif isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                found.add(node["$ref"])
            for child in _children(node):
                refs_under(child, found)
        return found

    graph: dict[str, set[str]] = {"#": refs_under(schema, set())}
    todo = list(graph["#"])
    while todo:
        ref = todo.pop()
        if ref not in graph:
            graph[ref] = refs_under(document.resolve({"$ref": ref}), set())
            todo += graph[ref]
    recursive = set()
    for ref in graph:
        seen, stack = set(), list(graph[ref])
        while stack:
            r = stack.pop()
            if r == ref:
                recursive.add(ref)
                break
            if r not in seen:
                seen.add(r)
                stack += graph.get(r, ())
    return recursive


def _children(node: dict[str, Any]) -> list[Any]:
    """What under ``node`` holds subschemas (a keyword's value; a named keyword's map as the list of its values),
    its ``$ref`` and definitions (annotations) aside."""
    return [list(v.values()) if k in NAMED and isinstance(v, dict) else v
            for k, v in node.items() if k not in LITERALS and k not in ANNOTATIONS and k != "$ref"]
