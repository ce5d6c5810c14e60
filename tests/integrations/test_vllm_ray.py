"""``structspec extract --engine vllm --ray local`` on vLLM's CPU build and SmolLM2-135M (converted), one engine
actor: killed with ``kill -9`` mid-job and rerun, each record is written exactly once, in the lines the local vLLM
job writes, under a manifest it resumes; the local Ray instance is gone after each run. The actors' keywords are
checked on the driver, before Ray starts.

Each run is the CLI in a subprocess, whose Ray instance (and engine) is torn down when it ends: one engine at a
time. `.ci/vllm-check` runs the module in its own venv, with Ray. Skipped where vLLM or Ray is not installed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")
pytest.importorskip("ray.data", reason="Ray is not installed here: .ci/vllm-check installs it in .venv-vllm")

import jsonschema  # noqa: E402

from structspec.jobs.errors import JobConfigError  # noqa: E402
from structspec.jobs.manifest import check_settings, job_manifest  # noqa: E402
from structspec.jobs.prompts import default_template  # noqa: E402
from structspec.jobs.vllm_ray import VLLMExtractor  # noqa: E402
from structspec.tools.command import EXIT_OK  # noqa: E402
from tests.integrations.test_ray import UNIQUE, _assert_torn_down, killed_after_lines  # noqa: E402
from tests.integrations.test_vllm_extract import BUDGET, PEOPLE, SCHEMA, model_dir  # noqa: E402, F401 (a fixture)

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


@pytest.mark.parametrize("keywords, message", [
    ({"max_tokens": 30}, "VLLMExtractor takes no keyword 'max_tokens': did you mean 'max_new_tokens'?"),
    ({"fast_forward": "off"}, "VLLMExtractor takes no keyword 'fast_forward'"),
    ({"template": "Extract the person."}, "has no {document} placeholder"),
    ({"top_p": 1.5}, "top_p"),
])
def test_keywords_are_checked_on_the_driver_before_ray_starts(keywords: dict, message: str) -> None:
    with pytest.raises(JobConfigError, match=re.escape(message)):
        VLLMExtractor.constructor_kwargs("smollm2-135m", SCHEMA, **keywords)
    with pytest.raises(JobConfigError, match=r"spec: unsupported schema keyword 'uniqueItems'"):
        VLLMExtractor.constructor_kwargs("smollm2-135m", UNIQUE)


def test_a_job_killed_and_rerun_on_one_engine_actor_writes_each_record_once(tmp_path: Path, model_dir: str) -> None:
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"p{i}", "text": t}) + "\n" for i, t in enumerate(PEOPLE[:4]))
                      + "{not json\n")
    output = tmp_path / "out.jsonl"
    arguments = ["extract", "--engine", "vllm", "--ray", "local", "--num-cpus", "2", "--schema",
                 str(tmp_path / "s.json"), "--input", str(source), "--output", str(output), "--model", model_dir,
                 "--batch-size", "1", "--max-new-tokens", str(BUDGET)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}  # as a user's shell has them
    env |= {"VLLM_CPU_KVCACHE_SPACE": "1", "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": str(300 * 2**20)}
    killed = subprocess.run([sys.executable, "-c", killed_after_lines("vllm_ray", 1), *arguments], env=env,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]  # no cleanup of the driver's own ran
    before = output.read_text()
    assert before.count("\n") == 1  # killed mid-job: after the first record's line
    _assert_torn_down(killed.stderr)

    done = subprocess.run([sys.executable, "-m", "structspec.tools", *arguments], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == EXIT_OK, done.stderr[-3000:]
    _assert_torn_down(done.stderr)
    assert "5 records: 3 extracted, 1 failed (malformed_input 1), 1 already done" in done.stderr
    text = output.read_text()
    assert text.startswith(before)  # what was written before the kill stays as it was
    rows = [json.loads(line) for line in text.splitlines()]
    assert Counter(row["id"] for row in rows) == Counter(["p0", "p1", "p2", "p3", "<line 5>"])  # each once
    for row in rows:  # the local vLLM job's lines
        if row["id"] == "<line 5>":
            assert row["error"]["kind"] == "malformed_input" and "stats" not in row
            continue
        assert list(row) == ["id", "input", "input_hash", "value", "stats"]
        jsonschema.validate(row["value"], SCHEMA)
        assert set(row["stats"]) == {"output_tokens", "prompt_tokens", "no_pass_tokens"}
    # `extract --engine vllm` on this machine takes the output as its own: it would resume it
    local = job_manifest(model_dir, SCHEMA, default_template(SCHEMA), {"max_new_tokens": BUDGET}, "vllm")
    assert check_settings(output, local) is False
