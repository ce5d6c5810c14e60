"""The structspec backend in vLLM's own engine process (V1 multiprocessing on, vLLM's default), where only the
``vllm.general_plugins`` entry point can have registered it. Skipped where vLLM is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

from structspec.models.shipped import model_path  # noqa: E402
from tests.conftest import _USER_CACHE, _set_cache  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                           "celsius": {"type": "integer", "minimum": -40, "maximum": 50}},
          "required": ["city", "celsius"]}

# The user's program: register() for the config this process validates; the engine core, a process vLLM
# starts, loads the backend through the entry point (without it vLLM fails every structspec request).
PROGRAM = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from structspec.integrations.vllm import register

if __name__ == "__main__":
    register()
    llm = LLM(sys.argv[1], enforce_eager=True, max_model_len=2048, structured_outputs_config={"backend": "structspec"})
    params = SamplingParams(temperature=0, max_tokens=60, structured_outputs=StructuredOutputsParams(json=sys.argv[2]))
    out = llm.generate(["Today's weather as JSON:"], params, use_tqdm=False)[0].outputs[0]
    print("RESULT", json.dumps({"text": out.text, "finish_reason": out.finish_reason}))
"""


def test_engine_process_loads_the_backend_through_the_entry_point(isolated_cache: str, tmp_path) -> None:
    _set_cache(_USER_CACHE)
    try:
        model = model_path("smollm2-135m")
    finally:
        _set_cache(isolated_cache)
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, str(script), model, json.dumps(SCHEMA)], env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["finish_reason"] == "stop", result
    value = json.loads(result["text"])
    assert set(value) == {"city", "celsius"} and value["city"] in ("Paris", "Oslo", "Lima")
    assert -40 <= value["celsius"] <= 50
