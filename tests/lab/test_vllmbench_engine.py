"""The engine benchmark end to end on vLLM's CPU build and SmolLM2-135M (converted): two extraction records
through vLLM + xgrammar, vLLM + structspec and the own loop, each in its worker process. Skipped where vLLM
is not installed (``.ci/vllm-check``'s venv has it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

from structspec.models.shipped import model_path  # noqa: E402
from tests.conftest import _USER_CACHE, _set_cache  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]


def test_two_records_give_a_table_with_steps_counted_and_each_invalid_output_named(isolated_cache: str) -> None:
    _set_cache(_USER_CACHE)
    try:
        model = model_path("smollm2-135m")
    finally:
        _set_cache(isolated_cache)
    command = [sys.executable, "-m", "lab.vllmbench", "--model", model, "--records", "2",
               "--batch-size", "2", "--tasks", "extraction", "--configs", "xgrammar,structspec,own",
               "--max-new-tokens", "200", "--compact"]
    done = subprocess.run(command, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {cells[0]: cells for line in done.stdout.splitlines()
            if (cells := [c.strip() for c in line.strip("|").split("|")])[0] in (
                "vLLM + xgrammar", "vLLM + structspec", "structspec own loop")}
    assert set(rows) == {"vLLM + xgrammar", "vLLM + structspec", "structspec own loop"}, done.stdout
    invalid = 0
    for label, cells in rows.items():
        for valid in cells[-2:]:  # at B=1 and batched
            count, records = map(int, valid.split("/"))
            assert records == 2 and 0 <= count <= 2, (label, cells)
            invalid += records - count
        steps = float(cells[5])
        assert 0 < steps <= 1.1, (label, cells)  # no speculation in vLLM here: about one step a token
    named = re.findall(r"^    - invalid at B=[12]: (?:[a-z]+-[0-9]+) \(stopped: ", done.stdout, re.MULTILINE)
    assert len(named) == invalid, done.stdout  # each invalid output named, with why it stopped
    assert rows["vLLM + xgrammar"][2] == "×1.00"
    assert float(rows["structspec own loop"][5]) < float(rows["vLLM + xgrammar"][5])  # forced tokens cost no pass
    assert re.search(r"load average before: [0-9.]+ [0-9.]+ [0-9.]+", done.stdout)
    assert "dtype bfloat16" in done.stdout or "dtype float32" in done.stdout
