"""Schema reach (issue 16): property counts, dependentRequired, uniqueItems, not, overlapping oneOf, recursive $ref.

Each keyword's regex is checked against jsonschema both ways over a finite universe of instances: a text
matches the regex exactly when jsonschema accepts its value (for recursion: and it nests within the depth).
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel

import structspec
from structspec import SchemaError, to_regex
from structspec.automaton.parse import parse, write
from structspec.errors import OptionError
from structspec.schema import constraint_of, validator
from structspec.schema.checker import check
from structspec.schema.difference import difference
from structspec.schema.keywords import has_type
from structspec.schema.objects import UNLISTED
from structspec.schema.recursion import unroll

PROPS = {"a": {"const": 1}, "b": {"const": True}, "c": {"const": None}, "d": {"const": "x"}}


def agrees(schema: dict[str, Any], texts: list[str], **options: Any) -> None:
    """The regex of ``schema`` accepts exactly the texts whose values jsonschema accepts."""
    regex, check = to_regex(schema, **options), validator(schema)  # the schema's own draft
    for text in texts:
        assert (re.fullmatch(regex, text) is not None) == check.is_valid(json.loads(text)), text


def objects() -> list[str]:
    """Every object of a subset of PROPS' members, in declared order."""
    return [json.dumps({n: PROPS[n]["const"] for n in chosen}, separators=(",", ":"))
            for k in range(len(PROPS) + 1) for chosen in itertools.combinations(PROPS, k)]


@pytest.mark.parametrize("counts", [
    {"minProperties": 2}, {"maxProperties": 1}, {"minProperties": 1, "maxProperties": 3},
    {"required": ["a"], "minProperties": 3}, {"required": ["a", "b"], "maxProperties": 2},
])
def test_property_counts_are_exact(counts: dict[str, Any]) -> None:
    agrees({"type": "object", "properties": PROPS, "additionalProperties": False} | counts, objects())


@pytest.mark.parametrize("dependencies", [
    {"dependentRequired": {"a": ["b"]}}, {"dependentRequired": {"a": ["b", "c"], "d": ["a"]}, "maxProperties": 3},
    {"dependencies": {"c": ["d"]}, "required": ["a"], "$schema": "http://json-schema.org/draft-07/schema#"},
])
def test_dependent_required_is_exact(dependencies: dict[str, Any]) -> None:
    agrees({"type": "object", "properties": PROPS, "additionalProperties": False} | dependencies, objects())


def arrays(values: list[Any], longest: int) -> list[str]:
    """Every array of up to ``longest`` items drawn from ``values`` (repeats included)."""
    return [json.dumps(list(items), separators=(",", ":"))
            for k in range(longest + 1) for items in itertools.product(values, repeat=k)]


@pytest.mark.parametrize(("items", "values", "bounds"), [
    ({"enum": ["x", "y", "z"]}, ["x", "y", "z"], {}),
    ({"enum": ["x", "y", "z"]}, ["x", "y", "z"], {"minItems": 1, "maxItems": 2}),
    ({"type": "boolean"}, [True, False], {}),
    ({"const": 7}, [7], {"minItems": 1}),
    ({"enum": [1, 1.0, True]}, [1, True], {}),  # 1 and 1.0 are one value to uniqueItems, true another
])
def test_unique_items_are_exact(items: dict, values: list[Any], bounds: dict) -> None:
    agrees({"type": "array", "items": items, "uniqueItems": True} | bounds, arrays(values, len(values) + 1))


SCALARS = ["null", "true", "false", "0", "7", "1.5", '"x"', '"y"', "[]", "{}"]


@pytest.mark.slow
@pytest.mark.parametrize("schema", [
    {"not": {"type": "string"}},
    {"type": ["integer", "string", "null"], "not": {"type": ["string", "null"]}},
    {"type": "boolean", "not": {"const": True}},
    {"enum": ["x", "y", 7, None], "not": {"enum": ["y", None]}},
    {"enum": ["x", "y", 7], "not": {"type": "integer"}},
])
def test_not_over_types_and_finite_sets_is_exact(schema: dict) -> None:
    agrees(schema, SCALARS)


# strings a slash or an escape apart, integers a sign apart, and a value of every other type
SPELLED = ['"x"', '"y"', '"xy"', '""', '"/"', '"\\/"', '"a/b"', '"a\\/b"', '"\\""', '"\\n"',
           "0", "-0", "1", "7", "-7", "12", "1.5", "true", "false", "null", "[]", "{}"]


@pytest.mark.parametrize("schema", [
    {"type": "string", "not": {"const": "x"}},
    {"type": "string", "not": {"enum": ["x", "", "/", "a/b", '"', "\n"]}},
    {"type": "string", "maxLength": 2, "not": {"enum": ["x", "xy", 7]}},
    {"type": "string", "pattern": "^[a-z]+$", "not": {"const": "x"}},
    {"type": "integer", "not": {"const": 0}},
    {"type": "integer", "not": {"enum": [1, 7.0, "x"]}},
    {"type": "integer", "minimum": 1, "maximum": 12, "not": {"enum": [1, 7]}},  # (bounds: 0 is never "-0")
    {"type": "integer", "minimum": -7, "maximum": -1, "not": {"const": -7}},
    {"type": ["string", "integer", "null"], "not": {"enum": ["x", 0, None]}},
    {"type": ["string", "boolean"], "not": {"enum": ["x", True]}},
    {"type": "string", "not": {"$ref": "#/$defs/x"}, "$defs": {"x": {"const": "x"}}},
])
def test_not_removes_finite_values_from_strings_and_integers_exactly(schema: dict) -> None:
    agrees(schema, SPELLED)


@pytest.mark.parametrize("schema", [
    {"oneOf": [{"type": "string"}, {"const": "x"}]},  # "x" matches both: every string but "x"
    {"oneOf": [{"enum": ["x", "y", 1]}, {"enum": ["y", 1.0, 7]}]},
    {"oneOf": [{"type": "integer"}, {"enum": [1, "x"]}, {"type": "string", "maxLength": 1}]},
    {"oneOf": [{"type": "boolean"}, {"const": True}, {"type": "null"}]},
    {"oneOf": [{"$ref": "#/$defs/s"}, {"enum": ["/", "y"]}], "$defs": {"s": {"type": "string"}}},
    {"type": "string", "oneOf": [{"maxLength": 1}, {"enum": ["x", "xy"]}]},
])
def test_overlapping_one_of_is_exact_where_the_overlap_is_finite(schema: dict) -> None:
    agrees(schema, SPELLED)


def test_a_discriminated_one_of_stays_a_union() -> None:
    schema = {"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}, "v": {"type": "integer"}},
                         "required": ["k"], "additionalProperties": False},
                        {"type": "object", "properties": {"k": {"enum": ["b", "c"]}, "v": {"type": "string"}},
                         "required": ["k"], "additionalProperties": False}]}
    agrees(schema, ['{"k":"a","v":1}', '{"k":"a","v":"x"}', '{"k":"b","v":"x"}', '{"k":"c"}', '{"k":"d"}', "{}"])


@pytest.mark.parametrize(("regex", "texts"), [
    (r'"([^"\\]|\\["\\/])*"', ['"x"', '"xy"', '""', '"\\/"']), (r"-?(0|[1-9][0-9]*)", ["0", "-0", "12"]),
    ("a*", ["", "aa"]), ("(ab|a)(b)?c{0,2}", ["abc", "a", "zz"]), ("[a-c]{2,3}", ["ab", "abc"]),
])
def test_difference_removes_exactly_the_texts(regex: str, texts: list[str]) -> None:
    left = write(difference(parse(regex), texts))
    for n in range(5):
        for chars in itertools.product('abcxyz0129-/"\\', repeat=n):
            s = "".join(chars)
            assert (re.fullmatch(left, s) is not None) == (re.fullmatch(regex, s) is not None and s not in texts), s


def test_difference_of_a_finite_language_with_itself_is_empty() -> None:
    assert difference(parse("(a|bc)"), ["a", "bc"]) is None


def tree(depth: int) -> dict[str, Any]:
    """A chain of nodes ``depth`` deep."""
    return {"v": depth} if depth == 1 else {"v": depth, "kids": [tree(depth - 1)]}


TREE = {"$defs": {"n": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                                        "kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
                        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/n"}


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_recursive_refs_nest_to_max_recursion_depth(depth: int) -> None:
    constraint = constraint_of(TREE, max_recursion_depth=depth)
    assert constraint.narrowings == (
        f"/$defs/n/properties/kids/items: recursive '#/$defs/n' nests at most {depth} levels (max_recursion_depth)",)
    for levels in range(1, 6):
        text = json.dumps(tree(levels), separators=(",", ":"))
        assert (re.fullmatch(constraint.regex, text) is not None) == (levels <= depth), text
        jsonschema.validate(tree(levels), TREE)
    # at the deepest level the recursive member is not offered: the array of children stays empty
    deepest = json.dumps(tree(depth), separators=(",", ":")).replace('{"v":1}', '{"v":1,"kids":[]}')
    assert re.fullmatch(constraint.regex, deepest)
    assert not re.fullmatch(constraint.regex, deepest.replace("[]", '[{"v":0}]'))


def test_a_schema_that_refers_to_its_root_unrolls() -> None:
    schema = {"type": "object", "properties": {"next": {"$ref": "#"}}, "additionalProperties": False}
    regex = to_regex(schema, max_recursion_depth=2)
    assert re.fullmatch(regex, '{"next":{}}') and not re.fullmatch(regex, '{"next":{"next":{}}}')


@pytest.mark.slow
def test_a_recursive_schema_unrolls_its_shared_definitions_once_per_nesting_count() -> None:
    # Five levels of five properties each referring to the level below, beside a recursive tree: unrolled as a
    # tree walk that is 5^5 copies of the bottom level; shared, each level once.
    defs: dict[str, Any] = {"l5": {"type": "integer", "minimum": 0, "maximum": 9}, "n": TREE["$defs"]["n"]}
    for level in range(4, -1, -1):
        defs[f"l{level}"] = {"type": "object", "additionalProperties": False, "required": [f"p{i}" for i in range(5)],
                             "properties": {f"p{i}": {"$ref": f"#/$defs/l{level + 1}"} for i in range(5)}}
    schema = {"$defs": defs, "type": "object", "additionalProperties": False, "required": ["tree", "wide"],
              "properties": {"tree": {"$ref": "#/$defs/n"}, "wide": {"$ref": "#/$defs/l0"}}}
    document, narrowings = unroll(schema, 2)
    unrolled = document.root
    assert narrowings
    seen: set[int] = set()

    def distinct(node: Any) -> None:
        if isinstance(node, dict) and id(node) not in seen:
            seen.add(id(node))
            for value in node.values():
                distinct(value)

    distinct(unrolled)
    assert len(seen) < 100  # 5^5 as a tree
    seen.clear()
    distinct(check(document, True, "").pruned(unrolled))  # what the parse step validates against: shared too
    assert len(seen) < 100
    regex = constraint_of(schema, max_recursion_depth=2).regex

    def wide(level: int) -> Any:
        return 7 if level == 5 else {f"p{i}": wide(level + 1) for i in range(5)}

    jsonschema.validate({"tree": tree(2), "wide": wide(0)}, schema)
    for depth, ok in ((2, True), (3, False)):
        text = json.dumps({"tree": tree(depth), "wide": wide(0)}, separators=(",", ":"))
        assert bool(re.fullmatch(regex, text)) == ok


class Node(BaseModel):
    name: str
    children: list[Node] = []


@pytest.mark.slow
def test_a_recursive_pydantic_model_compiles_and_generates(byte_lm: structspec.LM) -> None:
    result = structspec.generate_result(byte_lm, Node, "A tree:", max_new_tokens=300, seed=0)
    assert result.stop_reason in ("eos", "fsm_complete", "max_new_tokens")
    if result.complete:
        assert isinstance(result.value, Node)
    assert structspec.compile(Node, byte_lm).narrowings


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": PROPS, "minProperties": 2, "additionalProperties": False},
    {"type": "object", "properties": PROPS, "dependentRequired": {"a": ["d"]}, "additionalProperties": False},
    {"type": "array", "items": {"enum": ["x", "y", "z"]}, "uniqueItems": True},
    {"type": "boolean", "not": {"const": False}},
    {"type": "string", "maxLength": 3, "not": {"enum": ["", "a", "b"]}},
    {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 3}, {"enum": [0, 1, "x"]}]},
    TREE,
])
def test_generated_outputs_validate(byte_lm: structspec.LM, schema: dict) -> None:
    for seed in range(3):
        result = structspec.generate_result(byte_lm, schema, "JSON:", max_new_tokens=200, do_sample=True, seed=seed)
        assert result.stop_reason != "invalid"
        if result.complete:
            jsonschema.validate(result.value, schema)


@pytest.mark.parametrize(("schema", "keyword", "pointer"), [
    ({"type": "object", "properties": {"o": {"type": "object", "properties": {c: {} for c in "abcdefghi"},
                                             "maxProperties": 2}}}, "maxProperties", "/properties/o"),
    ({"type": "object", "properties": {"a": {}}, "dependencies": {"a": {"required": ["b"]}}}, "dependencies", "/"),
    ({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "dependentRequired": {"a": ["c"]},
      "additionalProperties": False}, "dependentRequired", "/"),
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems", "/"),
    ({"type": "array", "items": {"type": "integer", "maximum": 3}, "uniqueItems": True}, "uniqueItems", "/"),
    ({"type": "array", "items": {"enum": list(range(6))}, "uniqueItems": True}, "uniqueItems", "/"),  # 1,957
    ({"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True, "minItems": 3}, "uniqueItems", "/"),
    ({"type": "object", "properties": {"n": {"type": "number", "not": {"enum": [1]}}}}, "not", "/properties/n"),
    ({"type": "number", "not": {"type": "integer"}}, "not", "/"),
    ({"type": "string", "not": {"type": "string"}}, "not", "/"),
    ({"type": "string", "not": {"const": "/" * 11}}, "not", "/"),  # 2**11 spellings
    ({"type": "string", "enum": ["x"], "not": {"const": "x"}}, "not", "/"),
    ({"type": "string", "maxLength": 0, "not": {"const": ""}}, "not", "/"),
    ({"properties": {"o": {"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}}}, "oneOf",
     "/properties/o"),
    ({"oneOf": [{"type": "number"}, {"const": 1}]}, "oneOf", "/"),
    ({"oneOf": [{"type": "string", "not": {"const": "y"}}, {"const": "x"}]}, "oneOf", "/"),
    ({"oneOf": [{"enum": ["x", 1]}, {"enum": [1.0, "x"]}]}, "oneOf", "/"),
    ({"$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}, "minItems": 1}}, "$ref": "#/$defs/n"},
     "$ref", "/"),
])
def test_what_cannot_be_exact_names_keyword_and_pointer(schema: dict, keyword: str, pointer: str) -> None:
    with pytest.raises(SchemaError) as err:
        to_regex(schema)
    assert (err.value.keyword, err.value.pointer) == (keyword, pointer)


def test_not_strict_drops_what_cannot_be_exact() -> None:
    with pytest.warns(UserWarning, match="uniqueItems"):
        regex = to_regex({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, strict=False)
    assert re.fullmatch(regex, '["a","a"]')
    with pytest.warns(UserWarning, match="'oneOf' at /"):
        constraint = constraint_of({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 1}]}, strict=False)
    assert re.fullmatch(constraint.regex, '"x"') and constraint.parse('"x"') == "x"  # oneOf is not validated


@pytest.mark.parametrize("depth", [0, -1, 1.5, True])
def test_max_recursion_depth_is_checked(depth: Any) -> None:
    with pytest.raises(OptionError, match="max_recursion_depth"):
        to_regex(TREE, max_recursion_depth=depth)


@pytest.mark.slow
@pytest.mark.parametrize("branches", [
    [{"required": ["a"]}, {"required": ["b", "c"]}, {"required": ["d"]}],  # exclusive groups (Glaive's shapes)
    [{"required": ["a"]}, {"required": ["a", "b"]}],  # one branch's names inside another's
    [{"required": ["a", "b"]}, {"required": ["b", "c"]}],
])
def test_a_oneof_of_required_sets_admits_exactly_the_objects_that_complete_one(branches: list) -> None:
    schema = {"type": "object", "properties": PROPS, "oneOf": branches}
    agrees(schema, objects())
    assert any(re.fullmatch(to_regex(schema), t) for t in objects())


def test_a_oneof_of_required_sets_that_no_object_completes_once_is_a_schema_error() -> None:
    schema = {"type": "object", "properties": PROPS, "required": ["a", "b"],
              "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    with pytest.raises(SchemaError) as err:
        to_regex(schema)
    assert (err.value.keyword, err.value.pointer) == ("oneOf", "/")


def test_a_false_pattern_forbids_the_names_it_matches() -> None:
    schema = {"type": "object", "properties": PROPS, "patternProperties": {"^[bc]$": False, "^z": {"const": 0}}}
    agrees(schema, objects() + ['{"a":1,"z":0}', '{"zz":0,"z":0}', '{"z":1}'])
    with pytest.raises(SchemaError) as err:
        to_regex(schema | {"required": ["b"]})
    assert (err.value.keyword, err.value.pointer) == ("patternProperties", "/")


@pytest.mark.slow
def test_a_pattern_that_matches_a_listed_property_with_the_same_or_any_schema_is_enforced() -> None:
    schema = {"type": "object", "properties": PROPS, "patternProperties": {"^[ab]$": {}}}
    agrees(schema, objects())
    with pytest.raises(SchemaError, match="would need both schemas"):
        to_regex(schema | {"patternProperties": {"^[ab]$": {"type": "string"}}})


@pytest.mark.slow
@pytest.mark.parametrize("schema", [{"format": "date"}, {"minLength": 2}, {"maxItems": 1, "items": {"const": 1}},
                                    {"minimum": 3}, {"required": ["a"]}])
def test_a_keyword_without_type_applies_to_its_own_type_and_lets_other_types_through(schema: dict) -> None:
    texts = ['"2020-02-29"', '"2021-02-29"', '"x"', '""', "1", "3", "3.5", "-7", "true", "null", "[]", "[1]",
             "[1,1]", '["x"]', "{}", '{"a":1}', '{"b":true}']
    agrees(schema, texts)


@pytest.mark.slow
def test_a_format_no_draft_defines_is_an_annotation_said_in_a_warning() -> None:
    schema = {"type": "object", "properties": {"u": {"type": "string", "format": "url", "maxLength": 4}}}
    with pytest.warns(UserWarning, match=r"not enforced: 'url' at /properties/u"):
        regex = to_regex(schema)
    assert re.fullmatch(regex, '{"u":"a b"}') and not re.fullmatch(regex, '{"u":"abcde"}')  # maxLength still holds


LISTED = {"a": {"const": 1}, "b": {"const": True}}
EXTRAS = [("z", 1), ("y", "s"), ("q", [1, {"r": None}]), ("b\\", 2)]


def open_objects() -> list[str]:
    """Objects of listed members (a subset of LISTED, declared order) followed by unlisted ones (a subset of
    EXTRAS), each name once."""
    texts = []
    for k in range(len(LISTED) + 1):
        for listed in itertools.combinations(LISTED, k):
            for j in range(len(EXTRAS) + 1):
                for extra in itertools.combinations(EXTRAS, j):
                    members = [(n, LISTED[n]["const"]) for n in listed] + list(extra)
                    texts.append("{" + ",".join(f"{json.dumps(n)}:{json.dumps(v, separators=(',', ':'))}"
                                                for n, v in members) + "}")
    return texts


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{}, {"additionalProperties": True}, {"additionalProperties": {"type": "integer"}},
                                   {"additionalProperties": {"type": "string"}, "required": ["a"]}])
def test_open_objects_admit_exactly_the_unlisted_members_json_schema_allows(extra: dict) -> None:
    schema = {"type": "object", "properties": LISTED} | extra
    agrees(schema, open_objects(), open_objects=True)
    regex = to_regex(schema, open_objects=True)
    # a listed name is never written twice, nor after an unlisted one; a second spelling of a name is refused
    for text in ['{"a":1,"a":1}', '{"a":1,"z":1,"a":1}', '{"z":1,"b":true}', '{"a":1,"\\/":1,"/":1}']:
        assert re.fullmatch(regex, text) is None, text
    assert not any("not written" in n for n in constraint_of(schema, open_objects=True).narrowings)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [{"additionalProperties": True}, {"additionalProperties": {"type": "integer"}},
                                   {"additionalProperties": {}, "required": ["b"]}])
def test_an_explicit_additional_properties_opens_the_object_whatever_open_objects_says(extra: dict) -> None:
    # named, it is honoured as JSON Schema reads it; absent, open_objects=False closes the object (listed)
    schema = {"type": "object", "properties": LISTED} | extra
    for wide in (None, False):
        agrees(schema, open_objects(), open_objects=wide)
        assert not any("not written" in n for n in constraint_of(schema, open_objects=wide).narrowings)
    nested = {"type": "object", "properties": {"o": schema, "p": {"type": "object", "properties": LISTED}}}
    regex = to_regex(nested, open_objects=False)
    assert re.fullmatch(regex, '{"o":{"b":true,"z":1}}')
    assert not re.fullmatch(regex, '{"p":{"b":true,"z":1}}')  # the closed one, listed
    assert "/properties/p: members 'properties' does not list are not written (open_objects=False)" in (
        constraint_of(nested, open_objects=False).narrowings)
    assert re.fullmatch(to_regex(nested), '{"p":{"b":true,"z":1}}')  # by default, as JSON Schema reads it


@pytest.mark.slow
def test_an_absent_additional_properties_is_open_in_a_json_schema_and_closed_in_a_pydantic_model() -> None:
    class Item(BaseModel):
        a: int
        b: bool = False

    class Loose(Item, extra="allow"):  # writes additionalProperties: true
        pass

    text = '{"a":1,"b":true,"z":1}'
    assert re.fullmatch(to_regex(Item.model_json_schema()), text)  # the model's schema as a dict: JSON Schema's
    assert Item.model_validate_json(text) == Item(a=1, b=True)  # the model ignores the unlisted member...
    assert not re.fullmatch(to_regex(Item), text)  # ...so none is written, and that is listed
    assert "/: members 'properties' does not list are not written (open_objects=False)" in (
        constraint_of(Item).narrowings)
    assert re.fullmatch(to_regex(Loose), text) and re.fullmatch(to_regex(Item, open_objects=True), text)
    assert not re.fullmatch(to_regex(Item.model_json_schema(), open_objects=False), text)


def test_an_additional_properties_schema_it_cannot_enforce_closes_the_object() -> None:
    # a misspelt subschema (no keyword JSON Schema knows) is refused where it must be enforced; here leaving
    # the unlisted members out is narrower, so the object is closed and says why
    schema = {"type": "object", "properties": LISTED, "additionalProperties": {"refData": {"type": "string"}}}
    constraint = constraint_of(schema)
    assert any("not written (additionalProperties: unsupported schema keyword 'refData'" in n
               for n in constraint.narrowings), constraint.narrowings
    check = validator(schema)
    accepted = [t for t in open_objects() if re.fullmatch(constraint.regex, t)]
    assert '{"a":1,"b":true}' in accepted and '{"a":1,"z":1}' not in accepted
    assert all(check.is_valid(json.loads(t)) for t in accepted)
    with pytest.raises(SchemaError, match="refData"):  # where the members must be written, still an error
        to_regex({"type": "object", "additionalProperties": {"refData": {}}})


def test_closed_objects_list_the_narrowing_and_open_ones_keep_counts_closed() -> None:
    schema = {"type": "object", "properties": LISTED}
    assert "/: members 'properties' does not list are not written (open_objects=False)" in (
        constraint_of(schema, open_objects=False).narrowings)
    assert not any(UNLISTED in n for n in constraint_of(schema).narrowings)  # open, as JSON Schema reads it
    assert not any(UNLISTED in n for n in constraint_of(schema | {"additionalProperties": False}).narrowings)
    for counted, why in [({"maxProperties": 2}, "with maxProperties"),
                         ({"maxProperties": 1}, "with property counts or dependencies"),
                         ({"dependentRequired": {"a": ["b"]}}, "with property counts or dependencies")]:
        constraint = constraint_of(schema | counted, open_objects=True)
        assert any(why in n for n in constraint.narrowings), constraint.narrowings
        check = validator(schema | counted)
        accepted = [t for t in open_objects() if re.fullmatch(constraint.regex, t)]
        assert accepted and all(check.is_valid(json.loads(t)) for t in accepted)  # narrower, never looser
    with pytest.raises(OptionError, match="open_objects"):
        constraint_of(schema, open_objects="yes")


@pytest.mark.slow
def test_open_objects_generate_valid_instances(byte_lm: structspec.LM) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": {"type": "boolean"}}
    complete = 0
    for seed in range(6):
        result = structspec.generate_result(byte_lm, schema, "JSON:", max_new_tokens=200, do_sample=True, seed=seed,
                                            open_objects=True)
        if result.complete:
            jsonschema.validate(json.loads(result.text), schema)
            complete += 1
        else:  # a random model may write long names: its output stops only at the budget
            assert result.stop_reason == "max_new_tokens"
    assert complete >= 2


@pytest.mark.parametrize("pattern, whole", [("^[a-z]+$", True), ("^a$|^b$", True), (".*x.*", True),
                                            ("[a-z]", False), ("^ab", False), ("c$", False), ("^a|b$", False)])
def test_a_pattern_matched_whole_is_listed_unless_anchored(pattern: str, whole: bool) -> None:
    narrowings = constraint_of({"type": "string", "pattern": pattern}).narrowings
    assert any("matches whole strings only" in n for n in narrowings) != whole, narrowings


def test_values_no_schema_describes_list_their_nesting_depth() -> None:
    assert any("nest at most 3 levels" in n for n in constraint_of({"type": "array"}).narrowings)
    assert not any("nest" in n for n in constraint_of({"type": "array", "items": {"type": "integer"}}).narrowings)


@pytest.mark.slow
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_values_no_schema_describes_nest_to_max_recursion_depth(depth: int) -> None:
    # {} is the recursive "any JSON value": it nests like a recursive $ref, as many levels as it says
    constraint = constraint_of({"type": "object", "properties": {"a": {}}, "required": ["a"]},
                               max_recursion_depth=depth)
    assert any(n.endswith(f": values no schema describes nest at most {depth} levels of arrays and objects "
                          "(max_recursion_depth)") for n in constraint.narrowings), constraint.narrowings
    for levels in range(6):
        nested: Any = 1
        for level in range(levels):
            nested = [nested] if level % 2 else {"k": nested}
        text = json.dumps({"a": nested}, separators=(",", ":"))
        assert (re.fullmatch(constraint.regex, text) is not None) == (levels <= depth), text


def test_a_schema_keyword_named_depth_changes_nothing() -> None:
    # an unknown keyword is an annotation, even one the translator's own bookkeeping might have used
    regex = constraint_of({"type": "array", "depth": 0}).regex
    assert re.fullmatch(regex, "[[1]]") and re.fullmatch(regex, '[{"a":[2]}]')


def test_open_objects_do_not_make_a_one_of_of_required_names_a_union() -> None:
    # closed, {"$ref"} and {"name"} objects are disjoint; open, {"$ref": .., "name": ..} matches both branches
    schema = {"oneOf": [{"type": "object", "required": ["$ref"], "properties": {"$ref": {"type": "string"}}},
                        {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}]}
    both = '{"$ref":"x","name":"y"}'
    assert not validator(schema).is_valid(json.loads(both))
    assert re.fullmatch(to_regex(schema, open_objects=False), both) is None
    with pytest.raises(SchemaError, match="may overlap") as raised:
        to_regex(schema)  # open, as JSON Schema reads an absent additionalProperties
    assert raised.value.keyword == "oneOf"
    closed = {"oneOf": [b | {"additionalProperties": False} for b in schema["oneOf"]]}  # disjoint again
    assert re.fullmatch(to_regex(closed, open_objects=True), both) is None
    named = {"oneOf": [b | {"additionalProperties": True} for b in schema["oneOf"]]}  # open whatever the option
    with pytest.raises(SchemaError, match="may overlap"):
        to_regex(named, open_objects=False)


@pytest.mark.parametrize("schema, texts", [
    ({"maxItems": 2.0}, ["[1,2]", "[1,2,3]", "[]", '"x"']),
    ({"minLength": 2.0}, ['"fo"', '"f"', "1"]),
    ({"type": "object", "properties": {"a": {"const": 1}, "b": {"const": 1}}, "minProperties": 1.0},
     ["{}", '{"a":1}', '{"a":1,"b":1}']),
])
def test_counts_written_as_integral_floats_are_enforced(schema: dict, texts: list[str]) -> None:
    agrees(schema, texts)  # JSON Schema reads 2.0 as the integer 2


@pytest.mark.slow
@pytest.mark.parametrize("wide", [False, True], ids=["closed", "open"])
def test_a_property_whose_schema_is_false_is_never_written(wide: bool) -> None:
    schema = {"type": "object", "properties": {"a": {"const": 1}, "b": False}}
    if wide:
        agrees(schema, open_objects(), open_objects=True)
    regex = to_regex(schema, open_objects=wide)
    assert re.fullmatch(regex, '{"a":1}') and not re.fullmatch(regex, '{"a":1,"b":true}')
    with pytest.raises(SchemaError, match="schema false"):
        to_regex(schema | {"required": ["b"]}, open_objects=wide)


@pytest.mark.slow
def test_a_one_of_of_required_names_stays_exact_with_open_objects() -> None:
    # the branch that leaves a name out must not let it back in as an unlisted member
    schema = {"type": "object", "properties": LISTED, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    agrees(schema, open_objects(), open_objects=True)


@pytest.mark.parametrize("value", [0, -3, 10**400, 1.0, -0.0, 2.5, 1e300, float("inf"), True, False, None, "1", "",
                                   [], [1], {}, {"a": 1}])
def test_a_values_json_type_is_jsonschemas(value: Any) -> None:
    checker = jsonschema.Draft202012Validator.TYPE_CHECKER
    for kind in ("null", "boolean", "object", "array", "number", "string", "integer"):
        assert has_type(value, kind) == checker.is_type(value, kind), (value, kind)
