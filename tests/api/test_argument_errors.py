"""A wrong-type argument to a public entry point is a specific `StructspecError` naming the argument and the fix,
raised before any model loads (never an AttributeError from deep inside)."""

from __future__ import annotations

import pathlib

import pytest

import structspec
from structspec.errors import ModelNotFoundError, OptionError

SCHEMA = {"type": "integer"}


@pytest.mark.parametrize("model", [None, 42, 1.5, True, ["smollm2-135m"], b"smollm2-135m"])
@pytest.mark.parametrize("call", [
    lambda m: structspec.generate(m, SCHEMA, "x"),
    lambda m: structspec.generate_result(m, SCHEMA, "x"),
    lambda m: list(structspec.stream(m, SCHEMA, "x")),
    lambda m: structspec.generate_batch(m, SCHEMA, ["x"]),
    lambda m: list(structspec.iter_batch(m, SCHEMA, ["x"])),
    lambda m: structspec.compile(SCHEMA, m),
    lambda m: structspec.calibrate(m),
], ids=["generate", "generate_result", "stream", "generate_batch", "iter_batch", "compile", "calibrate"])
def test_a_model_of_the_wrong_type_is_an_option_error_with_the_fix(call, model) -> None:
    with pytest.raises(OptionError, match=r"model must be a loaded model or a model's name.*structspec\.load\("):
        call(model)


@pytest.mark.parametrize("name", [None, 42, ["smollm2-135m"]])
def test_load_of_a_name_of_the_wrong_type_is_an_option_error(name) -> None:
    with pytest.raises(OptionError, match="name must be a model's name.*smollm2-135m"):
        structspec.load(name)


@pytest.mark.parametrize("as_path", [str, pathlib.Path])
def test_load_of_a_directory_without_a_model_says_what_it_lacks(tmp_path: pathlib.Path, as_path) -> None:
    with pytest.raises(ModelNotFoundError, match="directory without a model .no config.json.; pass"):
        structspec.load(as_path(tmp_path))


def test_clear_cache_takes_a_bool() -> None:
    with pytest.raises(OptionError, match="disk must be True or False"):
        structspec.clear_cache("yes")
