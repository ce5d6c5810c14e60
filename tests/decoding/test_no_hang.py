"""The decodes issue 48 reported as possible hangs, under a watchdog: on the tiny bfloat16 batch-invariant model
(what `load` makes on a CPU with native bfloat16), a batch of a required tool call, a budgeted reasoning and a
budgeted text, and a parallel tool-call row drafted by prompt lookup without fast-forward.

Both were slow, not stuck: the loop gains at least one output token per verify pass at a steady rate, and the
reported minutes were a loaded machine's (two threads spinning at each barrier while another process held a
core). A hang fails here by ``pytest.mark.timeout`` instead of stalling CI, and a pass that gains nothing fails
the progress check.
"""

from __future__ import annotations

from typing import Literal

import pytest
import torch

import structspec
from structspec import Reasoning, Regex, Result, Sequence, Text, ToolCalls
from structspec.testing import tiny_lm

MAX_NEW = 24  # enough for each row to reach its tool call, answer or budget; a hang shows at any length
WATCHDOG = 300  # seconds per test: minutes above what either takes on a busy shared 2-core machine


def get_weather(city: str, unit: Literal["C", "F"] = "C") -> None:
    """The weather in ``city``."""


@pytest.fixture(scope="module")
def bf16_lm() -> structspec.LM:
    return tiny_lm(dtype=torch.bfloat16, batch_invariant=True)


def assert_progress(result: Result, max_new_tokens: int) -> None:
    """``result`` stopped for a reason of its own, and each of its passes but the prompt's gained a token."""
    assert result.stop_reason in ("eos", "fsm_complete", "max_new_tokens"), (result.stop_reason, result.error)
    assert len(result.token_ids) <= max_new_tokens
    verify_passes = result.stats.target_forward_passes - result.stats.prefill_passes
    assert verify_passes <= len(result.token_ids) + 1, result.stats  # + 1: the pass that chose EOS, not output


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG)
@pytest.mark.parametrize("prompt", ["Weather in Paris?", "x", [{"role": "user", "content": "Think, then answer."}]])
def test_a_batch_of_tool_call_reasoning_and_budgeted_text_rows_finishes(bf16_lm: structspec.LM, prompt) -> None:
    specs = [ToolCalls([get_weather], choice="required"),
             Reasoning(Regex("[a-z ]+"), max_thinking_tokens=3),
             Sequence(Text(stop=("\n",), max_tokens=4), Regex("[0-9]{2}"))]
    results = structspec.generate_batch(bf16_lm, specs, [prompt] * 3, batch_size=3, max_new_tokens=MAX_NEW)
    for result in results:
        assert_progress(result, MAX_NEW)


@pytest.mark.timeout(WATCHDOG)
@pytest.mark.parametrize("prompt", ["Weather in Paris?", "<tool_call>\n{\"name\": \"get_weather\""])
def test_a_parallel_tool_call_row_drafted_without_fast_forward_finishes(bf16_lm: structspec.LM, prompt: str) -> None:
    spec = ToolCalls([get_weather], choice="auto", parallel=True)
    result = structspec.generate_result(bf16_lm, spec, prompt, draft="prompt_lookup", fast_forward="off",
                                        max_new_tokens=MAX_NEW)
    assert_progress(result, MAX_NEW)
    assert result.stats.forced_tokens == 0  # fast-forward off: every token came from a pass
