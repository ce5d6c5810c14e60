"""Peers to compare with, run in this process on the same model: outlines, plain greedy, transformers'
prompt lookup and assisted generation.

`outlines_greedy` is the oracle for plain masked decoding: greedy structspec must
produce exactly its token ids. Both peers decode with ``model.generate``, which
runs one forward pass per generated token, the final EOS included; passes are
counted with a forward hook on the model, so speculative peers count right too.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from structspec.lm import LM


@dataclass(frozen=True)
class PeerRun:
    """One peer generation: output tokens (EOS stripped) and how long each part took."""

    token_ids: list[int]
    text: str
    forward_passes: int
    seconds: float  # the whole generate call
    mask_seconds: float  # inside the constraint's logits processor; 0 without one
    compile_seconds: float  # building the peer's index; 0 without one

    @property
    def output_tokens(self) -> int:
        return len(self.token_ids)


_BACKENDS: weakref.WeakKeyDictionary[LM, Any] = weakref.WeakKeyDictionary()


def outlines_backend(lm: LM) -> Any:
    """outlines' `OutlinesCoreBackend` for ``lm`` (its vocabulary is built once per LM).

    Note: ``outlines.from_transformers`` sets the tokenizer's ``padding_side`` to
    "left" and fills in ``pad_token_id`` when missing.
    """
    backend = _BACKENDS.get(lm)
    if backend is None:
        import outlines
        from outlines.backends.outlines_core import OutlinesCoreBackend

        backend = _BACKENDS[lm] = OutlinesCoreBackend(outlines.from_transformers(lm.model, lm.tokenizer))
    return backend


class _Timed:
    """Wraps a logits processor and adds up the time spent in its ``__call__``."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor
        self.seconds = 0.0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        scores = self.processor(input_ids, scores)
        self.seconds += time.perf_counter() - start
        return scores


def outlines_greedy(lm: LM, regex: str, prompt_ids: list[int], max_new_tokens: int) -> PeerRun:
    """Greedy decoding constrained by outlines' own outlines-core processor for ``regex``.

    ``compile_seconds`` is outlines building its `Index` (the backend's vocabulary
    is built once per LM and not counted).
    """
    backend = outlines_backend(lm)
    start = time.perf_counter()
    processor = _Timed(backend.get_regex_logits_processor(regex))
    compile_seconds = time.perf_counter() - start
    return _generate(lm, prompt_ids, max_new_tokens, processor, compile_seconds)


def unconstrained_greedy(lm: LM, prompt_ids: list[int], max_new_tokens: int) -> PeerRun:
    """Plain greedy ``model.generate``, no constraint."""
    return _generate(lm, prompt_ids, max_new_tokens, None, 0.0)


def hf_prompt_lookup(lm: LM, prompt_ids: list[int], max_new_tokens: int, num_tokens: int = 10) -> PeerRun:
    """transformers' prompt-lookup decoding (``prompt_lookup_num_tokens``), greedy and unconstrained."""
    return _generate(lm, prompt_ids, max_new_tokens, None, 0.0, prompt_lookup_num_tokens=num_tokens)


def hf_assisted(lm: LM, assistant: LM, prompt_ids: list[int], max_new_tokens: int) -> PeerRun:
    """transformers' assisted generation with ``assistant`` as draft model, greedy and unconstrained.

    A draft model with another tokenizer runs as transformers' universal
    assisted decoding (both tokenizers passed).
    """
    kwargs: dict = {"assistant_model": assistant.model}
    if assistant.vocab.fingerprint != lm.vocab.fingerprint:
        kwargs |= {"tokenizer": lm.tokenizer, "assistant_tokenizer": assistant.tokenizer}
    return _generate(lm, prompt_ids, max_new_tokens, None, 0.0, **kwargs)


class _PassCounter:
    """Counts forward calls of a module while in a ``with`` block (transformers reports no pass count)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls = module, 0

    def __enter__(self) -> _PassCounter:
        self.handle = self.module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


@torch.no_grad()
def _generate(lm: LM, prompt_ids: list[int], max_new_tokens: int, processor: _Timed | None,
              compile_seconds: float, **generate_kwargs: Any) -> PeerRun:
    from transformers import GenerationConfig, LogitsProcessorList

    eos = lm.tokenizer.eos_token_id
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else eos
    input_ids = torch.tensor([prompt_ids], device=lm.device)  # [1, prompt]
    # A fresh config: no sampling or penalty settings from the model's generation_config.
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    start = time.perf_counter()
    with _PassCounter(lm.model) as passes:
        out = lm.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            logits_processor=LogitsProcessorList([processor] if processor else []),
            generation_config=config,
            **generate_kwargs,
        )
    seconds = time.perf_counter() - start
    generated = out[0, len(prompt_ids):].tolist()
    token_ids = generated[:-1] if generated and generated[-1] == eos else generated
    return PeerRun(
        token_ids=token_ids,
        text=lm.vocab.decode(token_ids),
        forward_passes=passes.calls,
        seconds=seconds,
        mask_seconds=processor.seconds if processor else 0.0,
        compile_seconds=compile_seconds,
    )
