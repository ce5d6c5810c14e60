"""Two tiny tokenizers trained in-process on a fixed built-in corpus (nothing is downloaded), covering the two
families `structspec.vocab` handles: byte-level BPE (GPT-2, SmolLM2, Qwen) and BPE with ``▁`` spaces and
``<0xNN>`` byte fallback (Llama 2, Gemma)."""

from __future__ import annotations

import json
from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

_NAMES = ["Alice", "Bob", "Carol", "Dave", "Eve", "Frank", "Grace", "Heidi", "Ivan", "Judy"]
_CITIES = ["Paris", "London", "Tokyo", "Berlin", "Oslo", "Lima", "Rome", "Cairo"]
_COLORS = ["red", "green", "blue", "black", "white"]
_SIZES = ["small", "medium", "large"]
_STATUSES = ["active", "inactive", "pending", "done"]
_SENTENCES = [
    "Alice is 31 years old and lives in Paris.",
    "Bob is 45. He works in London as a teacher.",
    "Return the answer as JSON with the keys name, age and city.",
    "The order has three items: a red shirt, a blue hat and a large bag.",
    "Extract the fields from the text below. Use null when a value is missing.",
    "The status is active, the score is 0.75 and the price is 12.50 dollars.",
    "Is the answer true or false? Answer with one word.",
    "She said: \"I'll be there at 10:30, don't wait.\"",
    "Le café est très bon, naïve résumé à Zürich.",
    "User: what is the weather in Tokyo today? Assistant: it is sunny.",
]


def _corpus() -> list[str]:
    """Compact and spaced JSON records plus English sentences; fixed, so training is deterministic."""
    lines = list(_SENTENCES)
    for i, name in enumerate(_NAMES):
        record = {
            "name": name,
            "age": 18 + 7 * i,
            "city": _CITIES[i % len(_CITIES)],
            "email": f"{name.lower()}@example.com",
            "color": _COLORS[i % len(_COLORS)],
            "size": _SIZES[i % len(_SIZES)],
            "status": _STATUSES[i % len(_STATUSES)],
            "active": i % 2 == 0,
            "score": round(0.1 * i + 0.05, 2),
            "tags": ["a", "b"][: i % 3],
            "id": 1000 + i,
            "note": None,
        }
        lines.append(json.dumps(record, separators=(",", ":")))
        lines.append(json.dumps(record))
        lines.append(json.dumps({"name": name, "age": 20 + i}, separators=(",", ":")))
        lines.append(f"{name} is {20 + i} years old and lives in {_CITIES[i % len(_CITIES)]}.")
    return lines * 3


_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<eos>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@lru_cache(maxsize=1)
def _byte_level_json() -> str:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<eos>", "<bos>", "<|im_start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    return tok.to_str()


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2/SmolLM2/Qwen style) of 500 tokens, with a ChatML-like template.

    Special tokens: ``<eos>`` (EOS, id 0), ``<bos>`` (BOS, id 1, not added by
    encoding) and ``<|im_start|>`` (id 2). All 256 bytes are in the vocabulary.
    Every call returns a fresh tokenizer with the same vocabulary.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_byte_level_json()),
        eos_token="<eos>",
        bos_token="<bos>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=_CHATML,
    )


@lru_cache(maxsize=1)
def _sentencepiece_json() -> str:
    # Train word pieces with "▁" as the word-start marker, then lay the vocabulary
    # out like Llama 2: <unk>, <s>, </s>, the 256 <0xNN> byte tokens, then the pieces.
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trained.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=300, show_progress=False))
    model = json.loads(trained.to_str())["model"]
    pieces = sorted(model["vocab"], key=model["vocab"].__getitem__)
    names = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    vocab = {name: i for i, name in enumerate(names)}
    merges = [tuple(m) for m in model["merges"]]

    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<unk>", "<s>", "</s>"])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok.to_str()


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A SentencePiece-style BPE tokenizer (Llama 2's tokenizer.json layout) of 559 tokens.

    The normalizer prepends ``▁`` to the text and turns spaces into ``▁``; the
    decoder turns them back and strips the one leading space. Characters outside
    the vocabulary fall back to the byte tokens ``<0x00>``..``<0xFF>`` (ids
    3..258, ordinary vocabulary entries). Special tokens: ``<unk>`` (0), ``<s>``
    (BOS, 1, added by encoding) and ``</s>`` (EOS, 2). No chat template.
    Every call returns a fresh tokenizer with the same vocabulary.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_sentencepiece_json()),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )
