"""The options of a call, said once: `CompileOptions` (what the token FSM depends on) and `GenerateOptions` (how
one compiled spec decodes), frozen dataclasses with each option's default; the keywords every entry point takes,
typed once as `CompileKeywords`, `GenerateKeywords`, `BatchKeywords` and the one-liners' unions of them
(``**keywords: Unpack[...]``); and what each entry point calls once: `checked_keywords` (names checked, a
transformers ``GenerationConfig`` read into them), then `options_in` (the dataclasses built, values checked).

Each option's type and range is checked by the rule table in `structspec.checks`, when the dataclass is made:
before any model loads.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypedDict, TypeVar

from structspec.checks import (
    GREEDY_TEMPERATURE,
    RULES,
    GenerationConfigLike,
    Rule,
    check_option,
    check_streamer,
    from_generation_config,
    implies_sampling,
)
from structspec.decoding.drafters.factory import Draft, check_draft
from structspec.decoding.fastforward import FastForward
from structspec.decoding.repetition import Repetition
from structspec.decoding.row import DecodeOptions
from structspec.decoding.sampling import SamplingConfig
from structspec.errors import OptionError
from structspec.schema import COMPACT
from structspec.schema.bounds import MAX_FRACTION_DIGITS, MAX_INTEGER_DIGITS
from structspec.schema.recursion import MAX_RECURSION_DEPTH


def _checked_fields(options: Any, rules: Mapping[str, Rule] = RULES) -> None:
    """Check (and convert, as its rule in ``rules`` takes it) each field of the frozen ``options`` that has one."""
    for name in [f.name for f in fields(options) if f.name in rules]:
        value = check_option(name, getattr(options, name), rules[name])
        object.__setattr__(options, name, value)  # frozen: set once, here


@dataclass(frozen=True)
class CompileOptions:
    """The keywords of `structspec.compile`: what the token FSM depends on. Checked when made.

    ``whitespace_pattern`` is the JSON layout (compact by default). ``strict=False`` drops schema keywords
    structspec cannot enforce, with a warning, instead of raising `SchemaError`. Numbers the schema leaves
    unbounded get at most ``max_integer_digits`` integer and ``max_fraction_digits`` fraction digits (None lifts a
    bound); a recursive ``$ref`` nests at most ``max_recursion_depth`` levels; ``open_objects`` (True / False)
    overrides whether objects admit members they do not list. ``eos_token_id`` (an id or a list, as
    transformers takes it) names the tokens that end the output (default: the tokenizer's EOS).
    """

    whitespace_pattern: str = COMPACT
    strict: bool = True
    max_integer_digits: int | None = MAX_INTEGER_DIGITS
    max_fraction_digits: int | None = MAX_FRACTION_DIGITS
    eos_token_id: int | list[int] | None = None
    max_recursion_depth: int = MAX_RECURSION_DEPTH
    open_objects: bool | None = None

    def __post_init__(self) -> None:
        _checked_fields(self)

    @classmethod
    def of(cls, keywords: Mapping[str, Any], generation_config: GenerationConfigLike | None = None) -> CompileOptions:
        """The options ``keywords`` name, ``generation_config``'s ``eos_token_id`` where no keyword does, defaults
        elsewhere. `OptionError` for an unknown keyword. Does not change the config."""
        return cls(**_given(cls, keywords, generation_config))


@dataclass(frozen=True)
class GenerateOptions:
    """How a compiled spec decodes: the keywords of a `Compiled` call (and the decode keywords of `generate`,
    `generate_result`, `stream`, `generate_batch`, `iter_batch`). Checked when made, before any model loads.

    ``do_sample=None`` samples when ``temperature``, ``top_k`` or ``top_p`` is set and decodes greedily
    otherwise; ``do_sample=False`` reads no temperature, so it takes any from 0 up, as transformers does.
    ``seed`` seeds the sampler. ``fast_forward`` ("off" or "exact") says whether tokens the FSM forces are
    appended without a model call. ``draft`` says where speculative drafts come from: ``"prompt_lookup"`` (the
    default: copies from the prompt, free and lossless), ``"lookahead"`` (n-grams from the target's own Jacobi
    step, verified in one token tree; greedy rows), ``"auto"`` (prompt lookup, plus self-draft on a GPU), a
    loaded LM (a draft model; another tokenizer is translated through text), a drafter object
    (`TreeDrafter()`, `SelfDraft()`, `Staged()`, any `Drafter`; not its class), or None (no drafts). Drafts
    are verified by the target, so greedy output is token-identical whatever the drafter.
    ``output_logprobs=True`` fills ``Result.logprobs``: each output token's log-probability under the target's
    masked (repetition-controlled and, when sampling, warped) distribution at the pass that chose or verified it
    (0.0 for tokens the FSM forced). ``repetition_penalty`` (1.0: none) and ``no_repeat_ngram_size`` (0: none) are transformers'
    repetition controls with its semantics: every token of the prompt and the output so far is penalized, and
    every token that would repeat an n-gram of them is banned (unless the schema allows nothing else); they
    apply at every position the model chooses, each from its own prefix, so greedy output stays the same in
    every mode (`structspec.decoding.repetition`). Tokens the FSM forces are not penalized, but count after.
    """

    max_new_tokens: int = 512
    do_sample: bool | None = None
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    fast_forward: FastForward = "exact"
    draft: Draft = "prompt_lookup"
    repetition_penalty: float = 1.0
    no_repeat_ngram_size: int = 0
    output_logprobs: bool = False

    def __post_init__(self) -> None:
        # greedy decoding reads no temperature, so transformers' do_sample=False, temperature=0 is taken
        greedy = self.do_sample is False
        _checked_fields(self, {**RULES, "temperature": GREEDY_TEMPERATURE} if greedy else RULES)
        check_draft(self.draft)
        do_sample = self.do_sample
        if do_sample is None:
            do_sample = implies_sampling(self.temperature, self.top_k, self.top_p)
        sampling = SamplingConfig(True, self.temperature, self.top_k, self.top_p) if do_sample else SamplingConfig()
        # made once, here (it checks fast_forward): not a field, so `fields` lists the options only
        repetition = Repetition(self.repetition_penalty, self.no_repeat_ngram_size)
        object.__setattr__(self, "_decode", DecodeOptions(self.max_new_tokens, sampling, self.seed,
                                                          self.fast_forward, self.output_logprobs, repetition))

    @classmethod
    def of(cls, keywords: Mapping[str, Any], generation_config: GenerationConfigLike | None = None) -> GenerateOptions:
        """The options ``keywords`` name, the honoured fields of ``generation_config`` where no keyword is
        given, defaults elsewhere. `OptionError` for an unknown keyword or a config field structspec does not
        do. Does not change the config."""
        return cls(**_given(cls, keywords, generation_config))

    def decode_options(self) -> DecodeOptions:
        """What the decode loop needs of these options (made once, with them). Changes nothing."""
        return self._decode  # type: ignore[attr-defined,no-any-return]


class CompileKeywords(TypedDict, total=False):
    """The keywords of `structspec.compile`, typed: `CompileOptions`' fields (their defaults and meaning)."""

    whitespace_pattern: str
    strict: bool
    max_integer_digits: int | None
    max_fraction_digits: int | None
    eos_token_id: int | list[int] | None
    max_recursion_depth: int
    open_objects: bool | None


class BatchKeywords(TypedDict, total=False):
    """The decode keywords of a batch (`Compiled.batch`): `GenerateOptions`' fields but ``output_logprobs``."""

    max_new_tokens: int
    do_sample: bool | None
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int | None
    fast_forward: FastForward
    draft: Draft
    repetition_penalty: float
    no_repeat_ngram_size: int


class GenerateKeywords(BatchKeywords, total=False):
    """The keywords of a compiled spec's call (`Compiled.result`), typed: `GenerateOptions`' fields."""

    output_logprobs: bool


class OneLinerKeywords(GenerateKeywords, CompileKeywords, total=False):
    """The keywords of `structspec.generate_result`, `generate` and `stream`: compile and decode options."""


class BatchOneLinerKeywords(BatchKeywords, CompileKeywords, total=False):
    """The keywords of `structspec.generate_batch` and `iter_batch`: compile and a batch's decode options."""


def checked_keywords(
    keywords: Mapping[str, Any], taken: type[Any], generation_config: GenerationConfigLike | None = None,
    streamer: Any = None,
) -> dict[str, Any]:
    """A call's ``keywords`` checked by name against those of ``taken`` (one of the keyword TypedDicts), completed
    from ``generation_config``'s honoured fields where unset; ``streamer`` checked too. An unknown keyword is an
    `OptionError` naming the options (a compile option given to a compiled spec's call, one saying to compile
    again), not Python's TypeError. Values are checked when `options_in` builds the options. Changes nothing."""
    names = list(taken.__annotations__)  # (a TypedDict's annotations include its bases')
    for name in keywords:
        if name not in names:
            raise _unknown(name, names)
    check_streamer(streamer)
    return dict(keywords) if generation_config is None else with_config(keywords, generation_config, names)


Options = TypeVar("Options", CompileOptions, GenerateOptions)


def options_in(cls: type[Options], keywords: Mapping[str, Any]) -> Options:
    """``cls`` made of the fields among ``keywords`` (checked by `checked_keywords`), defaults elsewhere."""
    names = {f.name for f in fields(cls)}
    return cls(**{name: value for name, value in keywords.items() if name in names})


def with_config(keywords: Mapping[str, Any], config: GenerationConfigLike, names: list[str]) -> dict[str, Any]:
    """``keywords``, and the honoured fields of ``config`` among ``names`` that they leave unset. `OptionError`
    naming a config field structspec does not do. Changes neither."""
    taken = from_generation_config(config)
    if "do_sample" not in taken and "do_sample" not in keywords:
        # transformers' rule for the config (sampling only with do_sample=True); structspec's for keywords
        taken["do_sample"] = implies_sampling(
            keywords.get("temperature", 1.0), keywords.get("top_k"), keywords.get("top_p"))
    if not {**taken, **keywords}["do_sample"]:  # greedy: transformers ignores the config's sampling values
        for name in ("temperature", "top_k", "top_p"):
            taken.pop(name, None)
    return {**{name: value for name, value in taken.items() if name in names}, **keywords}


def _given(cls: type[Any], keywords: Mapping[str, Any], config: GenerationConfigLike | None) -> dict[str, Any]:
    """``keywords``, checked by name against ``cls``'s fields, completed from ``config``."""
    names = [f.name for f in fields(cls)]
    for name in keywords:
        if name not in names:
            raise _unknown(name, names)
    return dict(keywords) if config is None else with_config(keywords, config, names)


_COMPILE_NAMES = tuple(f.name for f in fields(CompileOptions))
_DECODE_NAMES = tuple(f.name for f in fields(GenerateOptions))


def _unknown(name: str, names: list[str]) -> OptionError:
    """The error for keyword ``name`` where only ``names`` are taken."""
    if name in _COMPILE_NAMES:
        return OptionError(f"{name} is a compile option, and this spec is compiled already: compile again with it, "
                           f"structspec.compile(spec, lm, {name}=...)")
    if name in _DECODE_NAMES and not set(_DECODE_NAMES) & set(names):
        return OptionError(f"{name} is an option of a call, not of compile: pass it when calling what compile "
                           f"returns, e.g. person = structspec.compile(spec, lm); person(prompt, {name}=...)")
    near = difflib.get_close_matches(name, names, n=1)
    hint = f"did you mean {near[0]!r}? " if near else ""
    return OptionError(f"unknown option {name!r}: {hint}the options are {', '.join(names)}")
