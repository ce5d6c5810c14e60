"""`SlotKV`, the transformers `LM`'s cache: a `DynamicCache` whose slots a batch's slot table, the prefix cache and a
row decoded alone move as the `KVCache` protocol says (append, gather, copy, crop), on its layers' key and value
tensors [rows, kv heads, slots, d]. Imported by `LM.new_cache` on first use, as transformers is."""

from __future__ import annotations

import importlib.metadata as md
from typing import Any

import torch
from transformers import DynamicCache

_TRANSFORMERS_MAJOR = int(md.version("transformers").split(".")[0])


class SlotKV(DynamicCache):
    """A `DynamicCache` that is a `structspec.models.protocol.KVCache`: the model runs it as its own."""

    @property
    def nbytes(self) -> int:
        """Bytes the cached keys and values hold. Changes nothing."""
        return sum(t.numel() * t.element_size() for layer in self.layers if layer.is_initialized
                   for t in (layer.keys, layer.values))

    def append_slots(self, sources: list[Any], length: int | None = None) -> None:
        """Append the slots of each of ``sources`` (one-row caches), in order, all or the first ``length`` of each:
        one concatenation per layer. Changes this cache, not the sources."""
        for i, dst in enumerate(self.layers):
            parts = [src.layers[i] for src in sources if src.layers[i].is_initialized]
            if not parts:
                continue
            keys = [part.keys[:, :, :length] for part in parts]
            values = [part.values[:, :, :length] for part in parts]
            if not dst.is_initialized:
                dst.lazy_initialization(keys[0], values[0])
            dst.keys, dst.values = torch.cat([dst.keys, *keys], dim=2), torch.cat([dst.values, *values], dim=2)

    def gather_slots(self, index: torch.Tensor) -> None:
        """Keep only the slots ``index``, in that order (one gather of each layer's keys and values). Changes the
        cache."""
        for layer in self.layers:
            if layer.is_initialized:
                where = index.to(layer.keys.device)
                layer.keys, layer.values = layer.keys[:, :, where], layer.values[:, :, where]

    def copy_slots(self, start: int, end: int) -> SlotKV:
        """A new cache holding a copy of slots ``[start, end)`` (of every row). Changes nothing."""
        return SlotKV([(layer.keys[:, :, start:end], layer.values[:, :, start:end]) if layer.is_initialized
                       else (None, None) for layer in self.layers])

    def crop_slots(self, length: int) -> None:
        """Keep only the first ``length`` slots of every row, through `DynamicCache.crop`, so sliding-window layers
        that record their past (`LM.new_cache`) roll back past their window too. Changes the cache."""
        extra = self.get_seq_length() - length
        if extra > 0:
            # transformers 5 takes how many positions to remove (negative); 4.x took the length to keep
            self.crop(-extra if _TRANSFORMERS_MAJOR >= 5 else length)
