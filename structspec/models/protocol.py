"""What the decode loop and the drafters need of a model: the `LanguageModel` protocol, its cache's `KVCache`
protocol and the types their calls take. Declares every member they use, so they never probe a model or a cache
with ``getattr``; a fake model for tests implements these and nothing else (`structspec.models.transformers_lm.LM`
is the transformers one, `structspec.testing.FakeLM` one without a network)."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from structspec.vocab import TokenVocab

Prompt = str | list[dict[str, str]]
Allowed = list[torch.Tensor | None]
"""Per kept logits row: the token ids it may hold (the LM head computes only those, every other logit is
-inf; a single id gets logit 0 and no computation), or None for a full row the caller masks."""


@runtime_checkable
class KVCache(Protocol):
    """A model's KV cache (`LanguageModel.new_cache`) as a sequence of slots, one per position fed, in the order
    fed: what a batch's slot table (`structspec.models.packed_slots.PackedSlots`) and the prefix cache
    (`structspec.models.prefix_cache`) and a row decoded alone (its rejected tail cropped) do to it, each model on
    its own cache type, so none of them knows the type. `LanguageModel.forward` and `forward_slots` append slots.

    Rows leave a batch through its slot table alone (`PackedSlots.select`): every row shares the one sequence, so
    the cache has no per-row move."""

    @property
    def nbytes(self) -> int:
        """Bytes the cached slots hold. Changes nothing."""
        ...

    def append_slots(self, sources: list[Any], length: int | None = None) -> None:
        """Append the slots of each of ``sources`` (one-row caches of this type), in order: all of them, or the first
        ``length`` of each. Changes this cache, not the sources."""
        ...

    def gather_slots(self, index: torch.Tensor) -> None:
        """Keep only the slots ``index`` (long, on the CPU), in that order: one gather of the whole cache. Changes
        the cache."""
        ...

    def copy_slots(self, start: int, end: int) -> KVCache:
        """A new one-row cache holding a copy of slots ``[start, end)``. Changes nothing."""
        ...

    def crop_slots(self, length: int) -> None:
        """Keep only the first ``length`` slots, in every row (a rejected chain's tail goes; a longer ``length``
        keeps all). Changes the cache."""
        ...


@runtime_checkable
class LanguageModel(Protocol):
    """A causal LM run with an explicit KV cache. Reading a member changes nothing; `forward` and `forward_slots`
    change the cache they are given."""

    name: str
    tokenizer: Any

    @property
    def vocab(self) -> TokenVocab: ...

    @property
    def logits_width(self) -> int:
        """Logits per row (the LM head's rows; may exceed the vocabulary)."""
        ...

    @property
    def max_context(self) -> int | None:
        """Positions the model was trained for (prompt and output together); None where unknown."""
        ...

    @property
    def device(self) -> torch.device:
        """Where inputs go and logits come back."""
        ...

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype (`Stats.dtype`)."""
        ...

    @property
    def kernels(self) -> str:
        """``"onednn"`` where the linear layers are packed for oneDNN, else ``"torch"``: its pass-cost curve is
        another one (`structspec.decoding.cost.curve_path`)."""
        ...

    @property
    def batchable(self) -> bool:
        """Whether rows can share passes over one slot cache (`forward_slots`); False with sliding-window
        layers, which then decode one row at a time."""
        ...

    @property
    def batch_invariant(self) -> bool:
        """Whether every pass gives each row the logits it gets alone, so that batched and accelerated decoding are
        token-identical to plain masked decoding (`Stats.batch_invariant`)."""
        ...

    @property
    def prefills_apart(self) -> bool:
        """Whether single-row decoding feeds a prompt but its last token in a pass of its own, as a batch does."""
        ...

    @property
    def max_pass_tokens(self) -> int | None:
        """The most tokens a pass that chooses tokens may feed (longer greedy candidates are cut); None: no limit."""
        ...

    def encode_prompt(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]: ...

    def new_cache(self) -> KVCache:
        """An empty KV cache for `forward`, or for a `PackedSlots` to own."""
        ...

    def forward(
        self, token_ids: list[int], cache: Any, logits_to_keep: int = 1, allowed: Allowed | None = None
    ) -> torch.Tensor:
        """Feed ``token_ids`` after what ``cache`` holds (changes the cache); float32 logits of the last
        ``logits_to_keep`` positions [k, logits_width], restricted per row by ``allowed``."""
        ...

    def forward_slots(
        self, windows: list[list[int]], positions: list[int] | list[list[int]], attend: torch.Tensor, cache: Any,
        rows: list[tuple[int, int]], allowed: Allowed | None = None,
    ) -> torch.Tensor:
        """One pass over one packed window (``windows`` of one: a `PackedSlots` batch's rows in one sequence)
        appended to the slots' ``cache`` (changes it), each query seeing the slots ``attend`` allows; float32
        logits of the (0, window index) pairs ``rows``."""
        ...

    def early_exit(self, layers: int | None = None) -> LanguageModel:
        """A draft model made of this model's first ``layers`` layers; does not change this model."""
        ...
