"""`LM`, the transformers adapter: a Hugging Face causal LM and its tokenizer as a `LanguageModel`, run with an
explicit KV cache; its forward passes (one row, or a batch over a slot cache), and model surgery (early exit).
"""

from __future__ import annotations

import copy
import inspect
from functools import cached_property
from typing import TYPE_CHECKING, Any

import torch

from structspec.errors import PromptError, SpecError, VocabularyMismatchError
from structspec.models.invariance import BY_ROW, INVARIANT_TOKENS, PackedLinear, RowLinear
from structspec.models.prefix_cache import PrefixCache, prefix_cache
from structspec.models.protocol import Allowed, Prompt
from structspec.vocab import TokenVocab, vocab_from_tokenizer

if TYPE_CHECKING:
    from structspec.models.transformers_kv import SlotKV


class LM:
    """A Hugging Face causal LM and its tokenizer, run with an explicit KV cache: the transformers
    `LanguageModel`."""

    def __init__(self, model: Any, tokenizer: Any, name: str = "") -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._early_exits: dict[int, LM] = {}  # by layer count: rows of a batch share one draft model
        self.name = name or getattr(model.config, "name_or_path", "") or type(model).__name__
        if len(tokenizer) > self.logits_width:
            raise VocabularyMismatchError(
                f"the tokenizer has {len(tokenizer)} tokens but the model only {self.logits_width} "
                "logits: they do not belong together"
            )

    @cached_property
    def vocab(self) -> TokenVocab:
        return vocab_from_tokenizer(self.tokenizer)

    @cached_property
    def logits_width(self) -> int:
        return self.model.get_output_embeddings().weight.shape[0]

    @cached_property
    def max_context(self) -> int | None:
        """Positions the model was trained for (prompt and output together); None if the config is silent."""
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def device(self) -> torch.device:
        """Where inputs go: the input embeddings' device (also for models spread with ``device_map``)."""
        return self.model.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The model's weights' dtype."""
        return self.model.dtype

    def encode_prompt(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Token ids of a prompt: a string as is, or chat messages through the chat template (given ``tools``,
        OpenAI-style function dicts, where there are any)."""
        texts = [prompt] if isinstance(prompt, str) else [m.get("content") for m in prompt if isinstance(m, dict)]
        for text in texts:
            if isinstance(text, str) and not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    raise PromptError(f"the prompt holds {text[e.start]!r} at character {e.start}, which is not "
                                      "valid Unicode text (a lone surrogate); decode the document properly") from None
        if isinstance(prompt, str):
            if not prompt:
                raise PromptError("the prompt is empty")
            return list(self.tokenizer(prompt)["input_ids"])
        if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in prompt
        ):
            raise PromptError("a prompt is a non-empty str or a non-empty list of {'role', 'content'} dicts")
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError(f"{self.name}'s tokenizer has no chat template; pass the prompt as a str")
        text = self.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                                  **({"tools": tools} if tools else {}))
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def new_cache(self) -> SlotKV:
        """An empty `SlotKV` (a `DynamicCache` with the `KVCache` slot moves) for this model's layers."""
        from structspec.models.transformers_kv import SlotKV

        cache = SlotKV(config=self.model.config)
        # Sliding-window layers (Gemma 3) drop states older than the window as they go,
        # so rolling back rejected drafts past the window fails unless they keep them until `crop_slots`.
        cache.activate_past_recording()
        return cache

    @torch.no_grad()
    def forward(
        self, token_ids: list[int], cache: Any, logits_to_keep: int = 1, allowed: Allowed | None = None
    ) -> torch.Tensor:
        """Feed ``token_ids`` after what ``cache`` holds (changes the cache); returns float32 logits of the
        last ``logits_to_keep`` positions [k, logits_width], restricted per row by ``allowed``."""
        hidden = self.model.base_model(
            input_ids=torch.tensor([token_ids], device=self.device), use_cache=True, **{self._cache_argument: cache}
        ).last_hidden_state
        return self.head(hidden[0, -logits_to_keep:], allowed)

    @torch.no_grad()
    def head(self, hidden: torch.Tensor, allowed: Allowed | None = None) -> torch.Tensor:
        """Float32 logits [rows, logits_width] of last-layer states ``hidden`` [rows, d]: the whole LM head
        for a full row, only the allowed ids' rows of it otherwise (see `Allowed`). Changes nothing."""
        head = self.model.get_output_embeddings()
        cap = getattr(self.model.config, "final_logit_softcapping", None)

        def scores(h: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
            if ids is None:
                out = head(h).float()  # the module: its kernel (a packed one after `load`)
            else:
                bias = None if head.bias is None else head.bias[ids]
                out = torch.nn.functional.linear(h, head.weight[ids], bias).float()
            return torch.tanh(out / cap) * cap if cap else out

        if allowed is None or all(ids is None for ids in allowed):
            return scores(hidden)
        logits = torch.full((len(hidden), self.logits_width), float("-inf"), device=hidden.device)
        full = [i for i, ids in enumerate(allowed) if ids is None]
        if full:
            logits[full] = scores(hidden[full])
        for i, ids in enumerate(allowed):
            if ids is not None:
                ids = ids.to(hidden.device)
                logits[i, ids] = 0.0 if len(ids) == 1 else scores(hidden[i], ids)  # one id: the only choice
        return logits

    @property
    def prefix_cache(self) -> PrefixCache:
        """The KV of whole prompt chunks this model computed, reused by later prompts that start with them, where it
        prefills on the chunk grid (`structspec.models.prefix_cache`); ``lm.prefix_cache.max_bytes = 0`` turns
        reuse off (outputs do not change). Reading it changes nothing."""
        return prefix_cache(self)

    @cached_property
    def kernels(self) -> str:
        """``"onednn"`` when `load` packed the model's linear layers (`structspec.models.invariance`), else
        ``"torch"``."""
        return "onednn" if isinstance(self.model.get_output_embeddings(), PackedLinear) else "torch"

    @cached_property
    def _cache_argument(self) -> str:
        """The name the model's forward takes its KV cache by: ``cache`` (transformers ≥ 5.2x, where
        ``past_key_values`` is deprecated for removal in 5.40), else ``past_key_values``."""
        forward = self.model.base_model.forward  # transformers' deprecation wrapper keeps the signature
        return "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"

    @cached_property
    def batch_invariant(self) -> bool:
        """Whether every pass gives each row the logits it gets alone, whatever else the pass feeds (other rows
        of a batch, drafts, padding, slot holes), so that batched and accelerated decoding are token-identical to
        plain masked decoding in this model's dtype: where `make_batch_invariant` (or `load`) made every linear
        layer a `structspec.models.invariance.RowLinear` and attention run by row. Elsewhere a row may leave its
        single-row twin at a near-tie. Changes nothing."""
        linears = [m for m in self.model.modules() if isinstance(m, (torch.nn.Linear, RowLinear))]
        return self.prefills_apart and all(isinstance(m, RowLinear) for m in linears)

    @cached_property
    def prefills_apart(self) -> bool:
        """Whether single-row decoding feeds a prompt but its last token in a pass of its own, as a batch does:
        where attention runs by row (`use_attention_by_row`), so that a prompt's forced text and drafts are
        computed as plain decoding's one-token steps compute them."""
        return getattr(self.model.config, "_attn_implementation", None) == BY_ROW

    @cached_property
    def max_pass_tokens(self) -> int | None:
        """The most tokens a choosing pass feeds where attention runs by row (`prefills_apart`): `INVARIANT_TOKENS`,
        the longest pass measured to compute every position bit for bit as one-token steps do; None elsewhere
        (no limit). The decode cuts longer candidates to fit (`Window.first`)."""
        return INVARIANT_TOKENS if self.prefills_apart else None

    @cached_property
    def batchable(self) -> bool:
        """Whether rows can share passes over one slot cache (holes in the KV cache): not with sliding-window layers
        (Gemma 3), whose window counts slots, not a row's kept positions."""
        types = getattr(self.model.config, "layer_types", None) or []
        return not any("sliding" in t for t in types)

    @torch.no_grad()
    def forward_slots(
        self, windows: list[list[int]], positions: list[int] | list[list[int]], attend: torch.Tensor, cache: Any,
        rows: list[tuple[int, int]], allowed: Allowed | None = None,
    ) -> torch.Tensor:
        """One pass over one packed window (a `PackedSlots`' ``windows`` of one: every row's tokens in one
        sequence) appended to ``cache``, the slots' ``kv`` (changes the cache).

        Token ``j`` sits at position ``positions[0] + j``, or at ``positions[0][j]``
        when a list gives one per token (a batch's rows, a token tree: siblings
        share a position). ``attend`` [1, W, cached + W] (bool, any device) says
        which slots each query sees. Returns float32 logits on the model's device
        for the (0, window index) pairs in ``rows`` only, each restricted by
        ``allowed`` (`head`): the LM head never runs on prompt rows. Several
        windows (a padded batch) raise NotImplementedError.
        """
        if len(windows) != 1:
            raise NotImplementedError("one packed window per pass (PackedSlots), not padded rows")
        device, dtype = self.device, self.dtype
        window, start = windows[0], positions[0]
        ids = torch.tensor([window], device=device)
        where = list(range(start, start + len(window))) if isinstance(start, int) else start
        pos = torch.tensor([where], device=device)
        # an additive mask (0 or the dtype's minimum) works for both SDPA and eager attention
        mask = torch.zeros(attend.shape, dtype=dtype, device=device)
        mask.masked_fill_(~attend.to(device), torch.finfo(dtype).min)
        hidden = self.model.base_model(
            input_ids=ids, position_ids=pos, attention_mask=mask[:, None], use_cache=True,
            **{self._cache_argument: cache},
        ).last_hidden_state
        if not rows:  # a pass that only fills the cache (every row fed pending tokens alone)
            return hidden.new_empty(0, self.logits_width, dtype=torch.float32)
        index = torch.tensor(rows, device=hidden.device)  # the last layer's device under device_map
        return self.head(hidden[index[:, 0], index[:, 1]], allowed)

    def early_exit(self, layers: int | None = None) -> LM:
        """A draft LM made of this model's first ``layers`` decoder layers (default: a quarter) and its
        final norm and LM head. Shares every weight: no extra memory. Made once per layer count (rows of a
        batch share it); does not change the model."""
        model = self.model
        total = len(model.model.layers)
        k = layers if layers is not None else max(total // 4, 1)
        if not 1 <= k <= total:
            raise SpecError(f"self-draft layers must be in 1..{total}, got {k}")
        if k not in self._early_exits:
            self._early_exits[k] = self._early_exit(k)
        return self._early_exits[k]

    def _early_exit(self, k: int) -> LM:
        model = self.model
        config = copy.copy(model.config)
        config.num_hidden_layers = k
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:k]
        body = _module_copy(model.model)
        body.layers = torch.nn.ModuleList(model.model.layers[:k])
        body.config = config
        head = _module_copy(model)
        head.model = body
        head.config = config
        return LM(head, self.tokenizer, name=f"{self.name}[:{k}]")


def _module_copy(module: torch.nn.Module) -> Any:
    """A shallow copy of ``module`` with dicts of its own (submodules, hooks), sharing every tensor."""
    new = copy.copy(module)
    for name, value in vars(module).items():
        if isinstance(value, dict):
            setattr(new, name, copy.copy(value))
    return new


def from_transformers(model: Any, tokenizer: Any) -> LM:
    """Wrap a Hugging Face causal LM and tokenizer that you already have."""
    return LM(model, tokenizer)
