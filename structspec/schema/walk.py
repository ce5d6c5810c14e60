"""What the checks of one kind of node (`numbers`, `strings`, `objects`, `literals`) need of the checker's walk over a
schema document: the contract `checker` fulfils, so those checks never import the checker (imports run one way)."""

from __future__ import annotations

from typing import Any, Protocol

from structspec.schema.emit import Rewrites


class Walk(Protocol):
    """One walk over one schema document, recording what it decides in ``rewrites``."""

    rewrites: Rewrites

    @property
    def located(self) -> bool:
        """Whether the walk is inside a rewritten node, whose subschemas may sit elsewhere in the document (so
        their pointers are looked up). Does not change the walk."""
        ...

    def walk(self, node: Any, ptr: str, refs: tuple[str, ...]) -> None:
        """Check ``node`` (at ``ptr``, reached through the references ``refs``), recording its rewrites."""
        ...

    def sub(self, node: Any, ptr: str, refs: tuple[str, ...], keyword: str, *names: Any) -> None:
        """Check the subschema of ``keyword`` (under ``names``) of the node at ``ptr``."""
        ...

    def unenforced(self, node: dict[str, Any], key: str, ptr: str, reason: str) -> None:
        """Raise `SchemaError` for ``key`` of ``node``, or under ``strict=False`` drop it (recorded)."""
        ...

    def has(self, node: dict[str, Any], key: str) -> bool:
        """Whether ``node`` holds ``key`` and it was not dropped. Does not change the walk."""
        ...

    def reject_others(self, node: dict[str, Any], ptr: str, allowed: set[str]) -> None:
        """`unenforced` for each validation keyword of ``node`` not in ``allowed``."""
        ...
