"""structspec's errors survive a trip to another process: pickled (as multiprocessing, Ray and vLLM's engine core
send them), each arrives with its class, message and attributes."""

from __future__ import annotations

import pickle
from types import SimpleNamespace

import pytest

from structspec import errors
from structspec.errors import SchemaError, StructspecError, UnspellableError

RESULT = SimpleNamespace(text='{"name": "Ad', token_ids=[1, 2], sources=["model", "forced"], stats={"passes": 2},
                         stop_reason="max_new_tokens", error=None)


def _every_error() -> list[StructspecError]:
    unspellable = UnspellableError(7, ["@"])
    return [
        SchemaError("oneOf", "/properties/a", "overlapping branches"),
        errors.RegexError("a(", "missing )"),
        errors.OptionError("top_p must be in (0, 1], got 1.5"),
        errors.TokenBudgetExceeded(5, RESULT),
        unspellable,
        unspellable.carrying(SimpleNamespace(**vars(RESULT))),  # its result points back at it
        errors.InvalidOutput(RESULT, "age: not an integer"),
        errors.InvalidSchemaError("type", "/", "'strin' is not a type (did you mean 'string'?)"),
        errors.ToolSchemaError("lookup", SchemaError("not", "/properties/q", "not over objects")),
        errors.MarkerError("no special token '<think>'"),
    ]


@pytest.mark.parametrize("error", _every_error(), ids=lambda e: type(e).__name__)
def test_an_error_round_trips_through_pickle_with_its_class_message_and_attributes(error: StructspecError) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
    assert sorted(vars(back)) == sorted(vars(error))
    for name, value in vars(error).items():
        if name == "result" and value is not None:
            assert vars(back.result).keys() == vars(value).keys() and back.result.text == value.text
        else:
            assert getattr(back, name) == value, name
    if getattr(error, "result", None) is not None and error.result.error is error:
        assert back.result.error is back  # the cycle is kept, not copied
