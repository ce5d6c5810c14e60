"""xgrammar's structural tags as structspec regexes: what vLLM sends for tool calls over HTTP.

vLLM 0.32's server turns ``tools`` with ``tool_choice="required"``, a named tool, or ``"auto"`` with a strict
tool into a ``structural_tag`` request (xgrammar's format: ``{"type": "structural_tag", "format": {...}}``, or
the legacy ``{"structures": [...], "triggers": [...]}``). Every format that describes text is regular, so the
whole tag is one regex, compiled into one token FSM like a JSON Schema request:

* ``const_string``: the string; ``regex``: the pattern;
* ``json_schema``: structspec's JSON Schema regex (``style="json"`` only), objects closed as xgrammar reads them;
* ``any_text``: text holding none of ``excludes`` (inside a tag: none of its ends either, so the first end closes
  it, as in xgrammar);
* ``sequence`` / ``or`` / ``optional`` / ``plus`` / ``star`` / ``repeat``: concatenation, alternation, ``?``,
  ``+``, ``*``, ``{min,max}``;
* ``tag``: its begin, its content, one of its ends;
* ``triggered_tags``: free text holding no trigger, where each trigger written starts one of the tags;
* ``tags_with_separator``: tags with the separator between them and nothing else.

The token formats (``token``, ``token_triggered_tags``, ...), ``grammar``, ``dispatch`` and the XML argument
styles are refused with `UnsupportedRequestError`, naming the format and the fix.
"""

from __future__ import annotations

import json
import re
from typing import Any

import structspec
from structspec.errors import StructspecError
from structspec.schema import COMPACT, avoiding


class UnsupportedRequestError(StructspecError, ValueError):
    """A structured-output request of a kind structspec cannot enforce in vLLM (a grammar, a token format)."""


FIX = "start vLLM with structured_outputs_config={'backend': 'xgrammar'} (or 'guidance') for it"

_REFUSED = {
    "grammar": "an EBNF grammar",
    "token": "a token format (tokens by id)",
    "exclude_token": "a token format (tokens by id)",
    "any_tokens": "a token format (tokens by id)",
    "token_triggered_tags": "a token format (tokens by id)",
    "token_dispatch": "a token format (tokens by id)",
    "dispatch": "dispatch",
    "qwen_xml_parameter": "XML arguments",
}
_QUANTIFIERS = {"optional": "?", "plus": "+", "star": "*"}


def structural_tag_regex(tag: str | dict[str, Any], whitespace: str) -> str:
    """The regex of an xgrammar structural tag (its JSON text or dict); ``whitespace`` is the JSON layout of the
    schemas in it. `UnsupportedRequestError` naming the format (and where it is) for what structspec cannot
    enforce; structspec's `SchemaError` for a schema in it that does not compile. Changes nothing."""
    value = json.loads(tag) if isinstance(tag, str) else tag
    if not isinstance(value, dict):
        raise UnsupportedRequestError(f"a structural tag is a JSON object, got {value!r}")
    if "structures" in value:  # the legacy form: tags with JSON Schema contents, in free text
        structures = value["structures"]
        if not isinstance(structures, list) or not all(
                isinstance(s, dict) and {"begin", "schema", "end"} <= s.keys() for s in structures):
            raise UnsupportedRequestError(f"a legacy structural tag's structures must be a list of objects with "
                                          f"begin, schema and end, got {structures!r}")
        return _Translator(whitespace).format({
            "type": "triggered_tags", "triggers": value.get("triggers", []),
            "tags": [{"type": "tag", "begin": s["begin"], "content": {"type": "json_schema",
                                                                      "json_schema": s["schema"]},
                      "end": s["end"]} for s in structures]}, "/")
    return _Translator(whitespace).format(value.get("format"), "/format")


class _Translator:
    """Writes formats as regex text, with one JSON layout for every schema in them."""

    def __init__(self, whitespace: str) -> None:
        self.whitespace = whitespace

    def format(self, node: Any, where: str, end: tuple[str, ...] = ()) -> str:
        """The regex of the format ``node`` at JSON pointer ``where``; ``end`` are the ends of the tag it is the
        content of, which free text there stops at."""
        kind = node.get("type") if isinstance(node, dict) else None
        if kind in _REFUSED:
            raise UnsupportedRequestError(f"structspec's vLLM backend does not take {_REFUSED[kind]} in a structural "
                                          f"tag ({kind!r} at {where}); {FIX}")
        if kind == "const_string":
            return re.escape(_text(node, "value", where))
        if kind == "json_schema":
            return self.json_schema(node, where)
        if kind == "regex":
            return f"(?:{_text(node, 'pattern', where)})"
        if kind == "any_text":
            return self.any_text(node, where, end)
        if kind in ("sequence", "or"):
            elements = [self.format(e, f"{where}/elements/{i}", end if kind == "or" else ())
                        for i, e in enumerate(_list(node, "elements", where))]
            if not elements:
                raise UnsupportedRequestError(f"{kind!r} at {where} has no elements: give it at least one")
            return ("" if kind == "sequence" else "|").join(f"(?:{e})" for e in elements)
        if kind in _QUANTIFIERS or kind == "repeat":
            quantifier = self.repeat(node, where) if kind == "repeat" else _QUANTIFIERS[kind]
            return f"(?:{self.format(node.get('content'), f'{where}/content')}){quantifier}"
        if kind == "tag":
            return "(?:{})(?:{})(?:{})".format(*self.tag(node, where))
        if kind == "triggered_tags":
            return self.triggered_tags(node, where)
        if kind == "tags_with_separator":
            return self.tags_with_separator(node, where)
        raise UnsupportedRequestError(f"the structural tag's format at {where} has type {kind!r}, which is no "
                                      "xgrammar format structspec knows; send one of const_string, json_schema, "
                                      "regex, any_text, sequence, or, tag, triggered_tags, tags_with_separator")

    def json_schema(self, node: dict[str, Any], where: str) -> str:
        options = {k: node.get(k) for k in ("style", "any_order", "excludes", "max_whitespace_cnt")}
        if options["style"] not in (None, "json") or options["any_order"] or options["excludes"]:
            raise UnsupportedRequestError(f"structspec's vLLM backend takes json_schema contents in the 'json' "
                                          f"style, in declared order, without excludes (at {where}); {FIX}")
        whitespace = self.whitespace
        count = _count(node, "max_whitespace_cnt", where)
        if count is not None and whitespace != COMPACT:
            whitespace = f"[ \\n\\r\\t]{{0,{count}}}"
        schema = node.get("json_schema", True)
        return f"(?:{structspec.to_regex(schema, whitespace, True, open_objects=False)})"

    def any_text(self, node: dict[str, Any], where: str, end: tuple[str, ...]) -> str:
        excludes = tuple(dict.fromkeys((*end, *_list(node, "excludes", where))))
        if node.get("max_tokens") is not None:
            raise UnsupportedRequestError(f"structspec's vLLM backend does not bound any_text in tokens "
                                          f"(max_tokens at {where}); bound it with max_chars, or {FIX}")
        count = _count(node, "max_chars", where)
        if count is None:
            return avoiding(excludes)
        if excludes:
            raise UnsupportedRequestError(f"any_text at {where} has both max_chars and excludes (or a tag's end): "
                                          f"structspec takes one of them; {FIX}")
        return f"[\\s\\S]{{0,{count}}}"

    def repeat(self, node: dict[str, Any], where: str) -> str:
        low, high = node.get("min"), node.get("max")
        if not isinstance(low, int) or not isinstance(high, int) or low < 0 or (high != -1 and high < low):
            raise UnsupportedRequestError(f"repeat at {where} needs ints 0 <= min <= max (max=-1: no bound), got "
                                          f"min={low!r} max={high!r}")
        return f"{{{low},{'' if high == -1 else high}}}"

    def tag(self, node: Any, where: str) -> tuple[str, str, str]:
        """A tag's begin, content and end as regexes."""
        if not isinstance(node, dict) or node.get("type", "tag") != "tag":
            raise UnsupportedRequestError(f"expected a tag at {where}, got {node!r}")
        begin = _text(node, "begin", where)
        ends = node.get("end")
        ends = [ends] if isinstance(ends, str) else ends
        if not isinstance(ends, list) or not ends or not all(isinstance(e, str) for e in ends):
            raise UnsupportedRequestError(f"a tag's end at {where}/end must be a string or a list of strings (a "
                                          f"token end is not supported); {FIX}")
        content = self.format(node.get("content"), f"{where}/content", tuple(e for e in ends if e))
        return re.escape(begin), content, "|".join(map(re.escape, ends))

    def tags(self, node: dict[str, Any], where: str) -> str:
        """One of the tags of ``node``. Tags with one content and end share them (vLLM's tool tags differ in their
        begins: a tool's name), so each content is written once."""
        tags = _list(node, "tags", where)
        if not tags:
            raise UnsupportedRequestError(f"{node.get('type')!r} at {where} has no tags: give it at least one")
        begins: dict[tuple[str, str], list[str]] = {}
        for i, tag in enumerate(tags):
            begin, content, end = self.tag(tag, f"{where}/tags/{i}")
            begins.setdefault((content, end), []).append(begin)
        return "|".join(f"(?:{'|'.join(b)})(?:{content})(?:{end})" for (content, end), b in begins.items())

    def triggered_tags(self, node: dict[str, Any], where: str) -> str:
        """Free text holding no trigger (nor an exclude); a trigger starts a tag whose begin opens with it."""
        triggers = tuple(_list(node, "triggers", where))
        if not triggers or not all(isinstance(t, str) and t for t in triggers):
            raise UnsupportedRequestError(f"triggered_tags at {where} needs non-empty string triggers")
        for i, tag in enumerate(_list(node, "tags", where)):
            if not any(isinstance(tag, dict) and str(tag.get("begin", "")).startswith(t) for t in triggers):
                raise UnsupportedRequestError(f"the tag at {where}/tags/{i} begins with no trigger: each tag's begin "
                                              "must start with one of the triggers")
        free = avoiding(tuple(dict.fromkeys((*triggers, *_list(node, "excludes", where)))))
        tags = self.tags(node, where)
        if node.get("stop_after_first"):  # the output ends with its first tag
            return f"(?:{free})(?:{tags})" + ("" if node.get("at_least_one") else "?")
        return f"(?:{free})(?:(?:{tags})(?:{free})){'+' if node.get('at_least_one') else '*'}"

    def tags_with_separator(self, node: dict[str, Any], where: str) -> str:
        """Tags with the separator between them and nothing else (the empty text too unless ``at_least_one``)."""
        tags, separator = self.tags(node, where), re.escape(_text(node, "separator", where))
        some = f"(?:{tags})" if node.get("stop_after_first") else f"(?:{tags})(?:{separator}(?:{tags}))*"
        return some if node.get("at_least_one") else f"(?:{some})?"


def _text(node: dict[str, Any], key: str, where: str) -> str:
    value = node.get(key)
    if not isinstance(value, str):
        raise UnsupportedRequestError(f"{key} at {where}/{key} must be a string, got {value!r} (a token is not "
                                      f"supported); {FIX}")
    return value


def _list(node: dict[str, Any], key: str, where: str) -> list[Any]:
    value = node.get(key, [])
    if not isinstance(value, list):
        raise UnsupportedRequestError(f"{key} at {where}/{key} must be a list, got {value!r}")
    return value


def _count(node: dict[str, Any], key: str, where: str) -> int | None:
    value = node.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise UnsupportedRequestError(f"{key} at {where}/{key} must be an int >= 0 or null, got {value!r}")
    return value
