"""The shipped models end to end: load, prompt, compile, generate.

All tests here use real models (marked ``real_model``); each model's tests skip
when its package is not installed. CI installs only SmolLM2.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

import structspec
from structspec import LM
from structspec.models.protocol import Prompt
from tests.numerics import assert_logits_close

pytestmark = pytest.mark.real_model


class Person(BaseModel):
    name: str
    age: int
    city: str


TEXT = "Alice is 31 years old and lives in Paris."


def _extraction_prompt(lm: LM) -> Prompt:
    """A chat prompt where the model has a template (the instruct models), else plain text (Gemma 3 base)."""
    if lm.tokenizer.chat_template:
        return [{"role": "user", "content": f"Extract the person as JSON with keys name, age, city: {TEXT}"}]
    return f"Text: {TEXT}\nThe person as JSON with keys name, age, city: "


@pytest.mark.parametrize(("fixture", "eos"), [
    ("smollm2", "<|im_end|>"), ("qwen_coder", "<|im_end|>"), ("gemma3", "<eos>"),
])
def test_logits_and_eos_match_the_tokenizer(request: pytest.FixtureRequest, fixture: str, eos: str) -> None:
    lm: LM = request.getfixturevalue(fixture)
    assert lm.logits_width == len(lm.tokenizer) == len(lm.vocab)
    assert lm.vocab.eos_token_id == lm.tokenizer.convert_tokens_to_ids(eos)


def test_qwen_chat_prompt_is_chatml(qwen_coder: LM) -> None:
    ids = qwen_coder.encode_prompt([{"role": "user", "content": "hi"}])
    text = qwen_coder.tokenizer.decode(ids)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_gemma_is_the_base_model_and_takes_text_prompts(gemma3: LM) -> None:
    """The packaged GGUF is google/gemma-3-270m (not -it): no chat template; text prompts start with BOS."""
    with pytest.raises(structspec.PromptError, match="no chat template"):
        gemma3.encode_prompt([{"role": "user", "content": "hi"}])
    ids = gemma3.encode_prompt("hi")
    assert ids[0] == gemma3.tokenizer.bos_token_id and gemma3.tokenizer.decode(ids[1:]) == "hi"


def test_compiled_fsm_accepts_the_tokenizers_encoding(real_lm: LM) -> None:
    fsm = structspec.compile(Person, real_lm).fsm
    good = real_lm.tokenizer.encode('{"name":"Zoë","age":7,"city":"日本"}', add_special_tokens=False)
    bad = real_lm.tokenizer.encode('{"name":"Zoë","age":"7"}', add_special_tokens=False)
    states = fsm.walk(fsm.initial_state, good)
    assert len(states) == len(good) and fsm.is_complete(states[-1])
    assert len(fsm.walk(fsm.initial_state, bad)) < len(bad)


@pytest.mark.parametrize("fixture", ["qwen_coder", "gemma3"])
def test_extracts_a_person(request: pytest.FixtureRequest, fixture: str) -> None:
    lm: LM = request.getfixturevalue(fixture)
    result = structspec.generate_result(lm, Person, _extraction_prompt(lm), max_new_tokens=100)
    assert result.stop_reason == "fsm_complete"
    assert result.value == Person(name="Alice", age=31, city="Paris")


def test_gemma_cache_rolls_back_past_the_sliding_window(gemma3: LM) -> None:
    """Gemma 3's sliding-window layers (512 tokens) must still crop once the context is longer."""
    context = list(range(1000, 1600))
    expected = gemma3.forward([*context, 500, 501], gemma3.new_cache(), logits_to_keep=2)
    cache = gemma3.new_cache()
    gemma3.forward(context, cache)
    gemma3.forward([700, 701, 702], cache, logits_to_keep=3)  # three drafts, all rejected
    cache.crop_slots(len(context))
    assert_logits_close(gemma3.forward([500, 501], cache, logits_to_keep=2), expected)
