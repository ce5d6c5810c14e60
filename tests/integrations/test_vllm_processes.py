"""The structspec backend in vLLM's own engine process (V1 multiprocessing on, vLLM's default), where only the
``vllm.general_plugins`` entry point can have registered it: the engine-process run (tests/integrations/conftest.py)
that test_vllm_proposer_processes.py reads too. Skipped where vLLM is not installed."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_engine_process_loads_the_backend_through_the_entry_point(engine_process_run: dict[str, Any]) -> None:
    result = engine_process_run["plain"]
    assert result["finish_reason"] == "stop", result
    value = json.loads(result["text"])
    assert set(value) == {"city", "celsius"} and value["city"] in ("Paris", "Oslo", "Lima")
    assert -40 <= value["celsius"] <= 50
