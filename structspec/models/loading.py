"""`structspec.load`: a model by name, its options checked before anything loads, loaded quietly on a sensible
thread count, and made batch-invariant on the CPU."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from structspec.cache import CacheWarning
from structspec.errors import ModelNotFoundError, OptionError
from structspec.models.device import resolve_device, use_threads
from structspec.models.invariance import make_batch_invariant, pack_for_cpu, should_pack
from structspec.models.shipped import DEFAULT_MODEL, SHIPPED, heal, model_path
from structspec.models.transformers_lm import LM


def load(
    name: str = DEFAULT_MODEL, device: str = "auto", dtype: str | torch.dtype | None = None, kernels: str = "auto",
    *, threads: int | None = None, verbose: bool = False,
) -> LM:
    """Load a shipped model by name (see `structspec.models.shipped.SHIPPED`), a local Hugging Face model directory,
    or a hub id (``"ORG/NAME"``) from the local Hugging Face cache (never downloaded; `structspec.models.shipped`).

    A shipped model is converted from its GGUF once and cached as safetensors
    under ``$STRUCTSPEC_CACHE/models``; later loads take seconds. ``device="auto"``
    picks CUDA when available, else the CPU; ``dtype`` (``"float32"``,
    ``"bfloat16"``, ``"float16"`` or a torch dtype) defaults to bfloat16 on CUDA
    and on CPUs with AVX-512 BF16 or AMX, else float32, except for the shipped
    models bfloat16 makes wrong (SmolLM2-135M: float32 everywhere;
    `structspec.models.device.FLOAT32_MODELS`). ``kernels="auto"`` packs
    a float32 CPU model's linear layers for oneDNN (bfloat16 too where the CPU
    multiplies it natively; `structspec.models.invariance`: the model is then for
    inference only), ``"onednn"`` insists on it, ``"torch"`` keeps torch's own.
    With ``"auto"`` every CPU model is batch-invariant (`make_batch_invariant`):
    batched rows and every draft mode are token-identical to plain masked
    decoding in float32 and bfloat16 alike (`Stats.batch_invariant`).

    Changes torch's process-wide thread count to ``threads``; None keeps torch's
    count unless it exceeds the CPUs this process may use
    (`structspec.models.device.default_threads`).
    Transformers' loading messages, progress bars and warnings are silenced
    unless ``verbose`` (`quiet_loading`: its settings are put back after). Bad
    options and unknown names raise before anything is loaded.
    """
    name = _checked_name(name)
    where, precision = resolve_device(device, dtype, name)
    pack = should_pack(kernels, where, precision)  # before loading: a bad option costs no load
    use_threads(threads)
    with quiet_loading(verbose):
        model, tokenizer = _read(name, precision, verbose)
        model = model.to(where)
    if pack:
        pack_for_cpu(model)
    elif kernels == "auto" and where.type == "cpu":  # a dtype oneDNN would only emulate: torch's kernel, by row
        make_batch_invariant(model)
    return LM(model, tokenizer, name=name)


def _read(name: str, precision: torch.dtype, verbose: bool) -> tuple[Any, Any]:
    """``name``'s model and tokenizer from its files (`model_path`). A shipped model's converted copy that fails to
    load and is found damaged (`heal`) is dropped, converted again and read once more; any other error raises."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    def read(path: str) -> tuple[Any, Any]:
        return AutoModelForCausalLM.from_pretrained(path, dtype=precision), AutoTokenizer.from_pretrained(path)

    path = model_path(name, verbose)
    try:
        return read(path)
    except Exception:
        if not heal(name):  # not a damaged copy of a shipped model: the error is the caller's
            raise
    return read(model_path(name, verbose))  # converted again


def _checked_name(name: Any) -> str:
    """``name`` as a str (a path too); `OptionError` for another type, `ModelNotFoundError` for a directory that
    holds no model. Before anything loads."""
    if isinstance(name, os.PathLike):
        name = os.fspath(name)
    if not isinstance(name, str):
        raise OptionError(f"name must be a model's name, got {name!r}; pass a shipped model's name "
                          f"({', '.join(SHIPPED)}), a local model directory or a hub id (ORG/NAME)")
    if os.path.isdir(name) and not os.path.isfile(os.path.join(name, "config.json")):
        raise ModelNotFoundError(f"{name!r} is a directory without a model (no config.json); pass a directory "
                                 "that save_pretrained wrote (config.json, weights, tokenizer files), or a shipped "
                                 f"model's name ({', '.join(SHIPPED)})")
    return name


@contextmanager
def quiet_loading(verbose: bool = False) -> Iterator[None]:
    """Silence transformers while loading, unless ``verbose``: its logging below errors, its progress bars
    (``Loading weights``, the GGUF conversion's) and Python warnings but structspec's `CacheWarning` (a damaged
    cache entry rebuilt). On exit the logging verbosity, the progress bar switch and the warning filters are put
    back as they were; nothing else is changed."""
    if verbose:
        yield
        return
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars
    from transformers.utils import logging

    verbosity, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    hub_bars_off = are_progress_bars_disabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            warnings.simplefilter("default", CacheWarning)  # structspec's own: a damaged cache entry rebuilt
            yield
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()  # also enables huggingface_hub's: put its own switch back after
        if hub_bars_off:
            disable_progress_bars()
