"""`structspec.compile` returns a callable: it decodes as the one-liners do, token for token, never compiles
again, and takes exactly the typed keywords `GenerateOptions` and `CompileOptions` list."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import pytest
from pydantic import BaseModel, Field

import structspec
import structspec.compiled
from structspec import CompileOptions, GenerateOptions, OptionError, SpecError
from structspec.decoding.row import DecodeOptions
from structspec.options import (BatchKeywords, BatchOneLinerKeywords, CompileKeywords, GenerateKeywords,
                                 OneLinerKeywords)

MISSING = "no-such-model"  # loading it raises ModelNotFoundError: an OptionError first shows no model was loaded
PROMPTS = ["Alice is 31. As JSON:", "Bob, 45:"]


class Person(BaseModel):
    name: str = Field(max_length=8)
    age: int = Field(ge=0, le=120)


@pytest.fixture(params=["byte_lm", "sp_lm"])
def lm(request: pytest.FixtureRequest) -> structspec.LM:
    return request.getfixturevalue(request.param)


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The specs `compile` builds a token FSM for, from here on."""
    built: list[Any] = []
    from_regex = structspec.compiled.TokenFSM.from_regex

    def counted(*args: Any, **kwargs: Any) -> Any:
        built.append(args[0])
        return from_regex(*args, **kwargs)

    monkeypatch.setattr(structspec.compiled.TokenFSM, "from_regex", counted)
    return built


def test_a_call_is_the_one_liner_token_for_token(lm: structspec.LM) -> None:
    person = structspec.compile(Person, lm)
    for prompt in PROMPTS:
        ours = person.result(prompt, max_new_tokens=40)
        theirs = structspec.generate_result(lm, Person, prompt, max_new_tokens=40)
        assert ours.complete and ours.token_ids == theirs.token_ids and ours.sources == theirs.sources
        assert person(prompt, max_new_tokens=40) == structspec.generate(lm, Person, prompt, max_new_tokens=40)
    sampled = [person.result(PROMPTS[0], temperature=0.8, seed=3, max_new_tokens=40).token_ids for _ in range(2)]
    assert sampled[0] == sampled[1] == structspec.generate_result(
        lm, Person, PROMPTS[0], temperature=0.8, seed=3, max_new_tokens=40).token_ids


def test_calls_never_compile_again(byte_lm: structspec.LM, compiles: list[Any]) -> None:
    person = structspec.compile(Person, byte_lm)
    assert len(compiles) == 1
    person(PROMPTS[0], max_new_tokens=40)
    person.result(PROMPTS[1], max_new_tokens=40, draft=None, fast_forward="off")
    list(person.stream(PROMPTS[0], max_new_tokens=40))
    person.batch(PROMPTS, batch_size=2, max_new_tokens=40)
    assert len(compiles) == 1
    structspec.generate(byte_lm, Person, PROMPTS[0], max_new_tokens=40)  # a one-liner compiles (from the cache)
    assert len(compiles) == 2


def test_batch_is_each_prompt_alone_in_order(byte_lm: structspec.LM) -> None:
    person = structspec.compile(Person, byte_lm)
    prompts = [*PROMPTS, "", "Carol is 27."]  # an empty prompt is its own row's error
    results = person.batch(prompts, batch_size=2, max_new_tokens=40)
    for prompt, result in zip(prompts, results):
        if prompt:
            assert result.token_ids == person.result(prompt, max_new_tokens=40).token_ids
    assert results[2].stop_reason == "error" and str(results[2].error).startswith("row 2: ")
    assert [r.token_ids for r in results] == [
        r.token_ids for r in structspec.generate_batch(byte_lm, Person, prompts, batch_size=2, max_new_tokens=40)]


def test_stream_ends_in_the_result(byte_lm: structspec.LM) -> None:
    person = structspec.compile(Person, byte_lm)
    *chunks, finished = person.stream(PROMPTS[0], max_new_tokens=40)
    assert isinstance(finished, structspec.Finished)
    assert finished.result.token_ids == person.result(PROMPTS[0], max_new_tokens=40).token_ids
    assert "".join(c.text for c in chunks if isinstance(c, structspec.TextChunk)) == finished.result.text
    assert [c.name for c in chunks if isinstance(c, structspec.FieldDone)] == ["name", "age"]


@pytest.mark.parametrize("name", [f.name for f in dataclasses.fields(CompileOptions)])
def test_a_compile_option_given_to_a_call_says_to_compile_again(byte_lm: structspec.LM, name: str) -> None:
    person = structspec.compile(Person, byte_lm)
    value = getattr(CompileOptions(), name)
    message = rf"^{name} is a compile option.*: compile again with it, structspec.compile\(spec, lm, {name}=...\)$"
    for call in (person, person.result, person.stream, lambda p, **o: person.batch([p], **o)):
        with pytest.raises(OptionError, match=message):
            call(PROMPTS[0], **{name: value})


def test_options_are_checked_before_the_model_loads() -> None:
    with pytest.raises(OptionError, match="^max_integer_digits must be ≥ 1"):
        structspec.compile(Person, MISSING, max_integer_digits=0)
    with pytest.raises(OptionError, match="^unknown option 'whitespace': did you mean 'whitespace_pattern'"):
        structspec.compile(Person, MISSING, whitespace=" ")  # type: ignore[call-arg]
    with pytest.raises(OptionError, match=r"^max_new_tokens is an option of a call.*person\(prompt, max_new_tokens"):
        structspec.compile(Person, MISSING, max_new_tokens=5)  # type: ignore[call-arg]
    with pytest.raises(OptionError, match="^top_p must be in"):
        structspec.generate(MISSING, Person, PROMPTS[0], top_p=2.0)
    with pytest.raises(OptionError, match="^unknown option 'output_logprobs'"):  # not in a batch's signature
        structspec.generate_batch(MISSING, Person, PROMPTS, output_logprobs=True)  # type: ignore[call-arg]


@pytest.mark.parametrize(("spec", "error"), [
    ({"type": "strng"}, structspec.SchemaError), ({"minimum": "1"}, structspec.SchemaError), (object(), SpecError),
    ("not json", SpecError),
])
def test_a_spec_that_needs_no_tokenizer_is_checked_before_the_model_loads(spec: Any, error: type) -> None:
    # a bad spec raised ModelNotFoundError here (or, for a real name, after loading the model)
    with pytest.raises(error):
        structspec.compile(spec, MISSING)
    with pytest.raises(error):
        structspec.generate(MISSING, spec, PROMPTS[0])


@pytest.mark.dtype
def test_an_agents_spec_is_read_with_the_tokenizer_so_after_the_model_loads() -> None:
    with pytest.raises(structspec.ModelNotFoundError):  # ToolCalls may place the tokenizer's own special tokens
        structspec.compile(structspec.ToolCalls([{"name": "f"}]), MISSING)


def test_a_call_checks_its_options_and_prompt(byte_lm: structspec.LM) -> None:
    person = structspec.compile(Person, byte_lm)
    with pytest.raises(OptionError, match="^temperature must be"):
        person(PROMPTS[0], temperature=0.0)
    with pytest.raises(OptionError, match="did you mean 'lookahead'"):
        person.stream(PROMPTS[0], draft="lookhead")  # type: ignore[arg-type]
    with pytest.raises(structspec.PromptError):
        person.result({"role": "user", "content": "hi"})  # type: ignore[arg-type]
    with pytest.raises(OptionError, match="^batch_size must be ≥ 1"):
        person.batch(PROMPTS, batch_size=0)


def _keywords(function: Any) -> dict[str, Any]:
    """A call's keyword-only parameters with their defaults, and its ``**keywords``' TypedDict as ``"**"``."""
    parameters = inspect.signature(function).parameters.values()
    out = {p.name: p.default for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    hints = typing.get_type_hints(function, include_extras=True)
    (var,) = [p.name for p in parameters if p.kind is inspect.Parameter.VAR_KEYWORD]  # one typed **keywords
    assert typing.get_origin(hints[var]) is typing.Unpack
    return out | {"**": typing.get_args(hints[var])[0]}


def _fields(*options: type[Any], but: tuple[str, ...] = ()) -> dict[str, Any]:
    """The options' fields, in order, with their types."""
    return {f.name: typing.get_type_hints(cls)[f.name] for cls in options for f in dataclasses.fields(cls)
            if f.name not in but}


@pytest.mark.parametrize("keywords", [CompileKeywords, GenerateKeywords, BatchKeywords, OneLinerKeywords,
                                      BatchOneLinerKeywords])
def test_each_keyword_set_is_the_options_dataclasses_fields_with_their_types(keywords: type[Any]) -> None:
    taken = {"CompileKeywords": (CompileOptions,), "GenerateKeywords": (GenerateOptions,),
             "BatchKeywords": (GenerateOptions,), "OneLinerKeywords": (GenerateOptions, CompileOptions),
             "BatchOneLinerKeywords": (GenerateOptions, CompileOptions)}[keywords.__name__]
    but = ("output_logprobs",) if "Batch" in keywords.__name__ else ()
    hints = typing.get_type_hints(keywords)
    assert list(hints) == list(_fields(*taken, but=but))  # the same names, in order
    assert hints == _fields(*taken, but=but)  # with the same types
    assert not keywords.__required_keys__


def test_the_signatures_take_one_typed_keyword_set_each() -> None:
    """Each public call takes its keyword set (`Unpack`), and nothing else but its own keywords."""
    person = structspec.Compiled
    call = {"streamer": None, "generation_config": None}
    batch = {"batch_size": 8, "generation_config": None}
    assert _keywords(structspec.compile) == {"**": CompileKeywords}
    assert _keywords(person.__call__) == _keywords(person.result) == call | {"**": GenerateKeywords}
    assert _keywords(person.stream) == {"generation_config": None, "**": GenerateKeywords}
    assert _keywords(person.batch) == batch | {"**": BatchKeywords}
    assert _keywords(structspec.generate) == _keywords(structspec.generate_result) == call | {"**": OneLinerKeywords}
    assert _keywords(structspec.stream) == {"generation_config": None, "**": OneLinerKeywords}
    for function in (structspec.generate_batch, structspec.iter_batch):
        assert _keywords(function) == batch | {"**": BatchOneLinerKeywords}


@pytest.mark.parametrize("call", ["generate_result", "generate", "stream", "generate_batch", "compiled"])
def test_the_options_are_built_and_checked_once_per_call(byte_lm: structspec.LM, monkeypatch, call: str) -> None:
    checks, made = [], []
    monkeypatch.setattr("structspec.options.check_draft", lambda draft: checks.append(draft))
    monkeypatch.setattr("structspec.options.DecodeOptions", lambda *a: made.append(a) or DecodeOptions(*a))
    person = structspec.compile(Person, byte_lm)
    run = {"generate_result": lambda: structspec.generate_result(byte_lm, Person, PROMPTS[0], max_new_tokens=4),
           "generate": lambda: pytest.raises(structspec.TokenBudgetExceeded, structspec.generate, byte_lm, Person,
                                             PROMPTS[0], max_new_tokens=4),
           "stream": lambda: list(structspec.stream(byte_lm, Person, PROMPTS[0], max_new_tokens=4)),
           "generate_batch": lambda: structspec.generate_batch(byte_lm, Person, PROMPTS, max_new_tokens=4),
           "compiled": lambda: person.result(PROMPTS[0], max_new_tokens=4, draft="lookahead")}[call]
    run()
    assert len(checks) == len(made) == 1 and made[0][0] == 4
