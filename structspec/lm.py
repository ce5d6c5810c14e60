"""The one module of the core that imports transformers: loading models, running forward passes,
and model surgery (early exit).

Everything else talks to the `LanguageModel` protocol, so a fake LM for tests
needs only what the protocol lists.
"""

from __future__ import annotations

import copy
import importlib.metadata as md
import inspect
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import torch

from structspec.errors import OptionError, PromptError, SpecError, VocabularyMismatchError
from structspec.kernels import (
    WHOLE_ROWS, PackedLinear, RowLinear, attention_by_row, native_bf16, pack_linears, should_pack,
)
from structspec.loading import DEFAULT_MODEL, model_path, quiet_loading, use_threads
from structspec.vocab import TokenVocab, vocab_from_tokenizer

Prompt = str | list[dict[str, str]]
Allowed = list[torch.Tensor | None]
"""Per kept logits row: the token ids it may hold (the LM head computes only those, every other logit is
-inf; a single id gets logit 0 and no computation), or None for a full row the caller masks."""
_TRANSFORMERS_MAJOR = int(md.version("transformers").split(".")[0])


@runtime_checkable
class LanguageModel(Protocol):
    """What the decode loop and the drafters need of a model (`LM` is the transformers one)."""

    name: str
    tokenizer: Any

    @property
    def vocab(self) -> TokenVocab: ...

    @property
    def logits_width(self) -> int: ...

    @property
    def max_context(self) -> int | None: ...

    def encode_prompt(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]: ...

    def new_cache(self) -> Any: ...

    def forward(
        self, token_ids: list[int], cache: Any, logits_to_keep: int = 1, allowed: Allowed | None = None
    ) -> torch.Tensor: ...

    def crop(self, cache: Any, length: int) -> None: ...

    def early_exit(self, layers: int | None = None) -> LanguageModel: ...


class LM:
    """A Hugging Face causal LM and its tokenizer, run with an explicit KV cache."""

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

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        # Sliding-window layers (Gemma 3) drop states older than the window as they go,
        # so rolling back rejected drafts past the window fails unless they keep them until `crop`.
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

    @cached_property
    def kernels(self) -> str:
        """``"onednn"`` when `load` packed the model's linear layers (`structspec.kernels`), else ``"torch"``."""
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
        layer a `structspec.kernels.RowLinear` and attention run by row. Elsewhere a row may leave its single-row
        twin at a near-tie. Changes nothing."""
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
        (no limit). The decode cuts longer candidates to fit (`RowDecode.fit`)."""
        return INVARIANT_TOKENS if self.prefills_apart else None

    @cached_property
    def batchable(self) -> bool:
        """Whether rows can share passes through a slot cache with holes: not with sliding-window layers
        (Gemma 3), whose window counts slots, not a row's kept positions."""
        types = getattr(self.model.config, "layer_types", None) or []
        return not any("sliding" in t for t in types)

    @torch.no_grad()
    def forward_slots(
        self, windows: list[list[int]], positions: list[int] | list[list[int]], attend: torch.Tensor, cache: Any,
        rows: list[tuple[int, int]], allowed: Allowed | None = None,
    ) -> torch.Tensor:
        """One pass over a batch of windows appended to ``cache`` (changes the cache).

        ``windows[b]`` is right-padded to the longest; its token ``j`` sits at
        position ``positions[b] + j``, or at ``positions[b][j]`` when a list
        gives one per token (a token tree: siblings share a position; padding
        continues after the last). ``attend`` [B, W, cached + W] (bool, any
        device) says which slots each query sees. Returns float32 logits on the
        model's device for the (row, window index) pairs in ``rows`` only, each
        restricted by ``allowed`` (`head`): the LM head never runs on padding or
        prompt rows.
        """
        device, dtype = self.device, self.model.dtype
        W = max(len(w) for w in windows)
        ids = torch.tensor([w + [0] * (W - len(w)) for w in windows], device=device)
        pos = torch.tensor([_window_positions(p, W) for p in positions], device=device)
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

    @staticmethod
    def cache_place(cache: Any, batch_rows: int, row: int, source: Any, length: int) -> None:
        """Copy the first ``length`` positions of the one-row ``source`` cache into row ``row`` of the batch
        ``cache`` (slots ``[0, length)``), widening every row with empty slots if needed (changes ``cache``)."""
        if length == 0:
            return
        for dst, src in zip(cache.layers, source.layers):
            k, v = src.keys[:, :, :length], src.values[:, :, :length]
            if not dst.is_initialized:
                dst.lazy_initialization(k, v)
                dst.keys = k.new_zeros((batch_rows, *k.shape[1:]))
                dst.values = v.new_zeros((batch_rows, *v.shape[1:]))
            if dst.keys.shape[2] < length:
                grow = (0, 0, 0, length - dst.keys.shape[2])
                dst.keys = torch.nn.functional.pad(dst.keys, grow)
                dst.values = torch.nn.functional.pad(dst.values, grow)
            dst.keys[row, :, :length] = k[0]
            dst.values[row, :, :length] = v[0]

    @staticmethod
    def cache_gather(cache: Any, index: torch.Tensor) -> None:
        """Rewrite each row's slots as ``slots[index[b]]`` (index [B, T']; compaction; changes ``cache``)."""
        for layer in cache.layers:
            if layer.is_initialized:
                i = index.to(layer.keys.device)[:, None, :, None]
                layer.keys = layer.keys.gather(2, i.expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3]))
                layer.values = layer.values.gather(2, i.expand(-1, layer.values.shape[1], -1, layer.values.shape[3]))

    @staticmethod
    def cache_select(cache: Any, rows: list[int]) -> None:
        """Keep only batch rows ``rows`` of ``cache`` (changes it)."""
        for layer in cache.layers:
            if layer.is_initialized:
                index = torch.tensor(rows, dtype=torch.long, device=layer.keys.device)
                layer.keys, layer.values = layer.keys[index], layer.values[index]

    @staticmethod
    def crop(cache: Any, length: int) -> None:
        """Drop cached positions from ``length`` on (in place)."""
        extra = cache.get_seq_length() - length
        if extra > 0:
            # transformers 5 takes how many positions to remove (negative); 4.x took the length to keep
            cache.crop(-extra if _TRANSFORMERS_MAJOR >= 5 else length)

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


def _window_positions(start: int | list[int], W: int) -> list[int]:
    """Positions of a window's ``W`` slots: ``start + j``, or the given per-token positions, then padding after."""
    given = list(range(start, start + W)) if isinstance(start, int) else start
    after = given[-1] + 1 if given else 0
    return given + list(range(after, after + W - len(given)))


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


def load(
    name: str = DEFAULT_MODEL, device: str = "auto", dtype: str | torch.dtype | None = None, kernels: str = "auto",
    *, threads: int | None = None, verbose: bool = False,
) -> LM:
    """Load a shipped model by name (see `SHIPPED`), a local Hugging Face model directory, or a hub id
    (``"ORG/NAME"``) from the local Hugging Face cache (never downloaded; `structspec.loading`).

    A shipped model is converted from its GGUF once and cached as safetensors
    under ``$STRUCTSPEC_CACHE/models``; later loads take seconds. ``device="auto"``
    picks CUDA when available, else the CPU; ``dtype`` (``"float32"``,
    ``"bfloat16"``, ``"float16"`` or a torch dtype) defaults to bfloat16 on CUDA
    and on CPUs with AVX-512 BF16 or AMX, else float32. ``kernels="auto"`` packs
    a float32 CPU model's linear layers for oneDNN (bfloat16 too where the CPU
    multiplies it natively; `structspec.kernels`: the model is then for
    inference only), ``"onednn"`` insists on it, ``"torch"`` keeps torch's own.
    With ``"auto"`` every CPU model is batch-invariant (`make_batch_invariant`):
    batched rows and every draft mode are token-identical to plain masked
    decoding in float32 and bfloat16 alike (`Stats.batch_invariant`).

    Changes torch's process-wide thread count to ``threads``; None keeps torch's
    count unless it exceeds the CPUs this process may use (`default_threads`).
    Transformers' loading messages, progress bars and warnings are silenced
    unless ``verbose`` (`quiet_loading`: its settings are put back after). Bad
    options and unknown names raise before anything is loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    where, precision = resolve_device(device, dtype)
    pack = should_pack(kernels, where, precision)  # before loading: a bad option costs no load
    use_threads(threads)
    with quiet_loading(verbose):
        path = model_path(name, verbose)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=precision).to(where)
        tokenizer = AutoTokenizer.from_pretrained(path)
    if pack:
        pack_for_cpu(model)
    elif kernels == "auto" and where.type == "cpu":  # a dtype oneDNN would only emulate: torch's kernel, by row
        make_batch_invariant(model)
    return LM(model, tokenizer, name=name)


def pack_for_cpu(model: Any) -> None:
    """`make_batch_invariant` with ``model``'s linear layers packed for oneDNN (`structspec.kernels`). Changes the
    model in place."""
    make_batch_invariant(model, packed=True)


def make_batch_invariant(model: Any, packed: bool = False) -> None:
    """Make every pass of ``model`` give each row the logits it gets alone (`LM.batch_invariant`), in any dtype:
    each linear layer a `structspec.kernels.RowLinear` (packed for oneDNN with ``packed``, else on torch's own
    kernel) and attention by row (`use_attention_by_row`), so that a verify pass equals its one-token steps and a
    batched row the row decoded alone, bit for bit. Changes the model in place (inference only); a second call
    changes nothing."""
    if not any(isinstance(m, RowLinear) for m in model.modules()):
        pack_linears(model, packed)
    use_attention_by_row(model)


BY_ROW = "structspec_by_row"  # the attention implementation's name in transformers' registry
INVARIANT_TOKENS = 64
"""Batch-invariant bfloat16 on an AVX-512 BF16 CPU, Qwen2.5-Coder-0.5B: a pass of up to 64 tokens gave each
position the logits of one-token steps bit for bit, one of 65 did not (a lookahead tree of 87 nodes turned a
0.125 margin into a tie)."""
PREFILL_ROWS = WHOLE_ROWS  # more query rows than this: a prompt's prefill, which no verify pass is compared with


def _attention_by_row(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over `structspec.kernels.attention_by_row`; a prefill of more than
    `PREFILL_ROWS` rows goes to transformers' SDPA attention whole. Returns [batch, q, heads, d]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] > PREFILL_ROWS:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    return attention_by_row(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None


def use_attention_by_row(model: Any) -> None:
    """Make ``model``'s attention run one query row per call (changes the model): a verify pass over k tokens
    then computes each position as a one-token step does, bit for bit, where SDPA over k rows would not
    (bfloat16 on the CPU; `structspec.kernels`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(BY_ROW, _attention_by_row)
    AttentionMaskInterface.register(BY_ROW, sdpa_mask)  # the masks SDPA gets: None where causal suffices
    model.set_attn_implementation(BY_ROW)


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str = "auto", dtype: str | torch.dtype | None = None) -> tuple[torch.device, torch.dtype]:
    """The device and dtype ``load`` uses for ``device``/``dtype`` options (``"auto"``: CUDA if available).
    Does not change anything."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        where = torch.device(device)
    except RuntimeError:
        raise OptionError(f"device={device!r} is not a torch device: use 'auto', 'cpu', 'cuda' or 'cuda:N'") from None
    if where.type == "cuda" and not torch.cuda.is_available():
        raise OptionError(f"device={device!r} but torch sees no CUDA device: use device='cpu' or 'auto'")
    if dtype is None:  # bfloat16 where it is fast: CUDA, and CPUs that multiply it natively (README "dtype")
        return where, torch.bfloat16 if where.type == "cuda" or native_bf16() else torch.float32
    if isinstance(dtype, torch.dtype):
        return where, dtype
    if dtype not in _DTYPES:
        raise OptionError(f"dtype={dtype!r} is not one of {', '.join(_DTYPES)}")
    return where, _DTYPES[dtype]
