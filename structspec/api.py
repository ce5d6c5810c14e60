"""The public entry points: `compile`, `generate` and `generate_result`.

Typical use::

    import structspec
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    lm = structspec.load("smollm2-135m")
    person = structspec.generate(lm, Person, "Alice is 31. As JSON:")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structspec.decoding.loop import decode
from structspec.decoding.row import DecodeOptions
from structspec.decoding.drafters import Drafter, make_drafter
from structspec.decoding.fastforward import FastForward
from structspec.automaton.fsm import TokenFSM
from structspec.errors import TokenBudgetExceeded
from structspec.lm import LM, Prompt, load
from structspec.result import Result
from structspec.decoding.sampling import SamplingConfig
from structspec.schema.translate import COMPACT, Constraint, constraint_of


@dataclass(frozen=True)
class Compiled:
    """A spec compiled for one tokenizer: the constraint (regex, parser) and its token FSM."""

    constraint: Constraint
    fsm: TokenFSM


def compile(spec: Any, model: LM | str, whitespace_pattern: str = COMPACT, strict: bool = True) -> Compiled:  # noqa: A001
    """Compile ``spec`` into a token FSM for ``model``'s tokenizer (cached in memory and on disk).

    ``strict=False`` drops schema keywords structspec cannot enforce, with a
    warning naming each keyword and its JSON pointer, instead of raising
    `SchemaError`.

    Pay and measure the compile cost ahead of generation; ``fsm.info`` says how
    long it took and whether it came from the cache.
    """
    lm = load(model) if isinstance(model, str) else model
    constraint = constraint_of(spec, whitespace_pattern, strict)
    return Compiled(constraint, TokenFSM.from_regex(constraint.regex, lm.vocab, lm.logits_width))


def generate_result(
    model: LM | str,
    spec: Any,
    prompt: Prompt,
    *,
    max_new_tokens: int = 512,
    do_sample: bool | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    whitespace_pattern: str = COMPACT,
    strict: bool = True,
    fast_forward: FastForward = "exact",
    draft: Drafter | LM | str | None = None,
) -> Result:
    """Generate output that matches ``spec`` and return it with its tokens and stats.

    ``do_sample=None`` samples when ``temperature``, ``top_k`` or ``top_p`` is set
    and decodes greedily otherwise. ``fast_forward`` ("off", "exact", "canonical")
    says how tokens the FSM forces are appended without a model call; ``strict``
    is as in `compile`. ``draft`` turns
    on speculative decoding: a loaded LM (draft model; another tokenizer is
    translated through text), ``"prompt_lookup"``, ``"self"`` (the target's
    first layers), ``"threshold"`` (self-draft with threshold decoding),
    ``"auto"`` (prompt lookup, then self-draft) or a `Drafter`. Drafts are
    verified by the target, so greedy output is token-identical without them.
    Stopping is a result: when ``max_new_tokens`` runs out, the `Result` has
    ``stop_reason="max_new_tokens"``, ``value=None`` and the partial text,
    tokens and stats.
    """
    if do_sample is None:
        do_sample = temperature != 1.0 or top_k is not None or top_p is not None
    options = DecodeOptions(
        max_new_tokens=max_new_tokens,
        sampling=SamplingConfig(do_sample, temperature, top_k, top_p),
        seed=seed,
        fast_forward=fast_forward,
    )
    lm = load(model) if isinstance(model, str) else model
    prompt_ids = lm.encode_prompt(prompt)
    compiled = compile(spec, lm, whitespace_pattern, strict)
    decoded = decode(lm, compiled.fsm, prompt_ids, options, make_drafter(draft, lm))
    decoded.stats.compile_seconds = compiled.fsm.info.seconds
    decoded.stats.compile_source = compiled.fsm.info.source
    text = lm.vocab.decode(decoded.token_ids)
    value = compiled.constraint.parse(text) if decoded.stop_reason != "max_new_tokens" else None
    return Result(value, text, decoded.token_ids, decoded.stop_reason, decoded.stats, decoded.sources)


def generate(model: LM | str, spec: Any, prompt: Prompt, **options: Any) -> Any:
    """Generate and return the validated value: a Pydantic instance, a parsed JSON value, or a `str` for a regex.

    Takes the options of `generate_result`; raises `TokenBudgetExceeded` (carrying the partial
    text, tokens and stats) when ``max_new_tokens`` runs out.
    """
    result = generate_result(model, spec, prompt, **options)
    if not result.complete:
        raise TokenBudgetExceeded(options.get("max_new_tokens", 512), result)
    return result.value
