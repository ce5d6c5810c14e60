"""structspec's vLLM proposer (forced text, then prompt lookup) on vLLM's CPU build and SmolLM2-135M (converted).

One engine for the module, under the structspec backend with the proposer, V1 multiprocessing off (the engine
core and the model runner in this process, so a test can read the proposer and the scheduler). "Off" is the same
engine with the proposer's drafts emptied: every step then samples one token a row, as without speculation.
Skipped where vLLM is not installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

import jsonschema
import numpy as np
import pytest

# first: it skips this module where vLLM is not installed and sizes vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE)
from tests.integrations.test_vllm import ORDER, PERSON, TOOLS, generate  # isort: skip
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams

from structspec.errors import OptionError, StructspecError
from structspec.integrations import vllm as backend
from structspec.integrations.vllm_proposer import GrammarProposer, speculative_config
from structspec.models.shipped import model_path
from tests.conftest import _USER_CACHE

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

NEAR_TIE = 0.5
"""Log-probability gap under which two greedy tokens count as tied: a pass with a row's draft tokens in it rounds
bfloat16 logits differently on vLLM's CPU build (0.25 apart measured: an integer value 20 against 10)."""

# Long keys, enums: most of the output is text the grammar forces
ACCOUNT = {
    "type": "object",
    "properties": {
        "customer_full_name": {"type": "string", "maxLength": 24},
        "customer_account_status": {"enum": ["active_subscription", "suspended_for_nonpayment", "closed_by_user"]},
        "preferred_contact_channel": {"enum": ["electronic_mail", "telephone_call", "postal_mail"]},
        "number_of_open_support_tickets": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["customer_full_name", "customer_account_status", "preferred_contact_channel",
                 "number_of_open_support_tickets"],
}


def smollm2_dir() -> str:
    """SmolLM2-135M's converted directory in the developer's structspec cache (converted there on first use)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("STRUCTSPEC_CACHE", _USER_CACHE) if _USER_CACHE else patch.delenv("STRUCTSPEC_CACHE")
        return model_path("smollm2-135m")


@pytest.fixture(scope="module")
def llm(isolated_cache: str) -> Iterator[LLM]:
    """One engine under the structspec backend with structspec's proposer, the engine core in this process
    (SmolLM2-135M from the developer's structspec cache; its FSMs in the test session's cache)."""
    model = smollm2_dir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        backend.register()  # (vLLM validates the config before it loads plugins in the process that builds it)
        engine = LLM(model, enforce_eager=True, max_model_len=2048, seed=0, speculative_config=speculative_config(8),
                     structured_outputs_config={"backend": "structspec"})
        yield engine
        engine.llm_engine.engine_core.shutdown()  # its memory back before the next module starts an engine


def core(llm: LLM) -> Any:
    """The engine core (in this process)."""
    return llm.llm_engine.engine_core.engine_core


def proposer(llm: LLM) -> GrammarProposer:
    """The engine's proposer, as its model runner built it."""
    drafter = core(llm).model_executor.driver_worker.worker.model_runner.drafter
    assert isinstance(drafter, GrammarProposer)
    return drafter


@contextmanager
def drafts_off(llm: LLM) -> Iterator[list[int]]:
    """The proposer drafts nothing while inside; yields a list that gets one entry per engine step."""
    drafter, steps = proposer(llm), []

    def propose(sampled_token_ids: list[list[int]], *args: Any, **kwargs: Any) -> list[list[int]]:
        steps.append(len(sampled_token_ids))
        return [[] for _ in sampled_token_ids]

    drafter.propose = propose  # type: ignore[method-assign]
    try:
        yield steps
    finally:
        del drafter.propose  # the class's again


@contextmanager
def validations(llm: LLM) -> Iterator[list[tuple[list[int], list[int]]]]:
    """Records (draft, what vLLM's ``validate_tokens`` kept of it) for every constrained request's draft."""
    manager, seen = core(llm).scheduler.structured_output_manager, []
    validate = manager.validate_tokens

    def recording(request: Any, spec_tokens: list[int]) -> list[int]:
        kept = validate(request, spec_tokens)
        if request.use_structured_output:
            seen.append((list(spec_tokens), list(kept)))
        return kept

    manager.validate_tokens = recording
    try:
        yield seen
    finally:
        del manager.validate_tokens


def tool_call_schema() -> dict[str, Any]:
    """The JSON vLLM compiles for ``tool_choice="required"`` over `TOOLS`."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    return get_json_schema_from_tools("required", [ChatCompletionToolsParam.model_validate(t) for t in TOOLS])


@pytest.mark.parametrize("count", [0, -1, 2.5, True, "8"])
def test_speculative_config_refuses_a_draft_length_that_is_no_positive_int(count: Any) -> None:
    with pytest.raises(OptionError, match="num_speculative_tokens must be an int >= 1"):
        speculative_config(count)


def test_speculative_config_names_the_proposer_vllm_loads() -> None:
    assert speculative_config(4) == {"method": "custom_class", "num_speculative_tokens": 4,
                                     "model": "structspec.integrations.vllm_proposer.GrammarProposer"}
    assert speculative_config(prompt_lookup=False)["model"].endswith(".ForcedProposer")


def parting(on: Any, off: Any) -> str | None:
    """None where two greedy outputs (with and without drafts, log-probabilities kept) are the same tokens, or
    part where the two tokens are a near tie in the run without drafts (`NEAR_TIE`); else where and how they part.
    """
    if on.token_ids == off.token_ids:
        return None
    i = next((i for i, (a, b) in enumerate(zip(on.token_ids, off.token_ids)) if a != b), None)
    if i is None:
        return f"one output is a prefix of the other: {on.text!r} vs {off.text!r}"
    ranked = off.logprobs[i]
    a, b = on.token_ids[i], off.token_ids[i]
    if a in ranked and ranked[b].logprob - ranked[a].logprob <= NEAR_TIE:
        return None
    return f"token {i} differs: {on.text!r} with drafts vs {off.text!r} without, not at a near tie"


# Four requests where the grammar forces text: enums, nested objects, arrays, a tool call, long keys
PROMPTS = ["A user record as JSON:", "An order as JSON:", "Call a tool to get the weather in Oslo:",
           "The customer Ada Lovelace, two open tickets, as JSON:"]


@pytest.fixture(scope="module")
def drafted(llm: LLM) -> SimpleNamespace:
    """`PROMPTS` decoded greedily in one batch with the proposer's drafts (log-probabilities kept): ``schemas``,
    ``outputs``, the proposer's ``stats`` for the run and, per draft vLLM validated, ``seen`` (draft, kept)."""
    schemas = [PERSON, ORDER, tool_call_schema(), ACCOUNT]
    drafter = proposer(llm)
    drafter.reset_stats()
    with validations(llm) as seen:
        outputs = generate(llm, PROMPTS, [StructuredOutputsParams(json=s) for s in schemas], max_tokens=200,
                           logprobs=5)
    return SimpleNamespace(schemas=schemas, outputs=outputs, stats=drafter.stats, seen=seen)


def test_greedy_outputs_are_the_same_with_and_without_drafts(llm: LLM, drafted: SimpleNamespace) -> None:
    assert drafted.stats.forced_drafted > 0
    with drafts_off(llm):
        off = generate(llm, PROMPTS, [StructuredOutputsParams(json=s) for s in drafted.schemas], max_tokens=200,
                       logprobs=5)
    assert [parting(a, b) for a, b in zip(drafted.outputs, off)] == [None] * len(PROMPTS)
    for out, schema in zip(drafted.outputs, drafted.schemas):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)


def test_every_draft_passes_validate_tokens_whole(drafted: SimpleNamespace) -> None:
    assert sum(len(draft) for draft, _ in drafted.seen) > 0
    assert [draft for draft, kept in drafted.seen if kept != draft] == []


def test_forced_drafts_cut_the_engine_steps_per_output_token(llm: LLM) -> None:
    prompt, constraint = "The customer Ada Lovelace, two open tickets, as JSON:", StructuredOutputsParams(json=ACCOUNT)
    drafter = proposer(llm)
    drafter.reset_stats()
    on = generate(llm, [prompt], constraint, max_tokens=200, logprobs=5)[0]
    stats = drafter.stats
    with drafts_off(llm) as steps:
        off = generate(llm, [prompt], constraint, max_tokens=200, logprobs=5)[0]
    assert parting(on, off) is None
    assert len(steps) == len(off.token_ids)  # one step a token without drafts (the prefill's step samples the first)
    print(f"\n{stats.steps} engine steps for {len(on.token_ids)} output tokens with the proposer "
          f"({stats.steps / len(on.token_ids):.3f} a token; {stats.forced_drafted} forced and {stats.lookup_drafted} "
          f"lookup tokens drafted), {len(steps)} for {len(off.token_ids)} without")
    assert stats.forced_drafted > 0
    assert stats.steps < 0.7 * len(on.token_ids)


def test_a_request_without_a_grammar_gets_prompt_lookup_drafts_alone(llm: LLM) -> None:
    drafter = proposer(llm)
    drafter.reset_stats()
    prompt = "Repeat after me: one two three four five six seven. One two three four five six seven. One two"
    with validations(llm) as seen:
        out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)[0].outputs[0]
    assert out.token_ids
    assert seen == []  # (no grammar: vLLM validates nothing)
    assert drafter.stats.forced_drafted == 0 and drafter.stats.lookup_drafted > 0


def fake_runner(outputs: dict[str, tuple[list[int], StructuredOutputsParams | None]]) -> SimpleNamespace:
    """What the proposer reads of vLLM's model runner: the batch's request ids, each request's output tokens and
    sampling parameters (rows in the order given)."""
    requests = {req_id: SimpleNamespace(output_token_ids=tokens, sampling_params=SamplingParams(structured_outputs=c))
                for req_id, (tokens, c) in outputs.items()}
    return SimpleNamespace(input_batch=SimpleNamespace(req_ids=list(outputs)), requests=requests)


def test_each_row_drafts_from_its_own_request(llm: LLM) -> None:
    tokenizer = llm.get_tokenizer()
    own = GrammarProposer(llm.llm_engine.vllm_config)  # (beside the engine's: the same config, its own states)
    prompt = tokenizer.encode("Ada Lovelace is a customer of ours. Ada Lovelace", add_special_tokens=False)
    written = tokenizer.encode('{"customer_full_name": "Ada Lovelace", "cust', add_special_tokens=False)
    own.runner = fake_runner({"json": (written, StructuredOutputsParams(json=ACCOUNT)), "text": (prompt, None),
                              "prefill": ([], None)})
    rows = np.zeros((3, 2048), dtype=np.int32)
    rows[0, : len(written)], rows[1, : len(prompt)] = written, prompt
    drafts = own.propose([written[-1:], prompt[-1:], []], np.array([len(written), len(prompt), 0]), rows)
    assert tokenizer.decode(drafts[0]).startswith("omer_account_status")  # the one key left that starts "cust"
    assert tokenizer.decode(drafts[1]).startswith(" is a customer")  # prompt lookup alone, without a grammar
    assert drafts[2] == []  # (a prefill chunk samples nothing)
    # "json" leaves the batch; a new request under the same id is drafted from its own schema's start
    del own.runner.requests["json"]
    own.propose([[]], np.array([0]), rows[1:])
    note = {"type": "object", "properties": {"customer_note": {"type": "string"}}, "required": ["customer_note"]}
    again = tokenizer.encode('{"cust', add_special_tokens=False)
    own.runner = fake_runner({"json": (again, StructuredOutputsParams(json=note))})
    drafts = own.propose([again[-1:]], np.array([len(again)]), rows)
    assert tokenizer.decode(drafts[0]).startswith('omer_note":')


def test_propose_without_the_model_runner_names_the_fix(llm: LLM) -> None:
    own = GrammarProposer(llm.llm_engine.vllm_config)
    with pytest.raises(StructspecError, match="set VLLM_USE_V2_MODEL_RUNNER=0"):
        own.propose([[1]], np.array([1]), np.zeros((1, 8), dtype=np.int32))
