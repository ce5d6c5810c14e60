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

    def crop(self, cache: Any, length: int) -> None:
        self.lm.crop(cache, length)

    def early_exit(self, layers: int | None = None) -> LanguageModel:
        return self.lm.early_exit(layers)


class FakeLM:
    """A `structspec.models.protocol.LanguageModel` with made-up logits and no network: deterministic, fast, and it counts
    its forward passes (``passes``) and the tokens fed to each (``fed``), as `CountingLM` does.

    Its cache holds one prefix hash per position fed: position t's hash combines
    position t − 1's with token t (from ``seed`` at position 0), and seeds the
    standard normal draw (times 3, as `tiny_llama`'s logits) of the logits that
    follow it. So every position's logits depend on the whole prefix, prompt
    included: a cache that keeps a rejected token, or loses an accepted one,
    changes every later choice. The tokenizer is `byte_level_tokenizer`; the
    logits are 8 ids wider than its 500 tokens, as `tiny_llama`'s are.
    """

    # The capabilities the protocol declares: one row per pass (no slot cache, so no token trees and no
    # batched passes), the prompt prefilled with its last token, no cap on a pass, and every position's logits
    # its own whatever else a pass feeds (batch-invariant by construction), on the CPU in float32.
    batchable = False
    prefills_apart = False
    max_pass_tokens: int | None = None
    batch_invariant = True
    kernels = "torch"
    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, seed: int = 0, max_context: int | None = 2048, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer if tokenizer is not None else byte_level_tokenizer()
        self.vocab = vocab_from_tokenizer(self.tokenizer)
        self.logits_width = len(self.tokenizer) // 8 * 8 + 8
        self.max_context = max_context
        self.seed = seed
        self.name = f"fake-lm-{seed}"
        self.passes = 0
        self.fed: list[int] = []

    encode_prompt = LM.encode_prompt  # a str as is, chat messages through the template; refusals as `LM`'s

    def new_cache(self) -> list[int]:
        """An empty cache: the list of prefix hashes, one per position fed."""
        return []

    def forward(self, token_ids: list[int], cache: list[int], logits_to_keep: int = 1,
                allowed: Any = None) -> torch.Tensor:
        """Feed ``token_ids`` after what ``cache`` holds (appends their prefix hashes to it); returns the float32
        logits of the last ``logits_to_keep`` positions [k, logits_width], restricted by ``allowed`` as
        `LM.forward` restricts them. Counts one pass."""
        self.passes += 1
        self.fed.append(len(token_ids))
        for token in token_ids:
            cache.append(hash((cache[-1] if cache else self.seed, token)))  # ints hash alike in every process
        rows = [torch.randn(self.logits_width, generator=torch.Generator().manual_seed(h)) * 3
                for h in cache[len(cache) - logits_to_keep:]]
        return restricted(torch.stack(rows), allowed)

    def forward_slots(self, windows: list[list[int]], positions: list[int] | list[list[int]], attend: torch.Tensor,
                      cache: Any, rows: list[tuple[int, int]], allowed: Any = None) -> torch.Tensor:
        """Not available: a `FakeLM` runs one row per pass (``batchable`` is False, so the loop never calls
        this). Raises NotImplementedError."""
        raise NotImplementedError("FakeLM runs one row per pass (batchable=False): use tiny_lm for batches")

    @staticmethod
    def crop(cache: list[int], length: int) -> None:
        """Drop cached positions from ``length`` on (in place)."""
        del cache[length:]

    def early_exit(self, layers: int | None = None) -> FakeLM:
        """A draft model for ``draft=SelfDraft()``: a `FakeLM` with the same tokenizer and seed ``seed + layers``
        (default 1), so its logits are unrelated to this one's and its drafts mostly rejected."""
        return FakeLM(self.seed + (layers or 1), self.max_context, self.tokenizer)


def restricted(logits: torch.Tensor, allowed: Any) -> torch.Tensor:
    """``logits`` with each row that ``allowed`` restricts (`structspec.models.protocol.Allowed`) set to -inf outside
    its ids, as `LM.forward` returns it: for fake LMs that make up their logits. Changes ``logits``."""
    for i, ids in enumerate(allowed or []):
        if ids is not None:
            keep = logits[i, ids].clone()
            logits[i] = float("-inf")
            logits[i, ids] = keep
    return logits
