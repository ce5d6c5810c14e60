"""Where `load` finds models (shipped names, directories, hub ids in the Hugging Face cache), what it says when it
cannot, the cached conversion's config, and the thread count it leaves torch with."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import structspec
from structspec.errors import ModelNotFoundError, OptionError
from structspec.models import device, loading, shipped
from structspec.testing import save_tiny_model, tiny_lm

REPO = "TinyOrg/tiny-llama"


def fake_hub_cache(root: Path, repo_id: str = REPO, revision: str = "0123abcd") -> Path:
    """A Hugging Face hub cache under ``root`` holding `save_tiny_model`'s model as ``repo_id``'s main revision,
    laid out as huggingface_hub lays it out (``models--ORG--NAME/refs/main`` → ``snapshots/<revision>``)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    save_tiny_model(repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return root


@pytest.fixture
def torch_threads() -> Iterator[None]:
    """Put torch's thread count back after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record (instead of doing) every model-directory lookup `load` makes: empty if it raised before."""
    looked: list[str] = []
    monkeypatch.setattr(loading, "model_path", lambda name, verbose=False: looked.append(name) or name)
    return looked


@pytest.mark.dtype
def test_hub_id_loads_from_the_local_cache_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(fake_hub_cache(tmp_path / "hub")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # a network call would fail, not hang
    lm = structspec.load(REPO, device="cpu", kernels="torch")
    assert lm.name == REPO
    assert lm.dtype == device.default_dtype(torch.device("cpu"))  # bfloat16 on AVX-512 BF16 CPUs, else float32
    expected = tiny_lm("byte_level")  # the very weights save_tiny_model wrote
    ids = lm.encode_prompt("{\"a\": 1}")
    assert ids == expected.encode_prompt("{\"a\": 1}")
    # The weights, not a forward pass: from_pretrained in bfloat16 keeps buffers (RoPE's) that a cast would round.
    loaded, written = lm.model.state_dict(), expected.model.state_dict()
    assert loaded.keys() == written.keys()
    for name, weight in written.items():
        torch.testing.assert_close(loaded[name], weight.to(loaded[name].dtype), rtol=0, atol=0, msg=name)


@pytest.mark.dtype
def test_a_hub_id_not_in_the_cache_names_the_id_the_cache_and_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ModelNotFoundError) as e:
        structspec.load("HuggingFaceTB/SmolLM2-135M-Instruct")
    message = str(e.value)
    assert "'HuggingFaceTB/SmolLM2-135M-Instruct'" in message
    assert str(tmp_path / "hf" / "hub") in message
    assert "hf download HuggingFaceTB/SmolLM2-135M-Instruct" in message
    assert message.endswith(f"or pass a local model directory or a shipped model ({', '.join(shipped.SHIPPED)})")


@pytest.mark.dtype
def test_a_hub_cache_without_the_main_revision_is_not_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = fake_hub_cache(tmp_path / "hub")
    (cache / f"models--{REPO.replace('/', '--')}" / "refs" / "main").unlink()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(ModelNotFoundError, match="is not in the Hugging Face cache at"):
        structspec.load(REPO)


@pytest.mark.dtype
@pytest.mark.parametrize(("name", "meant"), [
    ("smollm2-135", "smollm2-135m"), ("Qwen2.5-Coder-0.5B", "qwen2.5-coder-0.5b"), ("gemma-3-270m", "gemma3-270m"),
    ("TinyOrg/tiny-lama", REPO), ("mistral", None),
])
def test_misspelt_names_get_a_did_you_mean(
    name: str, meant: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(fake_hub_cache(tmp_path / "hub")))
    with pytest.raises(ModelNotFoundError) as e:
        structspec.load(name)
    if meant is None:  # too far from every name: the general message, with the forms a name takes
        assert "use one of smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m, a local model directory" in str(e.value)
    else:
        assert f"did you mean {meant!r}?" in str(e.value)


def test_a_cached_conversion_loses_its_quantization_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shipped model cached before this fix kept transformers' ``quantization_config`` (GGUF): it still loads,
    and its config is rewritten without it, so later loads say nothing about GGUF."""
    monkeypatch.setenv("STRUCTSPEC_CACHE", str(tmp_path))
    converted = save_tiny_model(tmp_path / "models" / "smollm2-135m")
    config = json.loads((converted / "config.json").read_text())
    config["quantization_config"] = {"dequantize": False, "gguf_file": "x.gguf", "quant_method": "gguf"}
    (converted / "config.json").write_text(json.dumps(config))
    lm = structspec.load("smollm2-135m", device="cpu", kernels="torch")
    assert not hasattr(lm.model.config, "quantization_config")
    rewritten = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in rewritten
    assert rewritten == {k: v for k, v in config.items() if k != "quantization_config"}


def test_a_local_directory_wins_over_the_hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    save_tiny_model(tmp_path / REPO)  # a directory named like a hub id, relative to the working directory
    monkeypatch.chdir(tmp_path)
    assert shipped.model_path(REPO) == REPO


@pytest.mark.dtype
def test_threads_set_torch_thread_count(tmp_path: Path, torch_threads: None) -> None:
    torch.set_num_threads(2)
    structspec.load(str(save_tiny_model(tmp_path / "m")), kernels="torch", threads=1)
    assert torch.get_num_threads() == 1


def test_default_threads_never_exceed_the_cpus_this_process_may_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, torch_threads: None
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(device, "_CPU_MAX", tmp_path / "cpu.max")
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # a container's --cpus=1.5
    assert device.available_cpus() == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")  # no quota
    assert device.available_cpus() == 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    torch.set_num_threads(2)
    assert device.default_threads() == 1
    assert device.use_threads(None) == 1 and torch.get_num_threads() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    assert device.use_threads(None) == 1 and torch.get_num_threads() == 1  # within the CPUs: left as it is


@pytest.mark.parametrize(("option", "pattern"), [
    ({"threads": 0}, r"threads=0 is not a positive int; use threads=None .* or threads=1"),
    ({"threads": 1.5}, r"threads=1.5 is not a positive int"),
    ({"device": "gpu"}, r"device='gpu' is not a torch device"),
    ({"dtype": "float8"}, r"dtype='float8' is not one of"),
])
def test_bad_options_raise_before_anything_loads(
    option: dict[str, object], pattern: str, no_load: list[str], torch_threads: None
) -> None:
    before = torch.get_num_threads()
    with pytest.raises(OptionError, match=pattern):
        structspec.load("smollm2-135m", **option)  # type: ignore[arg-type]
    assert no_load == []
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("forced", ["float32", "bfloat16"])
def test_the_default_dtype_can_be_forced_for_every_device(forced: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(device.DTYPE_VARIABLE, forced)
    assert device.resolve_device("cpu") == (torch.device("cpu"), getattr(torch, forced))
    assert device.resolve_device("cpu", "float16")[1] == torch.float16  # a dtype the caller names still wins


@pytest.mark.dtype
def test_the_default_dtype_without_the_variable_is_the_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(device.DTYPE_VARIABLE, raising=False)
    expected = torch.bfloat16 if device.native_bf16() else torch.float32
    assert device.resolve_device("cpu")[1] == expected


def test_a_bad_forced_default_dtype_is_refused_before_anything_loads(
    no_load: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(device.DTYPE_VARIABLE, "fp8")
    with pytest.raises(OptionError, match="STRUCTSPEC_DEFAULT_DTYPE='fp8' is not a default dtype: set it to"):
        structspec.load("smollm2-135m")
    assert no_load == []


@pytest.mark.dtype
@pytest.mark.parametrize("forced", ["float32", "bfloat16", None])
def test_a_model_bfloat16_makes_wrong_loads_in_float32_on_every_kind_of_cpu(forced: str | None,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    if forced is None:
        monkeypatch.delenv(device.DTYPE_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(device.DTYPE_VARIABLE, forced)  # what load gives on the other kind of CPU
    machine = device.resolve_device("cpu")[1]
    assert device.resolve_device("cpu", None, "smollm2-135m")[1] == torch.float32
    assert device.resolve_device("cpu", None, "qwen2.5-coder-0.5b")[1] == machine  # the machine's default
    assert device.resolve_device("cpu", "bfloat16", "smollm2-135m")[1] == torch.bfloat16  # a named dtype wins
