"""Peers to compare with, run in this process on the same model: outlines, plain greedy, transformers'
prompt lookup and assisted generation, one row at a time or batched.

`outlines_greedy` is the oracle for plain masked decoding: greedy structspec must
produce exactly its token ids. Every peer decodes with ``model.generate``, which
runs one forward pass per generated token, the final EOS included; passes are
counted with a forward hook on the model (`PassCounter`), so speculative peers
count right too. The batched peers (`outlines_batch`, `unconstrained_batch`)
left-pad their prompts, as outlines and transformers do for a list of prompts.
"""

from __future__ import annotations

import importlib.util
import time
import weakref
from dataclasses import dataclass
from typing import Any

import torch

from structspec.jobs.errors import JobConfigError
from structspec.models.transformers_lm import LM

OUTLINES_REQUIREMENT = "outlines>=1.2,<2"  # as pyproject's dev extra pins it


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


@dataclass(frozen=True)
class PeerBatch:
    """One batched peer generation: each row's output tokens (EOS stripped) and the cost of the whole call."""

    token_ids: list[list[int]]
    texts: list[str]
    chose_eos: list[bool]  # per row: it stopped on EOS before max_new_tokens ran out
    forward_passes: int  # model calls, each over every row of the batch
    seconds: float  # the whole generate call
    mask_seconds: float  # inside the constraint's logits processor; 0 without one

    def row_passes(self, row: int) -> int:
        """Passes that chose one of row ``row``'s tokens, its EOS included (later passes only pad it)."""
        return len(self.token_ids[row]) + self.chose_eos[row]


_BACKENDS: weakref.WeakKeyDictionary[LM, Any] = weakref.WeakKeyDictionary()


def require_outlines(benchmark: str) -> None:
    """Raise `JobConfigError` naming the install when the outlines package, a peer in ``benchmark``, is not
    importable (structspec itself does not need it). Changes nothing."""
    if importlib.util.find_spec("outlines") is None:
        raise JobConfigError(f"{benchmark} compares with the outlines package, which is not installed; "
                             f"pip install '{OUTLINES_REQUIREMENT}' (the dev extra has it)")


def outlines_backend(lm: LM) -> Any:
    """outlines' `OutlinesCoreBackend` for ``lm`` (its vocabulary is built once per LM); `JobConfigError` when
    outlines is not installed.

    Note: ``outlines.from_transformers`` sets the tokenizer's ``padding_side`` to
    "left" and fills in ``pad_token_id`` when missing.
    """
    backend = _BACKENDS.get(lm)
    if backend is None:
        require_outlines("this benchmark")
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
    start = time.perf_counter()
    processor = _Timed(_outlines_processor(outlines_index(lm, regex)))
    compile_seconds = time.perf_counter() - start
    return _generate(lm, prompt_ids, max_new_tokens, processor, compile_seconds)


def outlines_index(lm: LM, regex: str) -> Any:
    """outlines-core's `Index` of ``regex`` over ``lm``'s vocabulary (built on every call: outlines keeps no cache)."""
    from outlines_core import Index

    return Index(regex, outlines_backend(lm).vocabulary)


def _outlines_processor(index: Any) -> Any:
    """A fresh outlines-core logits processor over ``index`` (it keeps one guide per batch row)."""
    from outlines.backends.outlines_core import OutlinesCoreLogitsProcessor

    return OutlinesCoreLogitsProcessor(index, "torch")


class _PerRow:
    """One outlines processor per batch row: outlines takes one regex per batch, so rows of different
    schemas each get their own processor, called on that row's slice of the logits."""

    def __init__(self, processors: list[Any]) -> None:
        self.processors = processors

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for row, processor in enumerate(self.processors):
            scores[row:row + 1] = processor(input_ids[row:row + 1], scores[row:row + 1])
        return scores


def outlines_batch(lm: LM, indexes: list[Any], prompts: list[list[int]], max_new_tokens: int) -> PeerBatch:
    """Greedy ``model.generate`` over ``prompts`` (left-padded), row ``i`` constrained by ``indexes[i]``
    (from `outlines_index`).

    Rows that share one `Index` get outlines' own batched processor, as a list of
    prompts with one regex does in outlines; rows with different indexes get one
    processor each (outlines itself cannot mix regexes in a batch).
    """
    if all(index is indexes[0] for index in indexes):
        processor = _Timed(_outlines_processor(indexes[0]))
    else:
        processor = _Timed(_PerRow([_outlines_processor(index) for index in indexes]))
    return _generate_rows(lm, prompts, max_new_tokens, processor)


def unconstrained_batch(lm: LM, prompts: list[list[int]], max_new_tokens: int) -> PeerBatch:
    """Plain greedy ``model.generate`` over ``prompts``, left-padded, no constraint."""
    return _generate_rows(lm, prompts, max_new_tokens, None)


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


class PassCounter:
    """Counts forward calls of a module while in a ``with`` block (transformers reports no pass count)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module, self.calls = module, 0

    def __enter__(self) -> PassCounter:
        self.handle = self.module.register_forward_hook(lambda *_: setattr(self, "calls", self.calls + 1))
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.remove()


def _generate(lm: LM, prompt_ids: list[int], max_new_tokens: int, processor: _Timed | None,
              compile_seconds: float, **generate_kwargs: Any) -> PeerRun:
    batch = _generate_rows(lm, [prompt_ids], max_new_tokens, processor, **generate_kwargs)
    return PeerRun(
        token_ids=batch.token_ids[0],
        text=batch.texts[0],
        forward_passes=batch.forward_passes,
        seconds=batch.seconds,
        mask_seconds=batch.mask_seconds,
        compile_seconds=compile_seconds,
    )


@torch.no_grad()
def _generate_rows(lm: LM, prompts: list[list[int]], max_new_tokens: int, processor: _Timed | None,
                   **generate_kwargs: Any) -> PeerBatch:
    """``model.generate`` over ``prompts``, left-padded to the longest (transformers' batched layout)."""
    from transformers import GenerationConfig, LogitsProcessorList

    eos = lm.tokenizer.eos_token_id
    pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else eos
    width = max(len(p) for p in prompts)
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=lm.device)  # [B, width]
    attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=lm.device)
    # A fresh config: no sampling or penalty settings from the model's generation_config.
    config = GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad)
    start = time.perf_counter()
    with PassCounter(lm.model) as passes:
        out = lm.model.generate(
            input_ids,
            attention_mask=attention_mask,
            logits_processor=LogitsProcessorList([processor] if processor else []),
            generation_config=config,
            **generate_kwargs,
        )
    seconds = time.perf_counter() - start
    generated = out[:, width:].tolist()  # a row that stopped early is padded after its EOS
    rows = [row[:row.index(eos)] if eos in row else row for row in generated]
    return PeerBatch(
        token_ids=rows,
        texts=[lm.vocab.decode(row) for row in rows],
        chose_eos=[eos in row for row in generated],
        forward_passes=passes.calls,
        seconds=seconds,
        mask_seconds=processor.seconds if processor else 0.0,
    )
