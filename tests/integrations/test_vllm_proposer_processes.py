"""structspec's proposer in vLLM's own processes (V1 multiprocessing on, vLLM's default): the model runner, which
builds the proposer, runs in the engine core's process, apart from the program; the proposer keeps its grammar
states there. The engine-process run (tests/integrations/conftest.py), with the proposer that drafts forced text
alone, is the one test_vllm_processes.py reads. Skipped where vLLM is not installed."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

from tests.integrations.test_vllm_proposer import ACCOUNT  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_proposer_drafts_forced_text_in_the_engine_process(engine_process_run: dict[str, Any]) -> None:
    result = engine_process_run["drafted"]
    assert result["finish_reason"] == "stop", result
    jsonschema.validate(json.loads(result["text"]), ACCOUNT)
    counts = result["counts"]  # vLLM's spec-decode counters after this request alone
    assert counts["vllm:spec_decode_num_draft_tokens"] > 0, counts
    assert 0 < counts["vllm:spec_decode_num_accepted_tokens"] < result["tokens"], counts
