"""Tiny models for tests: random-weight Llamas on the tiny tokenizers (`tiny_lm`), `CountingLM` (counts a
model's passes independently of the engine) and `FakeLM` (made-up logits from a hash of the prefix, no model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase

from structspec.models.invariance import make_batch_invariant
from structspec.models.protocol import Allowed, LanguageModel, Prompt
from structspec.models.transformers_lm import LM, from_transformers
from structspec.testing.tokenizers import byte_level_tokenizer, sentencepiece_tokenizer
from structspec.vocab import vocab_from_tokenizer

def tiny_llama(
    tokenizer: PreTrainedTokenizerBase, seed: int = 0, hidden_size: int = 64, num_layers: int = 2
) -> LlamaForCausalLM:
    """A random-weight float32 Llama for ``tokenizer``, in eval mode.

    Its vocabulary is the next multiple of 8 above ``len(tokenizer)``, so the
    model has a few logits no token owns, as many real checkpoints do. Weights
    are drawn with std 1 rather than 0.02: a 0.02 model's choice depends almost
    only on the last token, so greedy decoding cycles and JSON strings never
    close; at std 1 it depends on the whole context, and outputs vary and end.
    The output layer is rescaled so logits have std about 3 (top probability
    about 0.3), which keeps sampling neither uniform nor greedy.
    """
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer) // 8 * 8 + 8,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        initializer_range=1.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(3 / hidden_size**0.5)  # normed hidden states have RMS 1
    return model


_TOKENIZERS = {"byte_level": byte_level_tokenizer, "sentencepiece": sentencepiece_tokenizer}


def tiny_lm(kind: Literal["byte_level", "sentencepiece"] = "byte_level", seed: int = 0, device: str = "cpu",
            dtype: torch.dtype = torch.float32, batch_invariant: bool = False) -> LM:
    """`tiny_llama` with the ``kind`` tokenizer on ``device`` in ``dtype``, wrapped as a `structspec.LM`; with
    ``batch_invariant``, made so as `load` makes its models (`structspec.models.invariance.make_batch_invariant`)."""
    tokenizer = _TOKENIZERS[kind]()
    model = tiny_llama(tokenizer, seed).to(device=device, dtype=dtype)
    if batch_invariant:
        make_batch_invariant(model)
    return from_transformers(model, tokenizer)


def save_tiny_model(directory: str | Path) -> Path:
    """Save `tiny_lm`'s byte-level model and tokenizer to ``directory`` (a model directory `load` and the CLI
    take by path); returns it. Writes files, nothing else."""
    path = Path(directory)
    tokenizer = byte_level_tokenizer()
    tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


class CountingLM:
    """A `LanguageModel` over ``lm`` that counts its single-row forward passes (``passes``) and the tokens fed to
    each (``fed``), so tests can check the engine's pass accounting against counts the engine does not keep.

    Every other member is ``lm``'s: what it says of itself is read once, into plain attributes a test may
    override (``counting.max_pass_tokens = 4``), and every other call goes to it unchanged and uncounted
    (slot passes, `forward_slots`, included).
    """

    def __init__(self, lm: LanguageModel) -> None:
        self.lm = lm
        self.passes = 0
        self.fed: list[int] = []
        self.name, self.tokenizer, self.vocab = lm.name, lm.tokenizer, lm.vocab
        self.logits_width, self.max_context = lm.logits_width, lm.max_context
        self.device, self.dtype, self.kernels = lm.device, lm.dtype, lm.kernels
        self.batchable, self.batch_invariant = lm.batchable, lm.batch_invariant
        self.prefills_apart, self.max_pass_tokens = lm.prefills_apart, lm.max_pass_tokens
        self.model = getattr(lm, "model", None)  # the network: a name that is only its class names no weights

    def forward(
        self, token_ids: list[int], cache: Any, logits_to_keep: int = 1, allowed: Allowed | None = None
    ) -> torch.Tensor:
        """``lm``'s pass, counted (changes the cache and the counts)."""
        self.passes += 1
        self.fed.append(len(token_ids))
        return self.lm.forward(token_ids, cache, logits_to_keep, allowed)

    def forward_slots(
        self, windows: list[list[int]], positions: list[int] | list[list[int]], attend: torch.Tensor, cache: Any,
        rows: list[tuple[int, int]], allowed: Allowed | None = None,
    ) -> torch.Tensor:
        return self.lm.forward_slots(windows, positions, attend, cache, rows, allowed)

    def encode_prompt(self, prompt: Prompt, tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.lm.encode_prompt(prompt, tools)

    def new_cache(self) -> Any:
        return self.lm.new_cache()

    def early_exit(self, layers: int | None = None) -> LanguageModel:
        return self.lm.early_exit(layers)


class FakeKV:
    """`FakeLM`'s cache, a `structspec.models.protocol.KVCache`: the token fed at each slot, in cache order (the
    fake computes every position's logits from the tokens its position attends to)."""

    def __init__(self, tokens: list[int] | None = None) -> None:
        self.tokens = tokens if tokens is not None else []

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes the slots' token ids would take as int64. Changes nothing."""
        return 8 * len(self.tokens)

    def append_slots(self, sources: list[Any], length: int | None = None) -> None:
        """Append the slots of each of ``sources``, all or the first ``length`` of each. Changes this cache."""
        for source in sources:
            self.tokens += source.tokens[:length]

    def gather_slots(self, index: torch.Tensor) -> None:
        """Keep only the slots ``index``, in that order. Changes the cache."""
        self.tokens = [self.tokens[i] for i in index.tolist()]

    def copy_slots(self, start: int, end: int) -> FakeKV:
        """A new cache holding slots ``[start, end)``. Changes nothing."""
        return FakeKV(self.tokens[start:end])

    def crop_slots(self, length: int) -> None:
        """Keep only the first ``length`` slots. Changes the cache."""
        del self.tokens[length:]


class FakeLM:
    """A `structspec.models.protocol.LanguageModel` with made-up logits and no network: deterministic, fast, and it
    counts its forward passes (``passes``) and the tokens fed to each (``fed``), as `CountingLM` does.

    A position's logits are a standard normal draw (times 3, as `tiny_llama`'s
    logits) seeded by the prefix hash of the tokens of the slots it attends
    to, in cache order (a real model's attention does not see slot order; a
    row's slots are always in order), itself last: ``h = hash((h, token))``
    from ``seed``, folded with its position where that is not the count of
    slots attended less one. In a
    single-row `forward` it attends to every cached slot; in `forward_slots`
    to exactly the slots ``attend`` allows (a packed batch's rows, a token
    tree's paths), so the logits depend on the whole prefix, prompt included,
    and on nothing else: a cache that keeps a rejected token or loses an
    accepted one, a mask that lets a row see another's slots, or a wrong
    position changes every later choice, as it would in a real model; and a
    row gets the logits it gets alone whatever shares its pass
    (batch-invariant by construction). The tokenizer is `byte_level_tokenizer`;
    the logits are 8 ids wider than its 500 tokens, as `tiny_llama`'s are.
    Nameless by default, so no pass-cost curve is measured or read for it
    (`structspec.decoding.cost.curve_path`): what a pass feeds does not
    depend on the machine.
    """

    # The capabilities the protocol declares: rows share passes over one packed slot cache (`forward_slots`, so
    # token trees and batches run on it), the prompt prefilled with its last token, no cap on a pass, and every
    # position's logits its own whatever else a pass feeds, on the CPU in float32.
    batchable = True
    prefills_apart = False
    max_pass_tokens: int | None = None
    batch_invariant = True
    kernels = "torch"
    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, seed: int = 0, max_context: int | None = 2048, tokenizer: Any = None, name: str = "") -> None:
        self.tokenizer = tokenizer if tokenizer is not None else byte_level_tokenizer()
        self.vocab = vocab_from_tokenizer(self.tokenizer)
        self.logits_width = len(self.tokenizer) // 8 * 8 + 8
        self.max_context = max_context
        self.seed = seed
        self.name = name
        self.passes = 0
        self.fed: list[int] = []
        self._early_exits: dict[int, FakeLM] = {}  # by layer count: rows of a batch share one draft model, as `LM`'s

    encode_prompt = LM.encode_prompt  # a str as is, chat messages through the template; refusals as `LM`'s

    def new_cache(self) -> FakeKV:
        """An empty cache (`FakeKV`)."""
        return FakeKV()

    def forward(self, token_ids: list[int], cache: FakeKV, logits_to_keep: int = 1,
                allowed: Allowed | None = None) -> torch.Tensor:
        """Feed ``token_ids`` after what ``cache`` holds, each attending to every slot before it (appends their
        slots); returns the float32 logits of the last ``logits_to_keep`` positions [k, logits_width], restricted
        by ``allowed`` as `LM.forward` restricts them. Counts one pass."""
        self.passes += 1
        self.fed.append(len(token_ids))
        h = self.seed
        for token in cache.tokens:  # every cached slot, as a real model's query attends to them all
            h = hash((h, token))
        hashes = []
        for token in token_ids:
            h = hash((h, token))
            hashes.append(h)
        cache.tokens += token_ids
        return restricted(torch.stack([self._logits(h) for h in hashes[len(hashes) - logits_to_keep:]]), allowed)

    def forward_slots(self, windows: list[list[int]], positions: list[int] | list[list[int]], attend: torch.Tensor,
                      cache: FakeKV, rows: list[tuple[int, int]], allowed: Allowed | None = None) -> torch.Tensor:
        """One pass over one packed window (a `PackedSlots`' ``windows`` of one) appended to ``cache`` (appends its
        slots): token ``j`` at ``positions[0][j]`` (or ``positions[0] + j``) attends to the slots ``attend[0, j]``
        allows, cached then in-window. Returns the float32 logits of the (0, window index) pairs ``rows``,
        restricted by ``allowed``. Counts one pass. Padded windows of several rows raise NotImplementedError."""
        if len(windows) != 1:
            raise NotImplementedError("FakeLM runs one packed window per pass (PackedSlots), not padded rows")
        window, start = windows[0], positions[0]
        where = list(range(start, start + len(window))) if isinstance(start, int) else start
        if attend.shape[-1] != len(cache) + len(window):
            raise ValueError(f"the mask covers {attend.shape[-1]} slots; the cache and the window hold "
                             f"{len(cache) + len(window)}")
        self.passes += 1
        self.fed.append(len(window))
        tokens = cache.tokens + window
        attended: list[list[int]] = [[] for _ in window]
        for j, slot in attend[0].nonzero().tolist():  # row-major: each query's slots in cache order
            attended[j].append(slot)
        hashes = []
        for j, seen in enumerate(attended):
            h = self.seed
            for slot in seen:
                h = hash((h, tokens[slot]))
            if where[j] != len(seen) - 1:  # a position other than the prefix attended gives other logits
                h = hash((h, -1, where[j]))  # (ints only: a str hashes apart per process)
            hashes.append(h)
        cache.tokens += window
        if not rows:
            return torch.empty(0, self.logits_width)
        return restricted(torch.stack([self._logits(hashes[j]) for _, j in rows]), allowed)

    def _logits(self, prefix_hash: int) -> torch.Tensor:
        """The logits after a prefix of hash ``prefix_hash`` [logits_width] (ints hash alike in every process)."""
        return torch.randn(self.logits_width, generator=torch.Generator().manual_seed(prefix_hash)) * 3

    def early_exit(self, layers: int | None = None) -> FakeLM:
        """A draft model for ``draft=SelfDraft()``: a `FakeLM` with the same tokenizer and seed ``seed + layers``
        (default 1), so its logits are unrelated to this one's and its drafts mostly rejected. Made once per layer
        count, as `LM.early_exit` is (rows of a batch share it); does not change this model."""
        k = layers or 1
        if k not in self._early_exits:
            self._early_exits[k] = FakeLM(self.seed + k, self.max_context, self.tokenizer, self.name)
        return self._early_exits[k]


def restricted(logits: torch.Tensor, allowed: Any) -> torch.Tensor:
    """``logits`` with each row that ``allowed`` restricts (`structspec.models.protocol.Allowed`) set to -inf outside
    its ids, as `LM.forward` returns it: for fake LMs that make up their logits. Changes ``logits``."""
    for i, ids in enumerate(allowed or []):
        if ids is not None:
            keep = logits[i, ids].clone()
            logits[i] = float("-inf")
            logits[i, ids] = keep
    return logits
