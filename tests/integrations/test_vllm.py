"""structspec as vLLM's structured-output backend, on vLLM's CPU build and SmolLM2-135M (converted).

One engine for the module, V1 multiprocessing off (the engine core in this process, so a test can read its
scheduler); `.ci/vllm-check` runs the module in its own venv. Skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB: vLLM's CPU default takes far more than 135M needs

import jsonschema  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import StructuredOutputsConfig  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import StructuredOutputsParams  # noqa: E402
from vllm.v1.structured_output.backend_types import StructuredOutputOptions  # noqa: E402
from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend  # noqa: E402

from structspec.integrations import vllm as backend  # noqa: E402
from structspec.models.shipped import model_path  # noqa: E402
from tests.conftest import _USER_CACHE, _set_cache  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "zip": {"type": "string", "pattern": "[0-9]{5}"}},
            "required": ["city"],
        },
        "tags": {"type": "array", "items": {"enum": ["new", "vip", "staff"]}, "maxItems": 3},
        "nickname": {"type": "string", "maxLength": 12},
    },
    "required": ["name", "age", "role", "address"],
}
ORDER = {
    "type": "object",
    "properties": {
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "pattern": "[A-Z]{3}-[0-9]{3}"},
                               "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
                "required": ["sku", "quantity"],
            },
            "minItems": 1, "maxItems": 2,
        },
        "express": {"type": "boolean"},
    },
    "required": ["items", "express"],
}
# Schemas whose language is the same under xgrammar and structspec (no arrays: structspec allows no whitespace
# before an array's comma, xgrammar does; strings from enums: their escapes and characters differ at the edges)
SAME_LANGUAGE = [
    {"type": "object", "properties": {"name": {"enum": ["Ada", "Grace", "Linus"]},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                      "admin": {"type": "boolean"}},
     "required": ["name", "age", "admin"]},
    {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                      "weather": {"type": "object",
                                                  "properties": {"sky": {"enum": ["clear", "cloudy"]},
                                                                 "celsius": {"type": "integer", "minimum": -40,
                                                                             "maximum": 50}},
                                                  "required": ["sky", "celsius"]}},
     "required": ["city", "weather"]},
]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"]}}},
]


@pytest.fixture(scope="module")
def llm(isolated_cache: str) -> Iterator[LLM]:
    """One engine under the structspec backend (SmolLM2-135M from the developer's structspec cache; its FSMs in
    the test session's cache)."""
    _set_cache(_USER_CACHE)
    try:
        model = model_path("smollm2-135m")
    finally:
        _set_cache(isolated_cache)
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    backend.register()  # (vLLM validates the config before it loads plugins in the process that builds the LLM)
    engine = LLM(model, enforce_eager=True, max_model_len=2048, seed=0,
                 structured_outputs_config={"backend": "structspec"})
    yield engine
    engine.llm_engine.engine_core.shutdown()  # its memory back before the next module starts an engine
    if before is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


def generate(llm: LLM, prompts: list[str], constraint: StructuredOutputsParams | list[StructuredOutputsParams],
             max_tokens: int = 120, logprobs: int | None = None) -> list[Any]:
    """Greedy completions, one per prompt (one batch: vLLM schedules them together)."""
    constraints = constraint if isinstance(constraint, list) else [constraint] * len(prompts)
    params = [SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=c, logprobs=logprobs)
              for c in constraints]
    return [out.outputs[0] for out in llm.generate(prompts, params, use_tqdm=False)]


def closed_keys(value: Any, schema: dict[str, Any]) -> bool:
    """Whether every object in ``value`` has only the members its schema lists (objects closed, as in xgrammar)."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return set(value) <= set(props) and all(closed_keys(v, props[k]) for k, v in value.items())
    if isinstance(value, list):
        return all(closed_keys(v, schema.get("items", {})) for v in value)
    return True


def test_json_schema_outputs_validate_and_objects_stay_closed(llm: LLM) -> None:
    prompts = ["A user record as JSON:", "Another user, Maria from Lisbon, as JSON:", "An order as JSON:"]
    schemas = [PERSON, PERSON, ORDER]
    outs = generate(llm, prompts, [StructuredOutputsParams(json=s) for s in schemas], max_tokens=200)
    for out, schema in zip(outs, schemas):
        assert out.finish_reason == "stop", out.text
        value = json.loads(out.text)
        jsonschema.validate(value, schema)
        assert closed_keys(value, schema), out.text


def test_regex_choice_and_json_object_outputs_match(llm: LLM) -> None:
    regex, choices = r"[0-9]{3}-[0-9]{4}", ["positive", "negative", "neutral"]
    outs = generate(llm, ["My phone number is", "The review 'great food!' is", "A config as JSON:"],
                    [StructuredOutputsParams(regex=regex), StructuredOutputsParams(choice=choices),
                     StructuredOutputsParams(json_object=True)], max_tokens=80)
    assert re.fullmatch(regex, outs[0].text), outs[0].text
    assert outs[1].text in choices
    assert outs[2].finish_reason == "stop" and isinstance(json.loads(outs[2].text), dict), outs[2].text


def test_tool_call_json_validates_against_the_called_tool(llm: LLM) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    tools = [ChatCompletionToolsParam.model_validate(t) for t in TOOLS]
    schema = get_json_schema_from_tools("required", tools)  # what vLLM compiles for tool_choice="required"
    out = generate(llm, ["Call a tool to get the weather in Oslo:"], StructuredOutputsParams(json=schema),
                   max_tokens=150)[0]
    assert out.finish_reason == "stop", out.text
    calls = json.loads(out.text)
    jsonschema.validate(calls, schema)
    parameters = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        assert set(call) == {"name", "parameters"}
        jsonschema.validate(call["parameters"], parameters[call["name"]])


@pytest.mark.parametrize("constraint, message", [
    (StructuredOutputsParams(json={"type": "strin"}), "did you mean \"string\""),
    (StructuredOutputsParams(json={"type": "integer", "multipleOf": 3}), "'multipleOf'"),
    (StructuredOutputsParams(grammar='root ::= "yes" | "no"'), "supports json (a JSON Schema), json_object"),
    (StructuredOutputsParams(regex="(ab"), "missing )"),
    (StructuredOutputsParams(regex="[0-9]+(?=px)"), "lookarounds"),
])
def test_unsupported_request_is_refused_alone_and_the_engine_serves_the_next(
    llm: LLM, constraint: StructuredOutputsParams, message: str,
) -> None:
    with pytest.raises(VLLMValidationError, match=re.escape(message)):
        generate(llm, ["x"], constraint, max_tokens=5)
    out = generate(llm, ["The answer is"], StructuredOutputsParams(choice=["yes", "no"]), max_tokens=5)[0]
    assert out.text in ("yes", "no")


def manager(llm: LLM) -> Any:
    """The engine's StructuredOutputManager (the engine core runs in this process)."""
    return llm.llm_engine.engine_core.engine_core.scheduler.structured_output_manager


def test_greedy_text_equals_xgrammar_on_the_same_engine(llm: LLM) -> None:
    prompts = ["A user as JSON:", "Today's weather report as JSON:", "Call me at"]
    constraints = [StructuredOutputsParams(json=s) for s in SAME_LANGUAGE]
    constraints.append(StructuredOutputsParams(regex=r"\+?[0-9]{2,3} [0-9]{3} [0-9]{4}"))
    ours = generate(llm, prompts, constraints, logprobs=5)
    structured = manager(llm)
    own = structured.backend
    assert isinstance(own, backend.StructspecBackend)
    structured.backend = XgrammarBackend(llm.llm_engine.vllm_config, tokenizer=structured.tokenizer,
                                         vocab_size=own.vocab_size)  # one backend per engine: swapped, then back
    try:
        theirs = generate(llm, prompts, constraints, logprobs=5)
    finally:
        structured.backend = own
    for prompt, a, b in zip(prompts, ours, theirs):
        assert a.token_ids == b.token_ids, first_difference(prompt, a, b)


def first_difference(prompt: str, ours: Any, theirs: Any) -> str:
    """Where two greedy outputs part, with the raw logit margin between the two tokens there (log-probs of
    the same context: the prefixes agree)."""
    i = next(i for i, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids)) if a != b) \
        if ours.token_ids[: len(theirs.token_ids)] != theirs.token_ids[: len(ours.token_ids)] \
        else min(len(ours.token_ids), len(theirs.token_ids))
    margin = "n/a"
    if i < len(ours.token_ids) and i < len(theirs.token_ids):
        ranked = ours.logprobs[i]
        a, b = ours.token_ids[i], theirs.token_ids[i]
        if a in ranked and b in ranked:
            margin = f"{ranked[a].logprob - ranked[b].logprob:.4f}"
    return (f"{prompt!r}: structspec {ours.text!r} vs xgrammar {theirs.text!r}, first differing token {i}, "
            f"logit margin (structspec's token minus xgrammar's) {margin}")


def test_fsm_is_compiled_once_per_schema_and_tokenizer(llm: LLM) -> None:
    own = manager(llm).backend
    spec = json.dumps(SAME_LANGUAGE[0])
    first = own.compile_grammar(StructuredOutputOptions.JSON, spec)
    again = own.compile_grammar(StructuredOutputOptions.JSON, spec)
    assert again.cursor.fsm.index is first.cursor.fsm.index  # the compiled token index, shared
    assert again.cursor.fsm.info.source == "memory"
    assert first.cursor is not again.cursor  # each request its own state


def test_grammar_contract_accepts_validates_rolls_back_and_terminates(llm: LLM) -> None:
    own = manager(llm).backend
    tokenizer = manager(llm).tokenizer
    grammar = own.compile_grammar(StructuredOutputOptions.CHOICE, json.dumps(["yes", "no"]), {tokenizer.eos_token_id})
    yes = tokenizer.encode("yes", add_special_tokens=False)
    assert grammar.validate_tokens([*yes, tokenizer.eos_token_id, *yes]) == [*yes, tokenizer.eos_token_id]
    assert not grammar.is_terminated()  # validate does not advance
    assert not grammar.accept_tokens("r", tokenizer.encode("maybe", add_special_tokens=False))
    assert grammar.accept_tokens("r", [*yes, tokenizer.eos_token_id])
    assert grammar.is_terminated()
    grammar.rollback(1)
    assert not grammar.is_terminated()
    bitmask = own.allocate_token_bitmask(2)
    grammar.fill_bitmask(bitmask, 1)
    allowed = [t for t in range(own.vocab_size) if bitmask[1, t // 32] >> (t % 32) & 1]
    assert allowed == [tokenizer.eos_token_id]
    grammar.reset()
    assert grammar.validate_tokens(yes) == yes


def test_an_engine_config_takes_structspec_with_disable_any_whitespace() -> None:
    from vllm.config import VllmConfig

    backend.register()
    config = VllmConfig(structured_outputs_config=StructuredOutputsConfig(backend="structspec",
                                                                         disable_any_whitespace=True))
    assert config.structured_outputs_config.backend == "structspec"
    assert config.structured_outputs_config.disable_any_whitespace


@pytest.mark.parametrize("disable_any_whitespace, spaced_ok", [(False, True), (True, False)])
def test_whitespace_follows_disable_any_whitespace(llm: LLM, disable_any_whitespace: bool, spaced_ok: bool) -> None:
    tokenizer = manager(llm).tokenizer
    config = SimpleNamespace(structured_outputs_config=StructuredOutputsConfig(
        backend="structspec", disable_any_whitespace=disable_any_whitespace))
    own = backend.StructspecBackend(config, tokenizer=tokenizer, vocab_size=manager(llm).backend.vocab_size)
    grammar = own.compile_grammar(StructuredOutputOptions.JSON, json.dumps(SAME_LANGUAGE[0]))
    spaced = tokenizer.encode('{ "name": "Ada", "age": 36, "admin": true }', add_special_tokens=False)
    compact = tokenizer.encode('{"name":"Ada","age":36,"admin":true}', add_special_tokens=False)
    assert grammar.validate_tokens(compact) == compact
    assert (grammar.validate_tokens(spaced) == spaced) is spaced_ok

