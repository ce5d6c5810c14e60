"""The one hook `api` calls for agents' specs: `ToolCalls`, `Reasoning` and the structural kinds resolved to a
`Constraint` for one tokenizer, and the tools a chat template should be given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from structspec.automaton.budget import BudgetedFSM
from structspec.automaton.fsm import TokenFSM
from structspec.schema.constraint import Constraint
from structspec.schema.reasoning import Reasoning, reasoning_constraint
from structspec.schema.structural import STRUCTURAL, Writer, structural_constraint
from structspec.schema.toolcalls import ToolCalls, raw_inner, toolcalls_constraint
from structspec.vocab import TokenVocab

AGENT_SPECS = (*STRUCTURAL, ToolCalls, Reasoning)


def is_agent_spec(spec: Any) -> bool:
    """Whether ``spec`` is one of the agents' kinds (and so needs `agent_constraint`, not `constraint_of`)."""
    return isinstance(spec, AGENT_SPECS)


def agent_constraint(spec: Any, vocab: TokenVocab, tokenizer: Any,
                     inner: Callable[[Any, str | None], Constraint]) -> Constraint:
    """``spec``'s `Constraint` over ``tokenizer`` (read for its special tokens' ids and texts; not changed):
    ``inner(spec, whitespace_pattern)`` resolves the JSON Schemas, models and regexes inside it (None: the
    options' whitespace). `MarkerError`, `ToolSchemaError` and the inner specs' errors before any model call."""
    writer = Writer(vocab, tokenizer.get_vocab, lambda s: raw_inner(s) or inner(s, None),
                    lambda i: tokenizer.convert_ids_to_tokens(i))
    return _resolve(spec, writer, tokenizer, inner)


def _resolve(spec: Any, writer: Writer, tokenizer: Any, inner: Callable[[Any, str | None], Constraint]) -> Constraint:
    if isinstance(spec, Reasoning):
        return reasoning_constraint(spec, writer, _resolve(spec.spec, writer, tokenizer, inner))
    if isinstance(spec, ToolCalls):
        names = tokenizer.get_vocab()
        return toolcalls_constraint(spec, writer, inner, lambda text: text in names)
    if isinstance(spec, STRUCTURAL):
        return structural_constraint(spec, writer)
    return inner(spec, None)


def symbol_vocab(constraint: Constraint, vocab: TokenVocab) -> TokenVocab:
    """The vocabulary ``constraint``'s FSM reads: ``vocab``, with its special tokens spelling their symbols where
    it places any (`TokenVocab.with_symbols`). Changes nothing."""
    return vocab.with_symbols(constraint.special_tokens) if constraint.special_tokens else vocab


def constraint_fsm(constraint: Constraint, vocab: TokenVocab, logits_width: int | None = None,
                   eos_token_ids: int | list[int] | None = None) -> TokenFSM:
    """The token FSM of ``constraint`` over ``vocab`` (its special tokens spelling their symbols), held to its
    token budget where it has one (`BudgetedFSM`); compiled or read from the cache (`TokenFSM.from_regex`)."""
    fsm = TokenFSM.from_regex(constraint.pattern, symbol_vocab(constraint, vocab), logits_width, eos_token_ids)
    return BudgetedFSM.over(fsm, constraint.budget) if constraint.budget is not None else fsm


def chat_tools(spec: Any) -> list[dict[str, Any]] | None:
    """The tools ``spec`` calls, as a chat template's ``tools=`` takes them; None for a spec without tools."""
    if isinstance(spec, Reasoning):
        return chat_tools(spec.spec)
    return spec.chat_tools() if isinstance(spec, ToolCalls) else None
