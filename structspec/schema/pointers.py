"""JSON pointers into the schema document the user wrote, and the one `$ref` resolver.

Errors name the pointer of the node in that document: the checker walks
rewritten and merged copies of nodes, which sit nowhere in it, so `Document`
remembers where each original node and each ``$ref`` was written.
"""

from __future__ import annotations

from typing import Any

from structspec.errors import SchemaError
from structspec.schema.keywords import ANNOTATIONS, LITERALS, NAMED


def join(pointer: str, *parts: Any) -> str:
    """``pointer`` extended by ``parts`` (names or indexes), each escaped (``~`` → ``~0``, ``/`` → ``~1``)."""
    for part in map(str, parts):
        # (called for every node walked: most names need no escape, so the replaces are skipped)
        pointer += "/" + (part.replace("~", "~0").replace("/", "~1") if "~" in part or "/" in part else part)
    return pointer


class Document:
    """A schema document: where each of its subschemas sits, and what its ``$ref`` s point at.

    Built once per schema; only `adopt` changes it.
    """

    def __init__(self, root: Any) -> None:
        self.root = root
        self._pointers: dict[int, str] | None = None  # id(subschema) → its pointer: indexed when first asked
        self._ref_sites: dict[str, str] = {}  # a $ref value → the pointer of the first node that holds it
        self._adopted: list[dict[str, Any]] = []  # kept alive: their ids stay theirs

    def _indexed(self) -> dict[int, str]:
        """The pointers, indexed on the first call (most compiles never ask: walks know where they are)."""
        if self._pointers is None:
            self._pointers = {}
            if isinstance(self.root, (dict, list)):
                self._index(self.root, "", self._pointers)
        return self._pointers

    def adopt(self, copy: dict[str, Any], original: Any) -> None:
        """Give ``copy``, a node made from ``original`` alone, the pointer of ``original``."""
        pointers = self._indexed()
        if isinstance(original, dict) and id(original) in pointers:
            pointers[id(copy)] = pointers[id(original)]
            self._adopted.append(copy)

    def _index(self, node: Any, pointer: str, pointers: dict[int, str]) -> None:
        # (only dicts and lists are visited: a schema's scalars, such as its 'required' names, are most of it)
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, (dict, list)):
                    self._index(item, f"{pointer}/{i}", pointers)
            return
        if id(node) in pointers:  # a shared node: indexed where first met
            return
        pointers[id(node)] = pointer
        if isinstance(node.get("$ref"), str):
            self._ref_sites.setdefault(node["$ref"], pointer)
        for key, value in node.items():
            if key in NAMED and isinstance(value, dict):
                for name, sub in value.items():
                    if isinstance(sub, (dict, list)):
                        self._index(sub, join(pointer, key, name), pointers)
            elif isinstance(value, (dict, list)) and key not in LITERALS and key not in ANNOTATIONS:
                self._index(value, join(pointer, key), pointers)  # (values of literals and annotations are data)

    def pointer(self, node: Any, default: str) -> str:
        """Where ``node`` sits in the document, or ``default`` for a node that is not in it (a merged copy)."""
        return self._indexed().get(id(node), default) if isinstance(node, dict) else default

    def resolve(self, node: dict[str, Any]) -> Any:
        """The subschema ``node["$ref"]`` points at (``node`` itself without a ``$ref``).

        Raises `SchemaError` at the pointer where the reference is written for an
        external reference or one that does not resolve.
        """
        ref = node.get("$ref")
        if ref is None:
            return node
        if not ref.startswith("#"):
            raise SchemaError("$ref", self._site(node, ref), f"external reference {ref!r} is not supported; "
                              "inline it under $defs and refer to it as '#/$defs/...'")
        target: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, dict) or part not in target:
                raise SchemaError("$ref", self._site(node, ref), f"reference {ref!r} does not resolve: nothing "
                                  f"is at {part!r}")
            target = target[part]
        return target

    def _site(self, node: dict[str, Any], ref: str) -> str:
        """Where the reference ``ref`` of ``node`` is written: every $ref structspec meets was written somewhere
        (a merged copy takes it from an original)."""
        self._indexed()  # (which finds the sites)
        return self.pointer(node, self._ref_sites.get(ref, ""))
