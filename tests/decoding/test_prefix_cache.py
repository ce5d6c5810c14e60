"""Prefix KV reuse (`structspec.models.prefix_cache`): prompts prefilled on the chunk grid, whole chunks reused
across calls, outputs token-identical with and without reuse, hits counted exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch
from pydantic import BaseModel

import structspec
from structspec.errors import ModelNotFoundError
from structspec.events import chat_prompt_ids
from structspec.result import TextChunk
from structspec.models.prefix_cache import CHUNK, prefill_prompt, prefix_cache
from structspec.testing import save_tiny_model, tiny_lm


class Ticket(BaseModel):
    title: str
    priority: int
    tags: list[str]


INSTRUCTION = ("You extract support tickets as JSON with a title, a priority from 1 to 5 and a list of tags. "
               "Keep the title short and the tags lower case. ") * 4
# ChatML that shows the tools and writes out an assistant's calls, as Qwen's template does: a conversation's next
# prompt holds each earlier call and its result
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n"
    "{% endif %}Tools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<eos>\n{% endif %}"
    "{% for m in messages %}{% if not (tools and loop.first and m['role'] == 'system') %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}{% for call in m.get('tool_calls', []) %}"
    "<tool_call>\n{{ call['function'] | tojson }}\n</tool_call>{% endfor %}<eos>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
Room = Literal["kitchen", "hall", "study"]


def set_light(room: Room, on: bool) -> str:
    """Switch the light of a room."""
    raise AssertionError("not called: the conversation answers with RESULTS")


def set_heating(room: Room, level: Literal["off", "low", "high"]) -> str:
    """Set the heating of a room."""
    raise AssertionError("not called: the conversation answers with RESULTS")


RESULTS = {"set_light": "done: the light is switched", "set_heating": {"ok": True, "temperature_c": 21}}


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16, "loaded"])
def grid_lm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> structspec.LM:
    """A tiny batch-invariant model, which prefills on the chunk grid: made so in float32 and bfloat16 on torch's
    kernels, or saved and loaded by `structspec.load` (its kernels and default dtype on this CPU); its chat
    template is `TOOL_TEMPLATE`."""
    if request.param == "loaded":
        lm = structspec.load(str(save_tiny_model(tmp_path_factory.mktemp("tiny"))))
    else:
        lm = tiny_lm(dtype=request.param, batch_invariant=True)
    lm.tokenizer.chat_template = TOOL_TEMPLATE
    return lm


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def smollm2_in(request: pytest.FixtureRequest, isolated_cache: str) -> structspec.LM:
    """SmolLM2-135M in float32 (the suite's `smollm2`) and in bfloat16 (`load`'s default on a CPU with AVX-512
    BF16), from the developer's cache; skips where it is not installed."""
    if request.param == "float32":
        return request.getfixturevalue("smollm2")
    from tests import conftest

    conftest._set_cache(conftest._USER_CACHE)
    try:
        return structspec.load("smollm2-135m", dtype="bfloat16")
    except ModelNotFoundError as e:
        pytest.skip(f"smollm2-135m is not available: {e}")
    finally:
        conftest._set_cache(isolated_cache)


def _held(prompts: list[list[int]], ids: list[int]) -> int:
    """The tokens of ``ids``' prefill (all but its last) that earlier prompts' prefills left in whole chunks."""
    best = 0
    for earlier in prompts:
        n = 0
        for a, b in zip(ids[:-1], earlier[:-1]):
            if a != b:
                break
            n += 1
        best = max(best, min(n, len(earlier) - 1) // CHUNK * CHUNK)
    return best


def _run(lm: structspec.LM, prompt: str, reuse: bool, **options: object) -> structspec.Result:
    lm.prefix_cache.max_bytes = 2**28 if reuse else 0
    return structspec.generate_result(lm, Ticket, prompt, max_new_tokens=24, **options)


def test_a_prefill_from_held_chunks_is_the_cold_prefill_bit_for_bit(grid_lm) -> None:
    ids = grid_lm.encode_prompt(INSTRUCTION + "Ticket: the printer is on fire.")
    assert len(ids) > 2 * CHUNK
    store = prefix_cache(grid_lm)
    store.clear()
    store.max_bytes = 2**28
    cold, warm = grid_lm.new_cache(), grid_lm.new_cache()
    assert prefill_prompt(grid_lm, ids, cold) == 0
    assert prefill_prompt(grid_lm, ids, warm) == len(ids) // CHUNK * CHUNK
    for a, b in zip(cold.layers, warm.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def _check_documents(lm: structspec.LM, documents: list[str]) -> None:
    """One prompt template over ``documents``: each output with reuse is the output without, each call reuses
    exactly the whole chunks the calls before it left, and every call after the first reuses some."""
    prompts = [f"{INSTRUCTION}Ticket: {document}\nJSON:" for document in documents]
    alone = [_run(lm, prompt, reuse=False) for prompt in prompts]  # (a bound of 0 holds nothing)
    assert all(result.stats.prefix_tokens_reused == 0 for result in alone)
    seen: list[list[int]] = []
    for prompt, off in zip(prompts, alone):
        ids = lm.encode_prompt(prompt)
        on = _run(lm, prompt, reuse=True)
        assert on.token_ids == off.token_ids
        assert on.stats.prefix_tokens_reused == _held(seen, ids)
        seen.append(ids)
    assert min(_held(seen[:i], ids) for i, ids in enumerate(seen) if i) >= CHUNK


def test_outputs_with_and_without_reuse_are_identical_and_hits_counted(grid_lm) -> None:
    _check_documents(grid_lm, ["the printer is on fire", "my password expired again", "the VPN drops every hour"])


def test_a_batch_with_reuse_is_every_row_decoded_alone_without(grid_lm) -> None:
    prompts = [f"{INSTRUCTION}Ticket: {document}\nJSON:" for document in ["the printer is on fire", "my password",
                                                                          "the VPN drops every hour", "no sound"]]
    alone = [_run(grid_lm, prompt, reuse=False) for prompt in prompts]
    grid_lm.prefix_cache.max_bytes = 2**28
    batch = structspec.generate_batch(grid_lm, Ticket, prompts, batch_size=2, max_new_tokens=24)
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
    seen = [grid_lm.encode_prompt(prompt) for prompt in prompts]
    # rows are prefilled in order as slots free up: each reuses what the rows before it left
    assert [r.stats.prefix_tokens_reused for r in batch] == [_held(seen[:i], ids) for i, ids in enumerate(seen)]
    assert batch[-1].stats.prefix_tokens_reused >= CHUNK


def test_a_stream_with_reuse_yields_the_output_without(grid_lm) -> None:
    prompt = f"{INSTRUCTION}Ticket: the stream test\nJSON:"
    prefix_cache(grid_lm).max_bytes = 0
    alone = structspec.generate_result(grid_lm, Ticket, prompt, max_new_tokens=24)
    prefix_cache(grid_lm).max_bytes = 2**28
    structspec.generate_result(grid_lm, Ticket, prompt, max_new_tokens=24)  # holds the prompt's chunks
    chunks = [c for c in structspec.stream(grid_lm, Ticket, prompt, max_new_tokens=24) if isinstance(c, TextChunk)]
    assert [t for chunk in chunks for t in chunk.token_ids] == alone.token_ids
    assert "".join(chunk.text for chunk in chunks) == alone.text


def test_a_three_turn_conversation_reuses_each_earlier_turn(grid_lm) -> None:
    turns = ["Ticket: the printer is on fire.", "Tool result: printer 7 unplugged.", "Tool result: fire out."]
    outputs: dict[bool, list[list[int]]] = {}
    for reuse in (False, True):
        prefix_cache(grid_lm).clear()
        prompt, seen, outputs[reuse] = INSTRUCTION, [], []
        for turn in turns:
            prompt += f"{turn}\nJSON:"
            result = _run(grid_lm, prompt, reuse)
            ids = grid_lm.encode_prompt(prompt)
            assert result.stats.prefix_tokens_reused == (_held(seen, ids) if reuse else 0)
            seen.append(ids)
            outputs[reuse].append(result.token_ids)
            prompt += result.text + "\n"
    assert outputs[True] == outputs[False]
    assert _held(seen[:2], seen[2]) > _held(seen[:1], seen[1]) > 0  # each turn reused more


def test_a_prompt_sharing_part_of_a_chunk_reuses_only_the_whole_chunks_before_it(grid_lm) -> None:
    prefix_cache(grid_lm).clear()
    first = f"{INSTRUCTION}Ticket: the printer is on fire.\nJSON:"
    ids = grid_lm.encode_prompt(first)
    # change one character inside the second chunk: the first chunk is shared, the second only in part
    cut = len(grid_lm.tokenizer.decode(ids[:CHUNK + 10]))
    second = first[:cut] + ("X" if first[cut] != "X" else "Y") + first[cut + 1:]
    other = grid_lm.encode_prompt(second)
    assert other[:CHUNK] == ids[:CHUNK] and other[:2 * CHUNK] != ids[:2 * CHUNK]
    off = _run(grid_lm, second, reuse=False)
    _run(grid_lm, first, reuse=True)
    on = _run(grid_lm, second, reuse=True)
    assert on.stats.prefix_tokens_reused == CHUNK
    assert on.token_ids == off.token_ids


def test_a_small_bound_evicts_the_least_recently_used_chunks(grid_lm) -> None:
    store = prefix_cache(grid_lm)
    store.clear()
    prompt = f"{INSTRUCTION * 2}Ticket: eviction\nJSON:"
    ids = grid_lm.encode_prompt(prompt)
    chunks = (len(ids) - 1) // CHUNK
    assert chunks >= 3
    store.max_bytes = 2**28
    prefill_prompt(grid_lm, ids[:-1], grid_lm.new_cache())
    one = store.bytes // chunks
    store.clear()
    store.max_bytes = 2 * one  # room for two chunks: the first ones go as later ones come
    prefill_prompt(grid_lm, ids[:-1], grid_lm.new_cache())
    assert len(store) == 2 and store.bytes <= store.max_bytes
    again = structspec.generate_result(grid_lm, Ticket, prompt, max_new_tokens=24)
    assert again.stats.prefix_tokens_reused == 0  # the first chunk was evicted: nothing leads
    store.max_bytes = 0
    assert len(store) == 0 and store.bytes == 0
    assert structspec.generate_result(grid_lm, Ticket, prompt, max_new_tokens=24).token_ids == again.token_ids


def test_a_negative_bound_is_an_option_error() -> None:
    lm = tiny_lm(batch_invariant=True)
    with pytest.raises(structspec.OptionError, match="max_bytes must be an int ≥ 0"):
        prefix_cache(lm).max_bytes = -1


def test_a_batch_of_mixed_specs_with_reuse_is_each_row_decoded_alone_without(grid_lm) -> None:
    specs = [Ticket, structspec.Regex(r"(low|high) priority: [a-z ]{1,20}\."),
             structspec.ToolCalls([set_light, set_heating], choice="required"), Ticket]
    prompts = [f"{INSTRUCTION}Ticket: {document}\nJSON:" for document in ["the printer is on fire", "my password",
                                                                          "the hall is dark", "no sound"]]
    grid_lm.prefix_cache.max_bytes = 0
    alone = [structspec.generate_result(grid_lm, spec, prompt, max_new_tokens=24)
             for spec, prompt in zip(specs, prompts)]
    grid_lm.prefix_cache.max_bytes = 2**28
    batch = structspec.generate_batch(grid_lm, specs, prompts, batch_size=2, max_new_tokens=24)
    assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
    seen = [grid_lm.encode_prompt(prompt) for prompt in prompts]  # (a str prompt carries no tools)
    assert [r.stats.prefix_tokens_reused for r in batch] == [_held(seen[:i], ids) for i, ids in enumerate(seen)]
    assert batch[-1].stats.prefix_tokens_reused >= CHUNK


def _converse(lm: structspec.LM, reuse: bool) -> tuple[list[list[int]], list[list[int]], list[int]]:
    """Three tool-call turns from an empty prefix cache, each prompt the one before it, the assistant's call and the
    tool's result (`RESULTS`): each turn's output ids, prompt ids and reused prompt tokens."""
    prefix_cache(lm).clear()
    lm.prefix_cache.max_bytes = 2**28 if reuse else 0
    spec = structspec.ToolCalls([set_light, set_heating], choice="required")
    messages = [{"role": "system", "content": INSTRUCTION},
                {"role": "user", "content": "Make the study warm and switch the hall light off."}]
    outputs, prompts, reused = [], [], []
    for _ in range(3):
        result = structspec.generate_result(lm, spec, messages, max_new_tokens=160)
        assert result.complete, result.stop_reason  # else the conversation has no next turn
        outputs.append(result.token_ids)
        prompts.append(chat_prompt_ids(lm, messages, spec.chat_tools()))
        reused.append(result.stats.prefix_tokens_reused)
        turn = result.value
        messages = [*messages, turn.assistant_message(), *turn.tool_messages([RESULTS[c.name] for c in turn.calls])]
    return outputs, prompts, reused


def _check_conversation(lm: structspec.LM) -> None:
    """A three-turn tool-call conversation: the same calls with and without reuse, and each turn reuses exactly
    the whole chunks of the prompts before it."""
    off, prompts, none = _converse(lm, reuse=False)
    on, same_prompts, reused = _converse(lm, reuse=True)
    assert on == off and same_prompts == prompts and none == [0, 0, 0]
    assert all(later[:len(earlier)] == earlier for earlier, later in zip(prompts, prompts[1:]))  # each extends
    assert reused == [_held(prompts[:i], ids) for i, ids in enumerate(prompts)]
    assert reused[0] == 0 and reused[2] >= reused[1] >= CHUNK


@pytest.mark.slow  # 3 to 6 s a case on the shared 2-core machine
def test_a_three_turn_tool_call_conversation_reuses_each_earlier_prompt(grid_lm) -> None:
    _check_conversation(grid_lm)


@pytest.mark.slow  # 3 s on the shared 2-core machine: the actor loads its model
def test_a_ray_actor_reuses_the_template_across_its_records(tmp_path: Path) -> None:
    pytest.importorskip("ray.data")  # the optional extra; the Extractor runs here without a cluster
    from structspec.jobs.prompts import build_prompt
    from structspec.jobs.ray import Extractor

    schema = {"type": "object", "properties": {"flag": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
              "required": ["flag", "size"], "additionalProperties": False}
    template = INSTRUCTION + "Ticket: {document}\nJSON:"
    extractor = Extractor(str(save_tiny_model(tmp_path / "model")), schema, device="cpu", template=template,
                          batch_size=2, max_new_tokens=24)
    texts = ["the printer is on fire", "my password", "the VPN drops every hour", "no sound"]
    reused = []
    for call in (texts[:2], texts[2:]):  # two of the actor's calls, as Ray makes them: one model between them
        columns = extractor({"id": np.array([f"t-{text}" for text in call]), "text": np.array(call)})
        reused += [stats["prefix_tokens_reused"] for stats in columns["stats"]]
    seen = [extractor.lm.encode_prompt(build_prompt(extractor.lm, template, text)) for text in texts]
    assert reused == [_held(seen[:i], ids) for i, ids in enumerate(seen)]
    assert min(reused[1:]) >= CHUNK


@pytest.mark.real_model
def test_smollm2_reuse_is_token_identical(smollm2_in) -> None:
    _check_documents(smollm2_in, ["the printer is on fire", "my password expired again"])


@pytest.mark.real_model
def test_smollm2_conversation_reuse_is_token_identical(smollm2_in) -> None:
    _check_conversation(smollm2_in)
