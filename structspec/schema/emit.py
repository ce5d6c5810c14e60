"""The checker's decisions for one schema document with their translator (`Rewrites`), and the regex they emit:
the structure translated by `translate` into parsed items, written out as text only when asked for (other
engines)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from structspec.automaton.parse import ParsedRegex
from structspec.schema.decisions import Decisions
from structspec.schema.difference import names_except
from structspec.schema.items import Items, json_string
from structspec.schema.pointers import join
from structspec.schema.translate import Translator

_ANY_VALUE: dict[str, Any] = {}  # the schema of any value

# Bumped when the translation changes its output for the same schema: names the compile-cache entries.
_TRANSLATION = "structspec-translate-4"


@dataclass
class Rewrites(Decisions):
    """The checker's `Decisions` with the translator that emits them: `hole` changes them; `items`, `regex` and
    `object_regex` translate (recording the digit bounds they apply).
    """

    translator: Translator = field(init=False)

    def __post_init__(self) -> None:
        self.translator = Translator(self)

    def hole(self, node: dict[str, Any], regex: str | Items) -> dict[str, Any]:
        """Emit ``regex`` (structspec's own regex text, or items) for ``node``: it stands as a string node whose
        pattern is a marker (`standalone` hands that to outlines-core in the cross-check). Returns that node."""
        marker = f"structspecHole{len(self.holes)}x{id(self):x}"
        self.holes[marker] = self.translator.text(regex) if isinstance(regex, str) else regex
        self.replace(node, {"type": "string", "pattern": marker})
        return self.replaced[id(node)]

    def items(self, node: Any, pointer: str) -> Items:
        """The parsed items of ``node`` (already checked, at ``pointer``), translated on its own."""
        return self.translator.items(node, pointer)

    def regex(self, node: Any, pointer: str, source: str) -> ParsedRegex:
        """The regex of ``node`` (already checked, at ``pointer``): its items, the key naming its language, and
        its text written only when asked for. ``source`` is the JSON text of the schema `recursion.unroll` read the
        document from (`check_json`): with the options it names the language, and it is short where the
        unrolled copy's would not be (that copy shares its subtrees, which JSON would write out once per place)."""
        items = self.items(node, pointer)
        options = json.dumps([_TRANSLATION, self.nesting, self.whitespace, self.digits.integer, self.digits.fraction,
                              self.open_objects, pointer], ensure_ascii=False)
        key = f"{options}\0{source}".encode("utf-8", "surrogatepass")
        return ParsedRegex(items, hashlib.sha256(key).hexdigest())

    def object_regex(self, fields: list[tuple[str, Any, bool]], patterns: list[tuple[str, Any, str]],
                     pointer: str, others: Any = None, forbidden: list[str] | tuple[str, ...] = (),
                     located: bool = False) -> Items:
        """The items of the object at ``pointer``: ``fields`` (name, schema, required) in order, then any number
        of members whose names match a key regex of ``patterns`` (key regex, schema, the pattern it is read from),
        or (``others``, a schema or True for any value) are any name no field has and not ``forbidden``.
        ``located``: the schemas may sit elsewhere in the document than under ``pointer`` (the object is a merged
        copy), so their pointers are looked up."""
        t = self.translator

        def value(node: Any, *path: str) -> Items:
            where = join(pointer, *path)
            return self.items(node, self.document.pointer(node, where) if located else where)

        listed = [(t.member(json_string(name), value(sub, "properties", name)), required)
                  for name, sub, required in fields]
        extra = [t.text(f'"{key}"') + t.member("", value(sub, "patternProperties", p)) for key, sub, p in patterns]
        if others is not None:
            names = [*(name for name, _, _ in fields), *forbidden]
            # any value (additionalProperties true or absent): one node, whose items the translator shares
            other = (self.items(_ANY_VALUE, pointer) if others is True
                     else value(others, "additionalProperties"))
            extra.append(names_except(names) + t.member("", other))
            t.strings = True  # (the names; see STRINGS)
        return t.object_items(listed, extra)
