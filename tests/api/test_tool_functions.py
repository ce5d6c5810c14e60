"""Typed Python functions as tools: each parameter a property of the same name (names Pydantic keeps for itself
too), read back as the function's keyword arguments; what a call's named arguments cannot carry, or an
annotation without a JSON Schema, refused with a `ToolError` naming the tool and the parameter."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

import pytest
from pydantic import BaseModel

from structspec import ToolCall, ToolCalls, ToolError


class Plain:
    """A class Pydantic has no schema for."""


class Place(BaseModel):
    city: str


def private(_x: int, y: int) -> None: ...


def reserved(model_config: int, json: str, model_name: str = "m") -> None: ...


def nested(place: Place, unit: Literal["C", "F"] = "C") -> None: ...


def star_args(*args: int) -> None: ...


def star_kwargs(a: int, **kwargs: int) -> None: ...


def positional(a: int, /, b: int) -> None: ...


def callback(a: int, cb: Callable[[int], int]) -> None: ...


def plain_class(p: Plain) -> None: ...


def unknown_name(a: int) -> None: ...


unknown_name.__annotations__["a"] = "NotDefinedAnywhere"  # as `from __future__ import annotations` keeps a typo


@pytest.mark.parametrize("function, properties, required", [
    (private, ["_x", "y"], ["_x", "y"]),
    (reserved, ["model_config", "json", "model_name"], ["model_config", "json"]),
    (nested, ["place", "unit"], ["place"]),
])
def test_each_parameter_is_a_property_of_its_own_name(function, properties, required) -> None:
    (tool,) = ToolCalls([function]).tools
    assert tool.name == function.__name__
    assert list(tool.parameters["properties"]) == properties and tool.parameters["required"] == required


def test_the_arguments_come_back_as_the_functions_keywords() -> None:
    (tool,) = ToolCalls([reserved]).tools
    arguments = tool.spec.model_validate_json('{"model_config": 3, "json": "j"}')
    assert ToolCall("reserved", arguments).keywords() == {"model_config": 3, "json": "j", "model_name": "m"}
    (tool,) = ToolCalls([private]).tools
    call = ToolCall("private", tool.spec.model_validate_json('{"_x": 1, "y": 2}'))
    assert call.keywords() == {"_x": 1, "y": 2} and call.json_arguments() == {"_x": 1, "y": 2}
    (tool,) = ToolCalls([nested]).tools
    call = ToolCall("nested", tool.spec.model_validate_json('{"place": {"city": "Oslo"}}'))
    assert call.keywords() == {"place": Place(city="Oslo"), "unit": "C"}  # a nested model stays a model


@pytest.mark.parametrize("function, words", [
    (star_args, "tool 'star_args': parameter *args takes any number of arguments"),
    (star_kwargs, "tool 'star_kwargs': parameter **kwargs takes any number of arguments"),
    (positional, "tool 'positional': parameter 'a' is positional-only"),
    (callback, "tool 'callback': parameter 'cb' has no JSON Schema"),
    (plain_class, "tool 'plain_class': parameter 'p' has no JSON Schema"),
    (unknown_name, "tool 'unknown_name': parameter 'a''s annotation 'NotDefinedAnywhere' does not resolve"),
])
def test_what_a_call_cannot_carry_is_refused_naming_the_parameter(function, words) -> None:
    with pytest.raises(ToolError, match=re.escape(words)):
        ToolCalls([function])
