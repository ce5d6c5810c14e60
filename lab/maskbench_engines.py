"""The mask benchmark's engines: structspec, xgrammar and llguidance each as an engine's loop drives a grammar
matcher (`Engine`: compile a schema and fill the first bitmask; accept a token and fill the next), over a tokenizer
prepared once. xgrammar and llguidance are imported where they are made (`make_engines`), so an engine that is not
installed is named and left out."""

from __future__ import annotations

import json
from typing import Any

import structspec
from structspec.automaton import index as token_index
from structspec.automaton.fsm import TokenFSM
from structspec.schema import constraint_of
from structspec.vocab import vocab_from_tokenizer

ENGINES = ("structspec", "xgrammar", "llguidance")


class Engine:
    """One engine's matcher over a prepared tokenizer: `start` compiles a schema and fills the first mask;
    `step` accepts a token and fills the next mask (False: rejected)."""

    name = ""

    def start(self, schema: dict[str, Any]) -> None:
        raise NotImplementedError

    def step(self, token_id: int) -> bool:
        raise NotImplementedError


class StructspecEngine(Engine):
    """structspec as ``Matcher(schema, tokenizer, logits_width=...)`` runs it: the schema's parsed pattern compiled
    over the tokenizer's vocabulary, a state per accepted token, the FSM's bitmask fill."""

    name = "structspec"

    def __init__(self, tokenizer: Any, width: int, cold: bool) -> None:
        self.tokenizer, self.width, self.cold = tokenizer, width, cold
        self.vocab = vocab_from_tokenizer(tokenizer)  # the tokenizer side, once (kept per tokenizer object)
        token_index.vocab_bytes(self.vocab)

    def forget(self) -> None:
        """Clear the compile caches (and with ``cold``, the region shapes learned over this tokenizer)."""
        structspec.clear_cache(disk=True)
        if self.cold:
            token_index.vocab_bytes(self.vocab).forget_shapes()

    def compile(self, schema: dict[str, Any]) -> TokenFSM:
        return TokenFSM.from_regex(constraint_of(json.dumps(schema)).pattern, vocab_from_tokenizer(self.tokenizer),
                                   self.width)

    def start(self, schema: dict[str, Any]) -> None:
        self.fsm = self.compile(schema)
        self.state: int | None = self.fsm.initial_state
        self.bitmask = self.fsm.allocate_token_bitmask(1)
        self.fsm.fill_next_token_bitmask(self.bitmask, 0, self.state)

    def step(self, token_id: int) -> bool:
        if self.state is None:
            return False
        if token_id in self.fsm.eos_token_ids:  # ends the output in a final state
            ended, self.state = self.fsm.is_final(self.state), None
            return ended
        self.state = self.fsm.next_state(self.state, token_id)
        if self.state is None:
            return False
        self.fsm.fill_next_token_bitmask(self.bitmask, 0, self.state)
        return True

    def states(self, token_ids: list[int]) -> list[int | None]:
        """structspec's state after each token of ``token_ids`` from the initial one (None after EOS or a
        rejected token). Builds DFA rows; computes no mask."""
        found, state = [], self.fsm.initial_state
        for t in token_ids:
            state = None if state is None or t in self.fsm.eos_token_ids else self.fsm.next_state(state, t)
            found.append(state)
        return found

    def accepts(self, token_ids: list[int]) -> bool:
        """Whether the FSM `start` compiled accepts ``token_ids``, EOS last. Computes no mask."""
        end = (self.states(token_ids[:-1]) or [self.fsm.initial_state])[-1]
        return end is not None and self.fsm.is_final(end) and token_ids[-1] in self.fsm.eos_token_ids


class XgrammarEngine(Engine):
    name = "xgrammar"

    def __init__(self, tokenizer: Any, width: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=width)
        self.compiler = xgrammar.GrammarCompiler(info, cache_enabled=False)
        self.width = width

    def start(self, schema: dict[str, Any]) -> None:
        compiled = self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
        self.matcher = self.xgr.GrammarMatcher(compiled)
        self.bitmask = self.xgr.allocate_token_bitmask(1, self.width)
        self.matcher.fill_next_token_bitmask(self.bitmask, 0)

    def step(self, token_id: int) -> bool:
        if not self.matcher.accept_token(token_id):
            return False
        if not self.matcher.is_terminated():
            self.matcher.fill_next_token_bitmask(self.bitmask, 0)
        return True


class LlguidanceEngine(Engine):
    name = "llguidance"

    def __init__(self, tokenizer: Any, width: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.fill = llguidance.torch.fill_next_token_bitmask
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=width)
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, width)

    def start(self, schema: dict[str, Any]) -> None:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                             defaults={"whitespace_flexible": False})
        self.matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        if self.matcher.is_error():
            raise ValueError(self.matcher.get_error())
        self.fill(self.matcher, self.bitmask, 0)

    def step(self, token_id: int) -> bool:
        if not self.matcher.consume_token(token_id) or self.matcher.is_error():
            return False
        if not self.matcher.is_stopped():
            self.fill(self.matcher, self.bitmask, 0)
        return True


def make_engines(tokenizer: Any, width: int, names: list[str], cold: bool) -> tuple[list[Engine], list[str]]:
    """The engines named that can run here (structspec first), each with its tokenizer side prepared, and a note
    for each that cannot (not installed, or its tokenizer refused)."""
    engines: list[Engine] = []
    missing: list[str] = []
    for name in names:
        try:
            if name == "structspec":
                engines.append(StructspecEngine(tokenizer, width, cold))
            elif name == "xgrammar":
                engines.append(XgrammarEngine(tokenizer, width))
            elif name == "llguidance":
                engines.append(LlguidanceEngine(tokenizer, width))
        except ImportError as error:
            missing.append(f"{name} is not installed ({error.name}): pip install xgrammar llguidance")
    return engines, missing
