"""Option values checked by type and range before any model call: one table of rules, one `OptionError` per
bad value, naming the option, the value and the fix.

The rules are plain data (`Rule`), read by one checker (`check_option`); `bool` is never taken for an int or a
number here, and numbers must be finite. Also here: reading a transformers ``GenerationConfig`` (or a dict of
its fields) into options, and the shapes of a prompt (`check_prompt`) and a streamer (`check_streamer`). Imports
nothing of structspec but its errors, so every wing can use it.
"""

from __future__ import annotations

import difflib
import math
import numbers
import operator
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

from structspec.errors import OptionError, PromptError

SEED_BOUNDS = (-(2**63), 2**63 - 1)
"""The seeds taken: what a ``torch.Generator`` accepts, with room for a batch's ``seed + row``."""

MIN_TEMPERATURE = 1e-5
"""Below this, sampling is argmax up to float rounding, and logits divided by it can overflow float32 (vLLM
treats temperatures under 1e-5 as greedy for the same reason)."""

MAX_TEMPERATURE = 3.4028234663852886e38
"""float32's largest finite value: logits are divided by the temperature in float32, where a larger one rounds to
inf and turns masked (-inf) logits into NaN."""


@dataclass(frozen=True)
class Rule:
    """What one option takes: a ``kind``, the closed range [``low``, ``high``] (``low`` excluded when
    ``above``), whether None is taken, and the fix the error ends in."""

    kind: Literal["int", "number", "bool", "str", "ids"]
    fix: str
    low: float = -math.inf
    high: float = math.inf
    optional: bool = False
    above: bool = False
    words: str = ""  # the range in words, where the numbers alone would mislead


RULES: dict[str, Rule] = {
    "max_new_tokens": Rule("int", "pass a whole number of tokens, e.g. max_new_tokens=256", 1),
    "do_sample": Rule("bool", "pass True, False, or None (sample when a sampling value is set)", optional=True),
    "temperature": Rule("number", "pass a number such as 0.7, or do_sample=False for greedy", MIN_TEMPERATURE,
                        MAX_TEMPERATURE, words=f"> 0 (at least {MIN_TEMPERATURE:g}) and at most {MAX_TEMPERATURE:.5g}"),
    "top_k": Rule("int", "pass a whole number of tokens such as 50, or None for no top-k", 1, optional=True),
    "top_p": Rule("number", "pass a number such as 0.9, or None for no top-p", 0, 1, optional=True, above=True),
    "seed": Rule("int", "pass a smaller int (e.g. seed % 2**63), or None", *SEED_BOUNDS, optional=True),
    "eos_token_id": Rule("ids", "pass a token id, a non-empty list of token ids, or None (the tokenizer's EOS)",
                         0, optional=True),
    "whitespace_pattern": Rule("str", "pass a regex of JSON whitespace, e.g. structspec.schema.COMPACT"),
    "strict": Rule("bool", "pass True (refuse what cannot be enforced) or False (drop it with a warning)"),
    "max_integer_digits": Rule("int", "pass a whole number of digits, or None for no bound", 1, optional=True),
    "max_fraction_digits": Rule("int", "pass a whole number of digits, or None for no bound", 1, optional=True),
    "max_recursion_depth": Rule("int", "pass a whole number of levels, e.g. 4", 1),
    "open_objects": Rule("bool", "pass True, False, or None (as the spec reads it)", optional=True),
    "output_logprobs": Rule("bool", "pass True or False"),
    "repetition_penalty": Rule("number", "pass a number such as 1.2 (1.0: no penalty)", 0, MAX_TEMPERATURE,
                               above=True, words=f"> 0 and at most {MAX_TEMPERATURE:.5g}"),
    "no_repeat_ngram_size": Rule("int", "pass a whole number of tokens such as 3, or 0 for no ban", 0),
    "batch_size": Rule("int", "pass a whole number of rows, e.g. batch_size=8", 1),
}

GREEDY_TEMPERATURE = Rule("number", "pass a number such as 0.7, or leave it out (greedy decoding reads none)", 0,
                          MAX_TEMPERATURE, words=f"≥ 0 and at most {MAX_TEMPERATURE:.5g}")
"""The temperature's rule with ``do_sample=False``, as transformers reads it: greedy decoding ignores the
temperature, so 0 (the OpenAI-style spelling of greedy) is taken too."""


def check_option(name: str, value: Any, rule: Rule | None = None) -> Any:
    """``value`` as option ``name`` takes it by ``rule`` (default: its rule in `RULES`; a numpy int as an int, an
    int temperature as a float, a tuple of ids as a list), or `OptionError` naming the option, the value, what it
    must be and the fix. Options without a rule pass as they are. Changes nothing."""
    rule = rule or RULES.get(name)
    if rule is None or (value is None and rule.optional):
        return value
    taken = _taken(rule, value)
    if taken is None:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "…"
        raise OptionError(f"{name} must be {_described(rule)}: got {shown}; {rule.fix}")
    return taken


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    """`OptionError` unless ``value`` is one of ``choices``, suggesting the nearest. Changes nothing."""
    if value not in choices:
        near = difflib.get_close_matches(value, choices, n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise OptionError(f"{name}={value!r} is not one of {', '.join(map(repr, choices))}: {hint}pass one of them")


def _taken(rule: Rule, value: Any) -> Any:
    """``value`` converted as ``rule`` takes it, or None where it is of the wrong type or out of range."""
    if rule.kind == "ids":
        many = isinstance(value, (list, tuple))
        ids = [as_int(v) for v in (value if many else [value])]
        if not ids or any(i is None or i < rule.low for i in ids):
            return None
        return ids if many else ids[0]
    if rule.kind == "bool":
        return value if isinstance(value, bool) else None
    if rule.kind == "str":
        return value if isinstance(value, str) else None
    number = as_int(value) if rule.kind == "int" else _real(value)
    if number is None or not rule.low <= number <= rule.high or (rule.above and number == rule.low):
        return None
    return number


def as_int(value: Any) -> int | None:
    """``value`` as an int if it is of an integer type other than bool (a numpy int, a 0-d integer tensor), else
    None. Changes nothing."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _real(value: Any) -> float | None:
    """``value`` as a float if it is a finite real number other than bool (an int, a float, a numpy number)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        return None
    return number if math.isfinite(number) else None


def _described(rule: Rule) -> str:
    """What ``rule`` takes, in words: the range first (as "≥ 1"), then the type."""
    if rule.kind in ("bool", "str"):
        words = f"a {rule.kind}"
    elif rule.kind == "ids":
        words = "a token id (an int ≥ 0, not a bool) or a non-empty list of them"
    else:
        if rule.words:
            span = rule.words
        elif math.isinf(rule.high):
            span = f"{'>' if rule.above else '≥'} {_bound(rule.low)}"
        else:
            span = f"in {'(' if rule.above else '['}{_bound(rule.low)}, {_bound(rule.high)}]"
        words = f"{span} ({'an int' if rule.kind == 'int' else 'a finite number'}, not a bool)"
    return words + (", or None" if rule.optional else "")


def _bound(bound: float) -> str:
    """A range end as written in a message: 2**63 - 1 as such, not as its 19 digits."""
    if isinstance(bound, int) and abs(bound) >= 2**62:
        return f"{'-' if bound < 0 else ''}2**63{' - 1' if bound > 0 else ''}"
    return f"{bound:g}" if isinstance(bound, float) else str(bound)


def check_prompt(prompt: Any) -> None:
    """`PromptError`, with the fix, unless ``prompt`` is a str or a non-empty list of messages (dicts whose
    ``role`` and ``content`` are str). Changes nothing; an empty str is the model's to refuse."""
    if isinstance(prompt, str):
        return
    if isinstance(prompt, dict):
        raise PromptError("the prompt is one message (a dict): wrap it in a list, [message]")
    if not isinstance(prompt, list):
        raise PromptError(f"the prompt is of type {type(prompt).__name__}: pass a str or a list of "
                          "{'role': str, 'content': str} messages")
    if not prompt:
        raise PromptError("the prompt is an empty list of messages: pass at least one {'role', 'content'} message")
    for i, message in enumerate(prompt):
        if not isinstance(message, dict):
            raise PromptError(f"message {i} of the prompt is of type {type(message).__name__}, not a dict: pass "
                              "{'role': str, 'content': str} messages")
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                got = "is missing" if key not in message else f"is of type {type(message[key]).__name__}"
                raise PromptError(f"message {i} of the prompt: its {key!r} {got}; give each message a str "
                                  f"{key!r} (e.g. {{'role': 'user', 'content': 'text'}})")


def model_argument(model: Any, argument: str = "model") -> Any:
    """``model`` as the calls take it: a loaded model (anything with a ``vocab``, as `structspec.load` returns) as
    it is, a name or a path (``os.PathLike``) as a str; `OptionError`, with the fix, for anything else (None, a
    number). Changes nothing."""
    if isinstance(model, str):
        return model
    if isinstance(model, os.PathLike):
        return os.fspath(model)
    if model is None or isinstance(model, (bool, numbers.Number, bytes, list, tuple, dict)) or not hasattr(model,
                                                                                                        "vocab"):
        raise OptionError(f"{argument} must be a loaded model or a model's name, got {_shown(model)}; pass "
                          f"structspec.load('smollm2-135m') or the name itself ('smollm2-135m', a local model "
                          "directory or a hub id)")
    return model


def _shown(value: Any) -> str:
    """``value`` named for a message: short values as they are, others by type."""
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def check_streamer(streamer: Any) -> None:
    """`OptionError` unless ``streamer`` is None or has callable ``put`` and ``end`` (transformers' streamer
    convention: ``TextStreamer``, ``TextIteratorStreamer``). Changes nothing."""
    if streamer is None:
        return
    missing = [name for name in ("put", "end") if not callable(getattr(streamer, name, None))]
    if missing:
        raise OptionError(f"streamer= is of type {type(streamer).__name__}, which has no {' or '.join(missing)} "
                          "method: pass a transformers streamer (e.g. TextStreamer(tokenizer)) or an object with "
                          "put(ids) and end(), or use structspec.stream for events")


class ListsSetFields(Protocol):
    """A transformers ``GenerationConfig``, or anything that lists its set fields the same way."""

    def to_diff_dict(self) -> dict[str, Any]: ...


GenerationConfigLike: TypeAlias = ListsSetFields | Mapping[str, Any]
"""What ``generation_config=`` takes: a transformers ``GenerationConfig`` or a dict of its fields."""


def implies_sampling(temperature: float, top_k: int | None, top_p: float | None) -> bool:
    """structspec's rule for ``do_sample=None``: sample when a sampling value is set."""
    return temperature != 1.0 or top_k is not None or top_p is not None


# GenerationConfig fields structspec reads, by the option they set.
CONFIG_HONOURED = ("max_new_tokens", "do_sample", "temperature", "top_k", "top_p", "eos_token_id",
                   "repetition_penalty", "no_repeat_ngram_size")
# Fields that change nothing structspec outputs: bookkeeping, caching, what transformers returns.
_CONFIG_IGNORED = frozenset({
    "transformers_version", "_from_model_config", "bos_token_id", "pad_token_id", "decoder_start_token_id",
    "use_cache", "cache_implementation", "cache_config", "compile_config", "disable_compile",
    "return_dict_in_generate", "output_scores", "output_logits", "output_attentions", "output_hidden_states",
})
# Fields structspec does not do, at the value that turns them off; any other field must be unset (None).
_CONFIG_NEUTRAL: dict[str, Any] = {
    "num_beams": 1, "num_beam_groups": 1, "num_return_sequences": 1, "early_stopping": False,
    "length_penalty": 1.0, "diversity_penalty": 0.0, "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0, "min_length": 0, "min_new_tokens": 0,
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "guidance_scale": 1.0,
    "renormalize_logits": False, "remove_invalid_values": False, "token_healing": False,
}


def from_generation_config(config: GenerationConfigLike) -> dict[str, Any]:
    """The honoured fields ``config`` (a ``GenerationConfig`` or a dict of its fields) sets, by option name;
    `OptionError` naming the first field set to something structspec does not do, or a config of another type.
    Does not change the config."""
    if isinstance(config, Mapping):
        fields = dict(config)
    elif callable(getattr(config, "to_diff_dict", None)):
        fields = config.to_diff_dict()
    else:
        raise OptionError(f"generation_config got a {type(config).__name__}: pass a transformers GenerationConfig, "
                          "a dict of its fields (e.g. {'max_new_tokens': 64}), or None")
    taken: dict[str, Any] = {}
    for name, value in fields.items():
        if not isinstance(name, str):
            raise OptionError(f"generation_config has the key {name!r}: name its fields by str, as "
                              "GenerationConfig does (e.g. {'max_new_tokens': 64})")
        if value is None or name in _CONFIG_IGNORED:
            continue
        if name in CONFIG_HONOURED:
            taken[name] = value
        elif name not in _CONFIG_NEUTRAL or value != _CONFIG_NEUTRAL[name]:
            fix = "set max_new_tokens instead" if name == "max_length" else "unset it"
            raise OptionError(
                f"generation_config.{name}={value!r} is not supported by structspec: {fix} (structspec reads "
                f"{', '.join(CONFIG_HONOURED)})"
            )
    return taken
