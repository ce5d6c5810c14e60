"""A grammar matcher for serving engines: one output's FSM state, with accept / validate / rollback and bitmasks.

`Matcher` speaks the contract that vLLM's ``StructuredOutputGrammar``,
SGLang's ``BaseGrammarObject`` and xgrammar's ``GrammarMatcher`` share, over a
structspec `TokenFSM`: it is the core's `structspec.decoding.Cursor` (the
output's states, one entry per accepted token, so `Matcher.rollback` is
indexing; forced text; drafting under the FSM) plus compiling a spec and
checking the engine's ids. Calls that change the state: `accept_tokens`,
`rollback`, `reset`; every other call reads. Bitmasks are the packed int32
``[rows, ceil(logits_width / 32)]`` format of `TokenFSM.allocate_token_bitmask`
(bit j of word i ⇔ token 32*i+j allowed), the format both engines already apply.

Plugging it into an engine (both pick grammar backends from a fixed list today,
so this is a small patch or a registration, not a configuration option):

* **vLLM** (``vllm/v1/structured_output``): a ``StructuredOutputBackend`` whose
  ``compile_grammar(request_type, grammar_spec)`` turns the spec (a JSON schema
  string, a regex, a choice list) into a structspec spec and returns a grammar
  wrapping ``Matcher(structspec.compile(spec, lm))``, or
  ``Matcher(spec, tokenizer, logits_width=vocab_size)`` when only the tokenizer is at
  hand; ``allocate_token_bitmask(n)`` is ``matcher.fsm.allocate_token_bitmask(n)``.
  The ``StructuredOutputGrammar`` methods map one to one: ``accept_tokens(request_id,
  tokens)`` → `accept_tokens`; ``validate_tokens(tokens)`` → ``tokens[:validate_tokens(tokens)]``;
  ``rollback(n)``, ``is_terminated()`` and ``reset()`` → the same names;
  ``fill_bitmask(bitmask, i)`` → `fill_next_token_bitmask`; ``find_jump_string()``
  (where the version has it) → `forced_text` (None when empty).
* **SGLang** (``sglang/srt/constrained``): a ``BaseGrammarBackend`` whose
  ``dispatch_json`` / ``dispatch_regex`` return a ``BaseGrammarObject`` over a
  `Matcher` (newer versions take it through ``register_grammar_backend``).
  ``accept_token(t)`` → ``accept_tokens([t])`` (raise when it returns False);
  ``rollback(k)`` and ``is_terminated()`` → the same names;
  ``allocate_vocab_mask(vocab_size, batch, device)`` → ``fsm.allocate_token_bitmask(batch)``;
  ``fill_vocab_mask(mask, i)`` → `fill_next_token_bitmask`; ``move_vocab_mask``
  → ``mask.to(device)``; ``apply_vocab_mask`` → `structspec.automaton.apply_token_bitmask_inplace`;
  ``copy()`` → a new ``Matcher(matcher.fsm)`` (the FSM is immutable and shared);
  ``try_jump_forward`` / ``jump_forward_str_state`` → `forced_tokens` and
  `forced_text`, and ``jump_and_retokenize(old, new, _)`` → roll back ``old``'s
  tokens past its common prefix with ``new``, then accept the rest of ``new``
  (rollback is unbounded: the states are kept).

Typical engine step, with a speculative draft::

    matcher = Matcher(structspec.compile(spec, lm))
    draft = draft[: matcher.validate_tokens(draft)]
    bitmask = matcher.fsm.allocate_token_bitmask(len(draft) + 1)
    for i, token in enumerate(draft):          # one mask row per draft position
        matcher.fill_next_token_bitmask(bitmask, i)
        matcher.accept_tokens([token])
    matcher.fill_next_token_bitmask(bitmask, len(draft))
    ... one target pass, apply_token_bitmask_inplace(logits, bitmask), verify ...
    matcher.rollback(len(draft) - accepted)    # drop the rejected draft tokens
    matcher.accept_tokens([bonus_token])       # EOS in a final state terminates
"""

from __future__ import annotations

from typing import Any

import torch

import structspec
from structspec.automaton import TokenFSM
from structspec.checks import as_int
from structspec.decoding import Cursor
from structspec.errors import OptionError
from structspec.schema import COMPACT, agent_constraint, constraint_fsm, constraint_of, is_agent_spec
from structspec.vocab import vocab_from_tokenizer

MAX_LOGITS_WIDTH = 2**24
"""The widest logits a `Matcher` takes: 64 times the largest vocabularies (262,144 ids); past it a state's
packed row alone would take megabytes, and a mistyped width would exhaust memory instead of failing."""


def token_fsm(
    spec: Any, model_or_tokenizer: Any = None, whitespace_pattern: str = COMPACT, strict: bool = True,
    logits_width: int | None = None,
) -> TokenFSM:
    """The token FSM of ``spec``: a `TokenFSM` or `structspec.Compiled` as is, else compiled for
    ``model_or_tokenizer`` (a structspec `LM`, a shipped model's name, or a Hugging Face tokenizer,
    whose FSM allows ids up to ``logits_width``, default its size). Cached like `structspec.compile`.
    `OptionError` for a ``logits_width`` that is no int, is narrower than the tokenizer or wider than
    `MAX_LOGITS_WIDTH`, or differs from the width an FSM (or the `LM`) already has."""
    width = as_int(logits_width)
    if logits_width is not None and (width is None or not 1 <= width <= MAX_LOGITS_WIDTH):
        raise OptionError(f"logits_width must be an int in [1, 2**24] (not a bool) or None, got {logits_width!r}: "
                          "pass the model's vocabulary size (its logits' last dimension), or leave it out")
    fsm = spec if isinstance(spec, TokenFSM) else spec.fsm if isinstance(spec, structspec.Compiled) else None
    if fsm is None and isinstance(model_or_tokenizer, structspec.LM | str):
        fsm = structspec.compile(spec, model_or_tokenizer, whitespace_pattern=whitespace_pattern, strict=strict).fsm
    if fsm is not None:
        if width is not None and width != fsm.logits_width:
            raise OptionError(f"logits_width={width}, but this FSM was compiled for logits {fsm.logits_width} wide "
                              "(the model's): leave logits_width out, or compile for the tokenizer alone, "
                              "Matcher(spec, tokenizer, logits_width=...)")
        return fsm
    if model_or_tokenizer is None or not hasattr(model_or_tokenizer, "convert_ids_to_tokens"):
        raise OptionError(
            f"cannot compile for {type(model_or_tokenizer).__name__}: pass a structspec LM, a model name or the "
            "Hugging Face tokenizer (a model alone has no tokenizer; structspec.from_transformers(model, "
            "tokenizer) wraps both)"
        )
    vocab = vocab_from_tokenizer(model_or_tokenizer)
    if width is not None and width < len(vocab):
        raise OptionError(f"logits_width={width} is narrower than the tokenizer's {len(vocab)} tokens: pass the "
                          "model's vocabulary size (its logits' last dimension), or leave it out for the "
                          "tokenizer's size")
    if is_agent_spec(spec):  # tool calls, reasoning, tags: may place the tokenizer's special tokens
        constraint = agent_constraint(spec, vocab, model_or_tokenizer,
                                      lambda inner, ws=None: constraint_of(inner, ws or whitespace_pattern, strict))
        return constraint_fsm(constraint, vocab, width)
    # the parsed pattern, never written as text and read again (that round trip was most of a compile)
    return TokenFSM.from_regex(constraint_of(spec, whitespace_pattern, strict).pattern, vocab, width)


class Matcher(Cursor):
    """One output's position in a token FSM, for an engine's decode loop: a `Cursor` that compiles its spec and
    checks the engine's ids.

    ``Matcher(compiled)`` takes a `structspec.Compiled` or a `TokenFSM`;
    ``Matcher(spec, model_or_tokenizer)`` compiles a spec first (see `token_fsm`;
    ``logits_width`` must equal the engine's vocabulary size when only a
    tokenizer is given). EOS is accepted in a final state and terminates the
    matcher; nothing is accepted after it.
    """

    def __init__(
        self, fsm: Any, model_or_tokenizer: Any = None, *, whitespace_pattern: str = COMPACT, strict: bool = True,
        logits_width: int | None = None,
    ) -> None:
        super().__init__(token_fsm(fsm, model_or_tokenizer, whitespace_pattern, strict, logits_width))

    def accept_tokens(self, token_ids: list[int]) -> bool:
        """Advance over ``token_ids`` if every one is allowed, else leave the state unchanged and return False.

        All or nothing (`Cursor.accept`). Changes the state when it returns True. `OptionError` unless
        ``token_ids`` is a list of ints in [0, logits_width).
        """
        return self.accept(self._checked(token_ids))

    def validate_tokens(self, token_ids: list[int]) -> int:
        """How many leading tokens of ``token_ids`` the FSM accepts from here. Does not change the state.
        `OptionError` as `accept_tokens`."""
        return self.validate(self._checked(token_ids))

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """`Cursor.fill_bitmask`, under the name xgrammar's ``GrammarMatcher`` gives it."""
        self.fill_bitmask(bitmask, row)

    def forced_tokens(self) -> list[int]:
        """The tokens the FSM forces from here (while exactly one non-EOS token is allowed), to append
        without sampling. Does not change the state (accept them to advance)."""
        forced = self.forced()
        return forced.token_ids if forced else []

    def _checked(self, token_ids: list[int]) -> list[int]:
        """``token_ids`` as a list of ints, or `OptionError` naming the first that is not an id below the
        logits width (a float, a bool, a negative or too large id). Changes nothing."""
        if isinstance(token_ids, (str, bytes)) or not hasattr(token_ids, "__iter__"):
            raise OptionError(f"token_ids must be a list of token ids, got {type(token_ids).__name__}: pass "
                              "[token_id] for one token")
        given_ids = list(token_ids)  # (an iterator is read once)
        ids = [as_int(t) for t in given_ids]
        for given, token in zip(given_ids, ids):
            if token is None or not 0 <= token < self.fsm.logits_width:
                raise OptionError(f"token id {given!r} is not an int in [0, {self.fsm.logits_width}) (this FSM's "
                                  "logits width): pass ids the model's logits index")
        return ids  # type: ignore[return-value]
