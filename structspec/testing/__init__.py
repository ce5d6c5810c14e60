"""Tiny, deterministic, offline tokenizers and models for tests.

Nothing is downloaded: both tokenizers are trained in-process on a fixed
built-in corpus, and the models have random weights from a fixed seed. They
cover the two tokenizer families `structspec.vocab` handles:

* `byte_level_tokenizer`: byte-level BPE like GPT-2, SmolLM2 and Qwen;
* `sentencepiece_tokenizer`: BPE with ``▁`` spaces and ``<0xNN>`` byte fallback
  like Llama 2 and Gemma.

`CountingLM` wraps an LM to count forward passes independently of the engine; `FakeLM` makes up its logits
from a hash of the tokens each position attends to (no model; it batches, over its cache `FakeKV`); the oracles
(exact output distributions, chi-square p-values) check sampling; `in_layout` writes a JSON value as structspec writes it for a schema.
"""

from structspec.testing.layout import in_layout
from structspec.testing.models import CountingLM, FakeKV, FakeLM, restricted, save_tiny_model, tiny_llama, tiny_lm
from structspec.testing.oracles import chi_square_pvalue, divergence_margin, exact_output_distribution, sample_outputs
from structspec.testing.tokenizers import byte_level_tokenizer, sentencepiece_tokenizer

__all__ = [
    "CountingLM", "FakeKV", "FakeLM", "byte_level_tokenizer", "chi_square_pvalue", "divergence_margin",
    "exact_output_distribution", "in_layout", "restricted", "sample_outputs", "save_tiny_model",
    "sentencepiece_tokenizer", "tiny_llama", "tiny_lm",
]
