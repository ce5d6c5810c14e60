"""Tiny, deterministic, offline tokenizers and models for tests.

Nothing is downloaded: both tokenizers are trained in-process on a fixed
built-in corpus, and the models have random weights from a fixed seed. They
cover the two tokenizer families `structspec.vocab` handles:

* `byte_level_tokenizer`: byte-level BPE like GPT-2, SmolLM2 and Qwen;
* `sentencepiece_tokenizer`: BPE with ``▁`` spaces and ``<0xNN>`` byte fallback
  like Llama 2 and Gemma.

`CountingLM` wraps an LM to count forward passes independently of the engine; `in_layout` writes a JSON
value as structspec writes it for a schema.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from structspec.models.invariance import make_batch_invariant
from structspec.models.protocol import Allowed, LanguageModel, Prompt
from structspec.models.transformers_lm import LM, from_transformers
from structspec.vocab import vocab_from_tokenizer

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

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        return self.lm.encode_prompt(prompt)

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


def exact_output_distribution(
    lm: Any, fsm: Any, prompt_ids: list[int], sampling: Any, min_prob: float = 1e-9
) -> dict[tuple[int, ...], float]:
    """The exact distribution of complete outputs of plain masked sampling, by enumerating the token tree.

    Mirrors the decode loop: a state that allows only EOS ends the output
    without a draw; elsewhere the next token (EOS included where the state is
    final) is drawn from the masked, warped logits. Branches below
    ``min_prob`` are dropped, so keep the language small.
    """
    from structspec.decoding.sampling import probabilities

    out: dict[tuple[int, ...], float] = {}
    stack: list[tuple[tuple[int, ...], int, float]] = [((), fsm.initial_state, 1.0)]
    while stack:
        prefix, state, prob = stack.pop()
        if fsm.is_complete(state):
            out[prefix] = out.get(prefix, 0.0) + prob
            continue
        logits = lm.forward(list(prompt_ids) + list(prefix), lm.new_cache())[-1:]
        fsm.mask_logits_inplace(logits, [state])
        p = probabilities(logits[0], sampling).double()
        for token in torch.nonzero(p * prob > min_prob).flatten().tolist():
            if token in fsm.eos_token_ids:
                out[prefix] = out.get(prefix, 0.0) + prob * float(p[token])
            else:
                stack.append((prefix + (token,), fsm.next_state(state, token), prob * float(p[token])))
    return out


def sample_outputs(
    lm: Any, spec: Any, prompt: str, drafter: Any, samples: int, temperature: float
) -> tuple[Counter[tuple[int, ...]], int, int]:
    """Complete outputs of ``samples`` seeded runs (seeds 0..samples-1, plain masked decoding plus ``drafter``),
    counted by token ids, with the draft tokens proposed and accepted over all runs."""
    from structspec.api import generate_result

    counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    for seed in range(samples):
        r = generate_result(lm, spec, prompt, temperature=temperature, seed=seed, draft=drafter,
                            fast_forward="off", max_new_tokens=10)
        counts[tuple(r.token_ids)] += 1
        drafted += sum(d.drafted for d in r.stats.drafts.values())
        accepted += sum(d.accepted for d in r.stats.drafts.values())
    return counts, drafted, accepted


def chi_square_pvalue(counts: dict[Any, int], probs: dict[Any, float]) -> float:
    """Pearson's goodness-of-fit p-value of ``counts`` against ``probs``.

    Outcomes with an expected count under 5 are pooled into one bin, as the
    test requires; an observed outcome with probability 0 gives p = 0.
    """
    n = sum(counts.values())
    if any(k not in probs for k in counts):
        return 0.0
    bins: list[tuple[float, int]] = []
    pooled_e, pooled_o = 0.0, 0
    for k, p in probs.items():
        if n * p >= 5:
            bins.append((n * p, counts.get(k, 0)))
        else:
            pooled_e += n * p
            pooled_o += counts.get(k, 0)
    if pooled_e > 0:
        bins.append((pooled_e, pooled_o))
    stat = sum((o - e) ** 2 / e for e, o in bins)
    dof = len(bins) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def divergence_margin(lm: Any, fsm: Any, prompt_ids: list[int], ours: list[int], theirs: list[int]) -> float | None:
    """At the first position where two outputs of ``fsm``'s language differ, the gap between the two best
    allowed logits of ``lm`` (plain decoding, one pass over the common prefix); None if neither differs.

    A small gap is a near-tie that float rounding (another batch shape or
    dtype) may flip; a large one is a real difference.
    """
    i = next((k for k, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
    if ours == theirs:
        return None
    prefix = ours[:i]
    logits = lm.forward(list(prompt_ids) + prefix, lm.new_cache())[-1:].float()
    state = fsm.walk(fsm.initial_state, prefix)[-1] if prefix else fsm.initial_state
    fsm.mask_logits_inplace(logits, [state])
    top = logits[0].topk(2).values
    return float(top[0] - top[1])


def in_layout(value: Any, node: Any, root: Any) -> str:
    """``value`` as structspec writes it: compact JSON, object keys in the schema's ``properties`` order."""
    return json.dumps(_ordered(value, node, root), separators=(",", ":"), ensure_ascii=False)


def _ordered(value: Any, node: Any, root: Any, depth: int = 0) -> Any:
    node = _resolve(node, root)
    if depth > 50 or not isinstance(node, dict):
        return value
    if isinstance(value, dict):
        props = _properties_for(value, node, root)
        keys = [k for k in props if k in value] + [k for k in value if k not in props]
        extra = node.get("additionalProperties", True)
        return {k: _ordered(value[k], props.get(k, extra), root, depth + 1) for k in keys}
    if isinstance(value, list):
        prefix = node.get("prefixItems") or (node["items"] if isinstance(node.get("items"), list) else [])
        rest = node.get("items") if isinstance(node.get("items"), dict) else True
        return [_ordered(v, prefix[i] if i < len(prefix) else rest, root, depth + 1) for i, v in enumerate(value)]
    return value


def _properties_for(value: dict[str, Any], node: dict[str, Any], root: Any) -> dict[str, Any]:
    """The ``properties`` of ``node``, or of its first branch whose properties cover ``value``'s keys."""
    if "properties" in node:
        return node["properties"]
    branches = [_resolve(b, root) for k in ("allOf", "anyOf", "oneOf") for b in node.get(k, [])]
    with_props = [b for b in branches if isinstance(b, dict) and isinstance(b.get("properties"), dict)]
    for b in with_props:
        if set(value) <= set(b["properties"]):
            return b["properties"]
    return with_props[0]["properties"] if with_props else {}


def _resolve(node: Any, root: Any) -> Any:
    for _ in range(20):
        if not (isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#")):
            return node
        target = root
        for part in filter(None, node["$ref"][1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        node = target
    return node
