"""The engine-process run that test_vllm_processes.py and test_vllm_proposer_processes.py share (`.ci/vllm-check`
runs them in its own venv, with vLLM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

# The user's program, V1 multiprocessing on (vLLM's default): register() for the config this process validates;
# the engine core, a process vLLM starts, loads the backend through the ``vllm.general_plugins`` entry point
# (without it vLLM fails every structspec request), and its model runner builds the proposer, which drafts the
# grammar's forced text alone and keeps its grammar states there. vLLM's spec-decode counters (summed over the
# engine's processes) are read after the first request, so they count its drafts alone.
PROGRAM = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from structspec.integrations.vllm import register
from structspec.integrations.vllm_proposer import speculative_config

def generate(llm, prompt, schema, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, structured_outputs=StructuredOutputsParams(json=schema))
    out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    return {"text": out.text, "finish_reason": out.finish_reason, "tokens": len(out.token_ids)}

if __name__ == "__main__":
    register()
    llm = LLM(sys.argv[1], enforce_eager=True, max_model_len=2048, disable_log_stats=False,
              structured_outputs_config={"backend": "structspec"},
              speculative_config=speculative_config(8, prompt_lookup=False))
    results = {"drafted": generate(llm, sys.argv[2], sys.argv[3], 150)}
    names = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    results["drafted"]["counts"] = {m.name: m.value for m in llm.get_metrics() if m.name in names}
    results["plain"] = generate(llm, sys.argv[4], sys.argv[5], 60)
    open(sys.argv[6], "w").write(json.dumps(results))
"""

# (prompt, schema) of each request the program makes: the first where most of the output is forced text
# (test_vllm_proposer.ACCOUNT's long keys and enums), the second a short object
DRAFTED_PROMPT = "The customer Ada Lovelace, two open tickets, as JSON:"
PLAIN_PROMPT = "Today's weather as JSON:"
PLAIN_SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]},
                                                 "celsius": {"type": "integer", "minimum": -40, "maximum": 50}},
                "required": ["city", "celsius"]}


@pytest.fixture(scope="session")
def engine_process_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`PROGRAM`'s results on SmolLM2-135M (converted): ``"drafted"`` (text, finish_reason, tokens, counts) for
    `DRAFTED_PROMPT` under test_vllm_proposer.ACCOUNT, ``"plain"`` for `PLAIN_PROMPT` under `PLAIN_SCHEMA`. One
    engine run for the session (it takes minutes to start); the run's process is gone when it returns."""
    pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this in .venv-vllm")
    from tests.integrations.test_vllm_proposer import ACCOUNT, smollm2_dir

    folder = tmp_path_factory.mktemp("engine-process")
    (folder / "program.py").write_text(PROGRAM)
    result_file = folder / "result.json"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, folder / "program.py", smollm2_dir(), DRAFTED_PROMPT, json.dumps(ACCOUNT),
                           PLAIN_PROMPT, json.dumps(PLAIN_SCHEMA), result_file],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and result_file.exists(), done.stderr[-3000:]
    return json.loads(result_file.read_text())
