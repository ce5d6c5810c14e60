"""structspec's proposer in vLLM's own processes (V1 multiprocessing on, vLLM's default): the model runner, which
builds the proposer, runs in the engine core's process, apart from the program; the proposer keeps its grammar
states there. Skipped where vLLM is not installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

from tests.integrations.test_vllm_proposer import ACCOUNT, smollm2_dir  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

# The user's program, with the proposer that drafts forced text alone; vLLM's spec-decode counters (summed over the
# engine's processes) say what was drafted and kept
PROGRAM = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from structspec.integrations.vllm import register
from structspec.integrations.vllm_proposer import speculative_config

if __name__ == "__main__":
    register()
    llm = LLM(sys.argv[1], enforce_eager=True, max_model_len=2048, disable_log_stats=False,
              structured_outputs_config={"backend": "structspec"},
              speculative_config=speculative_config(8, prompt_lookup=False))
    schema = StructuredOutputsParams(json=sys.argv[2])
    params = SamplingParams(temperature=0, max_tokens=150, structured_outputs=schema)
    out = llm.generate(["The customer Ada Lovelace, two open tickets, as JSON:"], params, use_tqdm=False)[0].outputs[0]
    names = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    counts = {m.name: m.value for m in llm.get_metrics() if m.name in names}
    result = {"text": out.text, "finish_reason": out.finish_reason, "tokens": len(out.token_ids), "counts": counts}
    open(sys.argv[3], "w").write(json.dumps(result))
"""


def test_proposer_drafts_forced_text_in_the_engine_process(tmp_path: Path) -> None:
    model = smollm2_dir()
    (tmp_path / "program.py").write_text(PROGRAM)
    result_file = tmp_path / "result.json"
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    done = subprocess.run([sys.executable, tmp_path / "program.py", model, json.dumps(ACCOUNT), result_file],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0 and result_file.exists(), done.stderr[-3000:]
    result = json.loads(result_file.read_text())
    assert result["finish_reason"] == "stop", result
    jsonschema.validate(json.loads(result["text"]), ACCOUNT)
    counts = result["counts"]
    assert counts["vllm:spec_decode_num_draft_tokens"] > 0, counts
    assert 0 < counts["vllm:spec_decode_num_accepted_tokens"] < result["tokens"], counts
