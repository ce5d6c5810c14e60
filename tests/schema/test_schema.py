"""Spec → regex: what compiles, what is rejected (keyword and pointer), and that nothing gets looser."""

from __future__ import annotations

import enum
import json
import re
from typing import Literal

import jsonschema
import pytest
from pydantic import BaseModel, Field

import structspec
from structspec import Regex, RegexError, SchemaError, SpecError, StructspecError, to_regex
from structspec.schema import constraint_of, validator
from structspec.schema.emit import Rewrites
from structspec.schema.pointers import Document


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Item(BaseModel):
    name: str
    qty: int


class Order(BaseModel):
    id: int
    items: list[Item]
    note: str | None = None
    color: Color


def full(regex: str, text: str) -> bool:
    return re.fullmatch(regex, text) is not None


def test_compact_layout_is_the_default() -> None:
    regex = to_regex(Item)
    assert full(regex, '{"name":"pen","qty":2}')
    assert not full(regex, '{"name": "pen", "qty": 2}')
    assert not full(regex, '{ "name":"pen","qty":2}')


def test_flexible_whitespace_is_an_option() -> None:
    regex = to_regex(Item, whitespace_pattern=r"[ ]?")
    assert full(regex, '{"name": "pen", "qty": 2}')


@pytest.mark.parametrize(
    ("spec", "good", "bad"),
    [
        (int, "-12", "1.5"),
        (float, "1.5", '"1.5"'),
        (bool, "true", "True"),
        (str, '"hi"', "hi"),
        (Literal["a", "b"], '"a"', '"c"'),
        (Color, '"green"', '"blue"'),
        (Regex(r"\d{3}"), "123", "1234"),
        ({"type": "array", "items": {"type": "integer"}, "maxItems": 2}, "[1,2]", "[1,2,3]"),
        ('{"type": "string", "maxLength": 2}', '"ab"', '"abc"'),
    ],
)
def test_each_kind_of_spec(spec, good: str, bad: str) -> None:
    regex = to_regex(spec)
    assert full(regex, good)
    assert not full(regex, bad)


def test_parsers_return_the_promised_values() -> None:
    order = '{"id":1,"items":[{"name":"a","qty":1}],"color":"red"}'
    assert full(to_regex(Order), order)
    assert constraint_of(Order).parse(order) == Order(id=1, items=[Item(name="a", qty=1)], color=Color.RED)
    assert constraint_of({"type": "integer"}).parse("7") == 7
    assert constraint_of(Regex("a+")).parse("aa") == "aa"
    assert constraint_of(Color).parse('"red"') is Color.RED


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        ({"type": "integer", "minimum": 0, "multipleOf": 2}, "multipleOf", "/"),
        ({"type": "number", "minimum": 0.5}, "minimum", "/"),
        ({"type": "integer", "minimum": 3, "maximum": 2}, "minimum", "/"),
        ({"type": "string", "pattern": 'a"b'}, "pattern", "/"),
        ({"type": "object", "properties": {"a": {"type": "number", "multipleOf": 2}}}, "multipleOf", "/properties/a"),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems", "/"),
        ({"type": "object", "properties": {c: {"type": "string"} for c in "abcdefghi"}, "minProperties": 1},
         "minProperties", "/"),  # 9 optional members: more than reach.MAX_OPTIONAL
        ({"type": "object", "properties": {"xa": {"type": "integer"}}, "patternProperties": {"^x": {"type": "string"}}},
         "patternProperties", "/"),  # "xa" would need both schemas
        ({"type": "object", "patternProperties": {"(^a$|b)": {"type": "string"}}}, "patternProperties", "/"),
        ({"type": "object", "patternProperties": {"^a": {"type": "string"}, "b": {"type": "integer"}}},
         "patternProperties", "/"),  # "ab" matches both
        ({"allOf": [{"type": "string", "pattern": "^a"}, {"pattern": "b$"}]}, "allOf", "/"),
        ({"oneOf": [{"type": "integer"}, {"type": "integer"}]}, "oneOf", "/"),
        ({"type": "string", "maxLength": 3, "pattern": "a+b"}, "pattern", "/"),
        ({"type": "string", "format": "uri-template"}, "format", "/"),  # defined by JSON Schema, not enforced
        ({"type": "number", "not": {"const": 1}}, "not", "/"),  # a number has too many spellings to remove
        ({"enum": [1], "type": "string"}, "enum", "/"),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"], "additionalProperties": False},
         "required", "/"),
        ({"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
          "$ref": "#/$defs/n"}, "$ref", "/"),  # every value recurses past max_recursion_depth
        ({"type": "integer", "maximum": "ten"}, "maximum", "/"),  # not a schema at all
        ({"type": "object", "properties": {"a": {"type": "strin"}}}, "type", "/properties/a"),
        ({"type": "object", "required": ["a", 1]}, "required", "/"),
        ({"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
          "properties": {"n": {"type": "integer", "exclusiveMinimum": True}}}, "exclusiveMinimum", "/properties/n"),
    ],
)
def test_unenforceable_keywords_name_keyword_and_pointer(schema: dict, keyword: str, pointer: str) -> None:
    with pytest.raises(SchemaError) as err:
        to_regex(schema)
    assert err.value.keyword == keyword
    assert err.value.pointer == pointer
    assert keyword in str(err.value) and pointer in str(err.value)


def test_pydantic_bounds_are_enforced() -> None:
    class Bounded(BaseModel):
        age: int = Field(ge=0, lt=150)

    regex = to_regex(Bounded)
    assert full(regex, '{"age":0}') and full(regex, '{"age":149}')
    assert not full(regex, '{"age":-1}') and not full(regex, '{"age":150}')


BOUNDS = [
    {"minimum": 0}, {"minimum": -7, "maximum": 12}, {"exclusiveMinimum": 0}, {"maximum": -3},
    {"minimum": 95, "exclusiveMaximum": 1005}, {"minimum": 1.5, "maximum": 9.5},
    {"minimum": 0, "maximum": 0}, {"exclusiveMaximum": 0, "exclusiveMinimum": -100},
]


@pytest.mark.parametrize("bounds", BOUNDS)
@pytest.mark.parametrize("kind", ["integer", "number"])
def test_numeric_bounds_accept_exactly_the_values_in_range(kind: str, bounds: dict) -> None:
    schema = {"type": kind, **bounds}
    if kind == "number" and any(v != int(v) for v in bounds.values()):
        with pytest.raises(SchemaError):  # decimal bounds are not translated
            to_regex(schema)
        return
    regex = to_regex(schema)
    texts = [str(n) for n in range(-1200, 1200)]
    if kind == "number":
        texts += [f"{n / 4}" for n in range(-400, 400)] + ["0.0", "-0.5", "12.000", "-3.01", "1005.0"]
    for text in texts:
        assert full(regex, text) == jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)), text


def test_draft4_boolean_exclusive_bounds() -> None:
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer",
              "minimum": 0, "exclusiveMinimum": True, "maximum": 10, "exclusiveMaximum": True}
    regex = to_regex(schema)
    assert [n for n in range(-5, 15) if full(regex, str(n))] == list(range(1, 10))


def test_nullable_bounded_integer_keeps_null() -> None:
    regex = to_regex({"type": ["integer", "null"], "minimum": 1})
    assert full(regex, "null") and full(regex, "7")
    assert not full(regex, "0")


def test_enum_keeps_only_values_of_the_node_type() -> None:
    regex = to_regex({"type": "string", "enum": ["a", None, 1]})
    assert full(regex, '"a"')
    assert not full(regex, "null") and not full(regex, "1")


SCALARS = [1, 1.0, 1.5, True, None, "1"]


@pytest.mark.parametrize("kind", ["integer", "number", "boolean", "null", "string"])
def test_enum_values_keep_json_schemas_types(kind) -> None:
    # the node's type filters its values as JSON Schema types them (1.0 is an integer, True is no number)
    kept = [v for v in SCALARS if jsonschema.Draft202012Validator({"type": kind}).is_valid(v)]
    regex = to_regex({"type": kind, "enum": SCALARS})
    for v in SCALARS:
        assert full(regex, json.dumps(v)) == any(x is v for x in kept), v


@pytest.mark.parametrize("kind", ["array", "object"])
def test_an_enum_without_a_value_of_the_node_type_is_refused(kind) -> None:
    with pytest.raises(SchemaError, match="no value has the node's type"):
        to_regex({"type": kind, "enum": SCALARS})


@pytest.mark.parametrize(
    ("pattern", "good", "bad"),
    [
        ("^.*$", '"a b"', '"a"b"'),  # . must not match a raw quote
        ("^[^,]+$", '"a;b"', '"a\\b"'),  # nor a negated class a backslash
        (r"^\S+$", '"ab"', '"a\u0001"'),
        (r"^[a-z\s]+$", '"a b"', '"a\tb"'),  # \s narrows to the spaces a JSON string holds unescaped
        (r"^\S$", '"a"', '"\ufeff"'),  # ECMA's \s includes U+FEFF
        ("^.$", '"a"', '"\u2028"'),  # and . stops at a line terminator
    ],
)
def test_patterns_stay_inside_the_json_string(pattern: str, good: str, bad: str) -> None:
    regex = to_regex({"type": "string", "pattern": pattern})
    assert full(regex, good)
    assert not full(regex, bad)


def test_repeated_class_pattern_takes_length_bounds() -> None:
    regex = to_regex({"type": "string", "pattern": "^[a-f0-9]+$", "minLength": 2, "maxLength": 4})
    assert full(regex, '"ab"') and full(regex, '"abcd"')
    assert not full(regex, '"a"') and not full(regex, '"abcde"') and not full(regex, '"xy"')


@pytest.mark.slow
def test_not_strict_drops_unenforceable_keywords_with_a_warning() -> None:
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                          "uniqueItems": True}},
              "patternProperties": {"^t": {"type": "string"}}}  # matches "tags" too: not enforced
    with pytest.raises(SchemaError, match="patternProperties"):
        to_regex(schema)
    with pytest.warns(UserWarning) as caught:
        constraint = constraint_of(schema, strict=False)
    message = str(caught[0].message)
    assert "'patternProperties' at /" in message and "'uniqueItems' at /properties/tags" in message
    assert set(constraint.not_enforced) == {"'patternProperties' at /", "'uniqueItems' at /properties/tags"}  # as data
    assert message.endswith(", ".join(constraint.not_enforced))
    assert full(constraint.regex, '{"tags":["a","a"]}')
    assert constraint.parse('{"tags":["a","a"]}') == {"tags": ["a", "a"]}  # dropped keywords are not checked


def test_boolean_schemas() -> None:
    assert full(to_regex(True), "[1,null]")
    with pytest.raises(SpecError, match="false admits no value"):
        to_regex(False)
    with pytest.raises(SchemaError) as err:  # false inside a schema: named by the keyword that holds it
        to_regex({"type": "object", "properties": {"a": {"type": "array", "items": False, "minItems": 1}}})
    assert (err.value.keyword, err.value.pointer) == ("items", "/properties/a")
    assert "/properties/a/items" in str(err.value)
    with pytest.raises(SchemaError) as err:  # a property false is a name never written; required, no object
        to_regex({"type": "object", "properties": {"a": False}, "required": ["a"]})
    assert (err.value.keyword, err.value.pointer) == ("properties", "/")
    assert full(to_regex({"type": "object", "properties": {"a": False, "b": {"const": 1}}}), '{"b":1}')


@pytest.mark.slow
def test_annotations_and_keywords_of_other_types_are_fine() -> None:
    schema = {
        "title": "T", "description": "d", "type": "object",
        "properties": {"title": {"type": "string", "description": "a property named like a keyword"},
                       "n": {"type": ["integer", "null"], "examples": [1]},
                       "s": {"type": "string", "minimum": 3}},  # minimum constrains only numbers
        "required": ["title"],
    }
    regex = to_regex(schema)
    assert full(regex, '{"title":"x","n":null,"s":"y"}')
    assert full(regex, '{"title":"x"}')


def test_no_properties_allowed_means_empty_object() -> None:
    regex = to_regex({"type": "object", "additionalProperties": False})
    assert full(regex, "{}")
    assert not full(regex, '{"a":1}')


def test_not_a_spec() -> None:
    with pytest.raises(SpecError, match="Regex"):
        to_regex("[a-z]+")  # a str is a JSON Schema document; a regex needs Regex(...)
    with pytest.raises(SpecError, match="unsupported output spec"):
        to_regex(3.5)
    with pytest.raises(SpecError, match="an object or a boolean"):
        to_regex(json.dumps([1, 2]))


def test_pattern_classes_are_ascii_as_in_json_schema() -> None:
    # ECMA-262 \d is [0-9]; outlines-core's engine would also take Unicode digits (U+1CCF6, ۴)
    regex = to_regex({"type": "string", "pattern": r"^\d{2}-\w$"})
    assert full(regex, '"12-a"')
    assert not full(regex, '"1\U0001ccf6-a"') and not full(regex, '"۴۴-a"') and not full(regex, '"12-é"')


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        ("time", '"12:30:00Z"', r'"12:30:00\x"'),  # outlines-core's own regex allows a backslash here
        ("email", '"ada.l@example.org"', r'"\"q\"@example.org"'),
        ("uri", '"https://example.org/a?b=1"', r'"https://example.org/\"x"'),
        ("date", '"2024-02-29"', '"2024-\U0001ccf6\U0001ccf6-01"'),
        ("date-time", '"2024-02-29T10:00:00Z"', '"2024-02-29T10:00:00"'),  # RFC 3339 requires an offset
        ("ipv4", '"10.0.0.1"', '"10.0.0.256"'),
        ("hostname", '"example.com"', '"-x.com"'),
        ("duration", '"P1DT2H"', '"P"'),
    ],
)
def test_formats_stay_inside_the_json_string(fmt: str, good: str, bad: str) -> None:
    regex = to_regex({"type": "string", "format": fmt})
    assert full(regex, good) and json.loads(good)
    assert not full(regex, bad)


def test_a_valid_rfc3339_time_parses(byte_lm) -> None:
    """Parsing validates formats with the schema draft's own checker (a bare FormatChecker rejects "Z")."""
    constraint = constraint_of({"type": "string", "format": "time"})
    assert constraint.parse('"00:31:56Z"') == "00:31:56Z"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        # allOf merges into one node: a value must match every subschema
        ({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                    {"properties": {"a": {"minimum": 1}, "b": {"type": "string"}}, "required": ["b"]}]},
         ['{"a":1,"b":"x"}'], ['{"a":0,"b":"x"}', '{"a":1}', '{"b":"x"}']),
        ({"allOf": [{"type": "number"}, {"type": "integer", "maximum": 5}]}, ["5", "-2"], ["6", "1.5"]),
        # keywords beside anyOf/oneOf/$ref hold in every branch
        ({"type": "string", "anyOf": [{"enum": ["a", 1]}, {"maxLength": 1}]}, ['"a"', '"b"'], ["1", '"bc"']),
        ({"type": "string", "oneOf": [{"const": "x"}, {"const": "y"}]}, ['"x"', '"y"'], ['"z"']),
        ({"$defs": {"p": {"type": "object", "properties": {"n": {"type": "integer"}}}},
          "$ref": "#/$defs/p", "required": ["n"]}, ['{"n":3}'], ["{}", '{"n":"3"}']),
        # oneOf branches told apart by a required property's value work as anyOf
        ({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                     "required": ["k", "x"]},
                    {"type": "object", "properties": {"k": {"const": "b"}, "y": {"type": "string"}},
                     "required": ["k", "y"]}]},
         ['{"k":"a","x":1}', '{"k":"b","y":"s"}'], ['{"k":"a","y":"s"}', '{"k":"c","x":1}']),
        # keywords of other types constrain nothing; additionalItems follows only the array form of items
        ({"type": "array", "items": {"type": "integer"}, "additionalItems": False, "properties": {"a": {}},
          "maxLength": 2}, ["[1,2,3]"], ['["a"]', "{}"]),
        # the array form of items: exactly those items (a narrowing of "at most")
        ({"$schema": "http://json-schema.org/draft-07/schema#", "type": "array",
          "items": [{"type": "string"}, {"type": "integer"}]}, ['["a",1]'], ['[1,"a"]', '["a",1,2]']),
        # required names missing from properties take the additionalProperties schema
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"],
          "additionalProperties": {"type": "integer"}}, ['{"b":1}', '{"a":"s","b":2}'], ['{"b":"s"}', "{}"]),
        # min/maxProperties that the listed properties always meet
        ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
          "required": ["a"], "minProperties": 1, "maxProperties": 2}, ['{"a":1}', '{"a":1,"b":2}'], ["{}"]),
    ],
)
def test_merged_and_narrowed_keywords_are_enforced(schema: dict, good: list[str], bad: list[str]) -> None:
    regex = to_regex(schema)
    for text in good:
        assert full(regex, text) and validator(schema).is_valid(json.loads(text)), text
    for text in bad:
        assert not full(regex, text), text


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"],
          "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False},
         ['{"id":1}', '{"id":1,"x-a":"s","x-b":""}'], ['{"id":1,"y":"s"}', '{"id":1,"x-a":2}', '{"x-a":"s"}']),
        # a pattern searches: unanchored, it matches inside a name
        ({"type": "object", "patternProperties": {"[0-9]": {"type": "number"}}, "additionalProperties": False},
         ["{}", '{"a1b":1.5,"2":0}'], ['{"ab":1}', '{"a1":"x"}']),
        ({"type": "object", "patternProperties": {"^[a-z]+$": {"type": "boolean"}, "^[0-9]+$": {"type": "null"}}},
         ['{"ab":true,"12":null}'], ['{"ab":null}', '{"12":true}', '{"a1":true}']),
        # a required name that a pattern matches gets that pattern's schema
        ({"type": "object", "patternProperties": {"^line[1-3]$": {"type": "string"}}, "required": ["line1"],
          "additionalProperties": False}, ['{"line1":"a"}', '{"line1":"a","line2":"b"}'], ["{}", '{"line1":1}']),
    ],
)
def test_pattern_properties_are_enforced(schema: dict, good: list[str], bad: list[str]) -> None:
    regex = to_regex(schema)
    for text in good:
        assert full(regex, text) and jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)), text
    for text in bad:
        assert not full(regex, text), text


def test_a_pattern_property_the_automaton_cannot_build_is_a_schema_error(byte_lm) -> None:
    # (JsonSchemaStore's browser.i18n.json: a lookahead in a name pattern had ended in a RegexError at build)
    entry = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
    schema = {"type": "object", "definitions": {"entry": entry}, "additionalProperties": False,
              "patternProperties": {"^(?!@@)[@a-zA-Z0-9_-]+$": {"$ref": "#/definitions/entry"}}}
    with pytest.raises(SchemaError) as err:
        structspec.compile(schema, byte_lm)
    assert (err.value.keyword, err.value.pointer) == ("patternProperties", "/") and "(?!@@)" in err.value.reason
    with pytest.warns(UserWarning, match="'patternProperties' at /"):
        fsm = structspec.compile(schema, byte_lm, strict=False).fsm
    assert fsm.is_final(fsm.index.dfa.step(fsm.initial_state, b"{}"))


@pytest.mark.parametrize(
    ("schema", "keyword"),
    [
        ({"type": "object", "minProperties": 2}, "minProperties"),  # outlines-core counts only to one
        ({"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3}, "maxProperties"),
        ({"type": "object", "properties": {"a": {}}, "required": ["a"], "maxProperties": 0}, "maxProperties"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "allOf"),  # nothing matches both
        ({"type": "string", "anyOf": [{"type": "integer"}, {"type": "null"}]}, "anyOf"),
    ],
)
def test_uncountable_or_unsatisfiable_object_keywords_are_rejected(schema: dict, keyword: str) -> None:
    with pytest.raises(SchemaError) as err:
        to_regex(schema)
    assert err.value.keyword == keyword


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_an_additional_properties_schema_that_refers_to_the_root_nests_as_a_recursive_ref(depth: int) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"$ref": "#"}}
    constraint = constraint_of(schema, max_recursion_depth=depth)
    assert f"/additionalProperties: recursive '#' nests at most {depth} levels (max_recursion_depth)" in (
        constraint.narrowings)
    for levels in range(5):
        text = '{"a":1}'
        for _ in range(levels):
            text = '{"b":' + text + "}"
        assert full(constraint.regex, text) == (levels < depth), text
    assert not full(constraint.regex, '{"a":1,"b":2}')


@pytest.mark.slow
def test_any_value_is_one_group() -> None:
    # outlines-core's own regex for {} is a bare alternation, which would bind looser than '"a":'
    regex = to_regex({"type": "object", "properties": {"a": {}}, "required": ["a"]})
    assert full(regex, '{"a":1}') and full(regex, '{"a":[null,"x"]}')
    assert not full(regex, "{null}")
    assert not full(to_regex({"prefixItems": [{}, {}], "items": False}), "[1,2,3]")


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        ({"type": "string", "minLength": 5, "maxLength": 2}, "minLength", "/"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a+$", "minLength": 3,
                                                 "maxLength": 2}}}, "minLength", "/properties/a"),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 1}, "minItems", "/"),
        ({"type": "object", "minProperties": 1, "maxProperties": 0}, "minProperties", "/"),
        ({"allOf": [{"type": "string", "minLength": 4}, {"maxLength": 3}]}, "minLength", "/"),
    ],
)
def test_contradicting_counts_name_the_lower_bound(schema: dict, keyword: str, pointer: str) -> None:
    with pytest.raises(SchemaError) as err:
        to_regex(schema)
    assert (err.value.keyword, err.value.pointer) == (keyword, pointer)
    assert "greater than" in err.value.reason


@pytest.mark.parametrize(
    ("schema", "pointer"),
    [
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "/properties/a"),
        ({"type": "object", "properties": {"a": {"$ref": "other.json#/a"}}}, "/properties/a"),
        ({"$defs": {"no": False}, "type": "array", "items": {"$ref": "#/$defs/no"}}, "/items"),
        # a merged copy of a node is not where the user wrote the reference
        ({"allOf": [{"type": "object"}, {"$ref": "#/nope"}]}, "/allOf/1"),
        ({"$defs": {"p": {"type": "object", "properties": {"q": {"$ref": "x.json"}}}},
          "$ref": "#/$defs/p", "required": ["q"]}, "/$defs/p/properties/q"),
    ],
)
def test_reference_errors_point_where_the_reference_is_written(schema: dict, pointer: str) -> None:
    with pytest.raises(SchemaError) as err:
        to_regex(schema)
    assert (err.value.keyword, err.value.pointer) == ("$ref", pointer)


def test_errors_inside_a_merged_node_point_into_the_document() -> None:
    schema = {"$defs": {"p": {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}}},
              "$ref": "#/$defs/p", "required": ["n"]}
    with pytest.raises(SchemaError) as err:
        to_regex(schema)
    assert (err.value.keyword, err.value.pointer) == ("multipleOf", "/$defs/p/properties/n")


BAD_SPECS = [
    False, "[1, 2]", "{not json", 3.5, object(), {"type": "integer", "maximum": "ten"},
    {"type": "string", "minLength": 5, "maxLength": 2}, {"type": "object", "properties": {"a": False}, "required": ["a"]},
    {"type": "array", "items": False}, {"anyOf": [{"type": "string"}, False]},
    {"$ref": "#/$defs/x"}, {"$ref": "x.json"}, {"$defs": {"r": [1]}, "$ref": "#/$defs/r/0"},
    {"type": "integer", "exclusiveMinimum": 3, "maximum": 3}, {"type": "string", "format": "uri-template"},
    {"not": {}}, {"oneOf": [{}, {}]}, {"enum": [{"a": 1}]}, {"type": "string", "enum": [1]},
]


@pytest.mark.parametrize("spec", BAD_SPECS, ids=lambda spec: "object()" if type(spec) is object else repr(spec))
def test_bad_specs_raise_structspec_errors_naming_a_keyword_the_schema_holds(spec) -> None:
    with pytest.raises(StructspecError) as err:
        to_regex(spec)
    if isinstance(err.value, SchemaError):  # no stand-in keyword: the one the user wrote, at its node
        assert f'"{err.value.keyword}"' in json.dumps(spec), err.value
        assert err.value.pointer.startswith("/")


@pytest.mark.parametrize(
    ("schema", "keyword", "pointer"),
    [
        ({"type": "object", "properties": {"a": {"type": "array", "items": True}}}, "items", "/properties/a"),
        ({"anyOf": [{"type": "string"}, True]}, "anyOf", "/"),
        ({"$defs": {"any": True}, "$ref": "#/$defs/any"}, "$ref", "/"),
    ],
)
def test_a_true_subschema_outlines_core_cannot_read_is_named(schema: dict, keyword: str, pointer: str) -> None:
    with pytest.raises(SchemaError, match="true") as err:
        to_regex(schema)
    assert (err.value.keyword, err.value.pointer) == (keyword, pointer)
    assert full(to_regex({"type": "object", "additionalProperties": True}), '{"a":1}')  # read there


@pytest.mark.parametrize("value", [5, None, ["https://json-schema.org/draft/2020-12/schema"], {"$id": "x"}])
def test_a_schema_uri_that_is_no_string_is_named(value: object) -> None:
    with pytest.raises(SchemaError, match=r"\$schema.*must be a string") as err:
        to_regex({"$schema": value, "type": "string"})
    assert (err.value.keyword, err.value.pointer) == ("$schema", "/")


def test_a_node_of_unknown_keywords_only_names_one() -> None:
    # JSON Schema ignores unknown keywords: a node holding only those admits any value, likely a misspelling
    with pytest.raises(SchemaError, match="misspelling") as err:
        to_regex({"type": "object", "properties": {"a": {"ref": "#/$defs/b"}}})
    assert (err.value.keyword, err.value.pointer) == ("ref", "/properties/a")
    assert full(to_regex({"type": "string", "x-note": 1}), '"a"')  # beside a keyword it knows, no matter


@pytest.mark.slow
@pytest.mark.parametrize("schema", [
    {"x-intellij-html-description": "<b>any</b>"},
    {"type": "object", "properties": {"a": {"x-note": 1, "x-other": [1]}, "b": {"type": "integer", "x-unit": "s"}},
     "required": ["a"], "x-top": True},
])
def test_vendor_extensions_are_annotations_even_alone(schema: dict) -> None:
    # x-… keywords constrain nothing: a node holding only those admits any value, as jsonschema reads it
    regex, check = to_regex(schema), jsonschema.validators.validator_for(schema)(schema)
    values = [1, "s", None, [1, {"k": [True]}], {"a": 1}, {"a": {"x": []}, "b": 2}, {"a": "z", "b": "2"}, {"b": 1}]
    texts = [json.dumps(v, separators=(",", ":")) for v in values]
    verdicts = [full(regex, t) for t in texts]
    assert verdicts == [check.is_valid(v) for v in values]
    assert set(verdicts) == ({True, False} if "type" in schema else {True})  # the object's bounds still hold


def test_an_outlines_core_failure_still_names_its_keyword() -> None:
    # the checker lets nothing through that outlines-core rejects; if it did, the keyword is still named
    schema = {"type": "string", "minLength": 3, "maxLength": 2}
    with pytest.raises(SchemaError) as err:
        Rewrites(Document(schema), "").regex(schema, "/a", json.dumps(schema))
    assert (err.value.keyword, err.value.pointer) == ("maxLength", "/a")


# --- numbers that end: digit bounds, and every narrowing listed -------------------------------------------

DIGITS_OFF = {"max_integer_digits": None, "max_fraction_digits": None}


@pytest.mark.parametrize(("schema", "accepted", "rejected"), [
    ({"type": "integer"}, ["0", "-7", "9" * 18, "-" + "9" * 18], ["9" * 19, "01", "1.0"]),
    ({"type": "number"}, ["1.5", "9" * 18 + "." + "9" * 15, "-1e+307", "99e288", "0.000000000000001", "1e-999"],
     ["9" * 19, "1." + "1" * 16, "1e+1000", "-2e+308", "99e306"]),  # (-2e308 parses to -inf; 99e306 narrowed)
    ({"type": "integer", "minimum": 0}, ["0", "9" * 18], ["-1", "9" * 19]),
    ({"type": "number", "exclusiveMinimum": 0}, ["0.5", "9" * 18 + ".5"], ["0", "0.0", "1" * 19]),
    ({"type": ["integer", "null"]}, ["null", "12"], ["1" * 19]),
    ({"type": "array"}, ["[1,2.5,{\"a\":3}]", "[" + "9" * 18 + "]"], ["[" + "9" * 19 + "]"]),
])
def test_unbounded_numbers_get_digit_bounds(schema: dict, accepted: list[str], rejected: list[str]) -> None:
    constraint = constraint_of(schema)
    assert any("max_integer_digits" in n for n in constraint.narrowings), constraint.narrowings
    for text in accepted:
        assert full(constraint.regex, text), text
    for text in rejected:
        assert not full(constraint.regex, text), text
    loose = constraint_of(schema, **DIGITS_OFF)
    assert not any("digits" in n for n in loose.narrowings), loose.narrowings
    assert all(full(loose.regex, t) for t in accepted)
    assert any(full(loose.regex, t) for t in rejected if "." not in t or schema.get("type") != "integer")


def test_explicit_bounds_keep_their_exact_regexes() -> None:
    schema = {"type": "integer", "minimum": -3, "maximum": 1000}
    assert constraint_of(schema).narrowings == ()
    assert to_regex(schema) == to_regex(schema, **DIGITS_OFF)
    assert constraint_of({"type": "integer", "minimum": 0, "maximum": 10**20}).narrowings == (
        "/: maximum 100000000000000000000 narrowed to 1000000000000000 (a range wider than 1e+15 costs automaton "
        "states for its digits)",
    )


def test_narrowings_name_the_pointer_and_what_was_narrowed() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "number"}, "s": {"type": "string", "maxLength": 10**12},
                                               "t": {"type": "string", "maxLength": 10**6}, "any": {}}}
    narrowings = constraint_of(schema).narrowings
    assert "/properties/n: at most 15 fraction digits (max_fraction_digits)" in narrowings
    assert any(n.startswith("/properties/s: maxLength 1000000000000 narrowed to 4294967294") for n in narrowings)
    assert not any(n.startswith("/properties/t") for n in narrowings)  # a million is counted, not copied
    assert "/: at most 18 integer digits (max_integer_digits)" in narrowings  # numbers inside the any value
    # schema patterns are never rewritten by the digit bounds
    pattern = {"type": "string", "pattern": "^(-)?(0|[1-9][0-9]*)$"}
    assert full(to_regex(pattern), '"' + "1" * 30 + '"') and constraint_of(pattern).narrowings == ()


@pytest.mark.parametrize("value", [0, -1, 1.5, "3", True])
def test_digit_options_are_checked(value) -> None:
    with pytest.raises(StructspecError, match="max_integer_digits"):
        constraint_of({"type": "integer"}, max_integer_digits=value)


# --- empty languages fail at compile time, naming the keyword ------------------------------------------------

@pytest.mark.parametrize(("schema", "keyword", "pointer"), [
    ({"enum": []}, "enum", "/"),
    ({"properties": {"a": {"type": "string", "pattern": "[^\\s\\S]"}}}, "pattern", "/properties/a"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 0}, "maxLength", "/"),
    ({"type": "integer", "minimum": 10**17}, "minimum", "/"),  # empty after the digit bound of 3
    ({"type": "string", "minLength": 2**32}, "minLength", "/"),  # past the largest count a regex holds
    ({"enum": [float("inf")]}, "enum", "/"),
    ({"properties": {"a": {"const": float("nan")}}}, "const", "/properties/a"),
])
def test_an_empty_language_is_a_schema_error(schema: dict, keyword: str, pointer: str) -> None:
    with pytest.raises(SchemaError) as caught:
        constraint_of(schema, max_integer_digits=3)
    assert (caught.value.keyword, caught.value.pointer) == (keyword, pointer), str(caught.value)


@pytest.mark.slow
def test_a_schema_whose_regex_text_is_too_long_to_write_compiles_and_only_its_text_is_refused(byte_lm) -> None:
    schema: dict = {"type": "integer"}
    for _ in range(40):  # the text writes an array's items twice: 2**40 copies; the automaton shares them
        schema = {"type": "array", "items": schema}
    constraint = constraint_of(schema)
    with pytest.raises(RegexError, match="characters"):
        constraint.regex
    fsm = structspec.compile(schema, byte_lm).fsm

    def ids(text: str) -> list[int]:
        return [byte_lm.vocab.single_byte_tokens[b] for b in text.encode()]

    assert fsm.is_final(fsm.walk(fsm.initial_state, ids("[" * 40 + "7" + "]" * 40))[-1])
    assert len(fsm.walk(fsm.initial_state, ids("[" * 41))) < 41  # one level too deep


_DRAFTS = ["https://json-schema.org/draft/2020-12/schema", "https://json-schema.org/draft/2019-09/schema"]
_METASCHEMA_CASES = [
    {"type": "object", "properties": {"a": {"type": "string", "pattern": "^x", "minLength": 1}},
     "required": ["a"], "$defs": {"d": {"type": "array", "prefixItems": [{"const": 1}], "items": False}}},
    {"anyOf": [{"$ref": "#/$defs/d"}, {"type": ["integer", "null"], "multipleOf": 2}],
     "$defs": {"d": {"dependentRequired": {"a": ["b"]}, "patternProperties": {"^x": {}}}}},
    {"$id": "https://example.com/s", "$anchor": "top", "if": {"minProperties": 1}, "then": {"not": {}},
     "contains": {"enum": [1]}, "minContains": 1, "unevaluatedProperties": False, "dependencies": {"a": ["b"]}},
]
# values that some keyword rejects: wrong type, negative count, bad regex, not a list of unique strings
_BAD_VALUES = [5, -1, 1.5, "x", "^(", [], ["a", "a"], {}, {"type": 3}, None, False, "#/x y"]


def _spots(node: object, path: tuple = ()) -> list[tuple]:
    """Every path into ``node`` (objects' members and lists' items)."""
    found = [path]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        found += _spots(value, (*path, key))
    return found


def _set(node: object, path: tuple, value: object) -> object:
    """A copy of ``node`` with ``value`` at ``path``."""
    if not path:
        return value
    copy = json.loads(json.dumps(node))
    parent = copy
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return copy


def _get(node: object, path: tuple) -> object:
    for key in path:
        node = node[key]
    return node


@pytest.mark.slow
@pytest.mark.parametrize("draft", [*_DRAFTS, "http://json-schema.org/draft-07/schema#",
                                   "http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-03/schema#"])
def test_the_metaschema_check_accepts_exactly_what_jsonschema_does(draft: str) -> None:
    # every value of each case replaced by each bad value, and each keyword added with it: the check (jsonschema-rs
    # first) and jsonschema's own must agree on every one, and jsonschema-rs must decide most valid ones alone
    from structspec.schema.validation import _fast_validator, check_metaschema

    cls = jsonschema.validators.validator_for({"$schema": draft})
    keywords = ["minItems", "pattern", "$ref", "required", "type", "enum", "items", "prefixItems", "$defs",
                "dependentRequired", "$anchor", "$id", "const", "unevaluatedProperties", "minContains",
                "$dynamicRef", "$recursiveRef", "dependencies", "properties", "allOf", "format", "$comment"]
    verdicts, fast = [], 0
    for case in _METASCHEMA_CASES:
        case = {"$schema": draft, **case}
        spots = _spots(case)[2:]  # (not the root, nor its $schema)
        candidates = [case] + [_set(case, path, bad) for path in spots for bad in _BAD_VALUES]
        candidates += [_set(case, (*path, key), bad) for path in [(), *spots] if isinstance(_get(case, path), dict)
                       for key in keywords for bad in _BAD_VALUES[:3]]
        for schema in candidates:
            try:
                cls.check_schema(schema)
                valid = True
            except jsonschema.SchemaError:
                valid = False
            try:
                check_metaschema(schema)
                checked = True
            except SchemaError:
                checked = False
            assert checked == valid, schema
            fast += _fast_validator(cls) is not None and _fast_validator(cls).is_valid(schema)
            verdicts.append(valid)
    assert min(sum(verdicts), len(verdicts) - sum(verdicts)) >= 100  # both verdicts met often
    assert fast >= 0.95 * sum(verdicts) or (draft.endswith("draft-03/schema#") and _fast_validator(cls) is None)


@pytest.mark.slow
def test_a_recursive_schema_is_checked_as_written() -> None:
    # unrolling inlines the definitions where they are used: an unused bad one is still an invalid schema
    schema = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
              "definitions": {"unused": {"type": 5}}}
    with pytest.raises(SchemaError, match="invalid JSON Schema") as err:
        constraint_of(schema)
    assert (err.value.keyword, err.value.pointer) == ("type", "/definitions/unused")
    assert full(to_regex({k: v for k, v in schema.items() if k != "definitions"}), '{"kids":[{},{"kids":[]}]}')
