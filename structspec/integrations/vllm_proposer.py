"""A vLLM speculative proposer that drafts what structspec's grammar forces, then a prompt-lookup continuation.

``LLM(..., structured_outputs_config={"backend": "structspec"}, speculative_config=speculative_config())``
turns it on (vLLM 0.32's ``custom_class`` method). Each engine step, for each running request under the
structspec backend, `GrammarProposer` drafts

1. the forced text from the request's FSM state (the bytes every continuation starts with: the rest of a key,
   ``":``, an enum's tail) in its canonical spelling, as structspec's own loop fast-forwards it
   (`structspec.decoding.fastforward.Forcer.spelled`), with the splits the model preferred learned per request;
2. then, up to the draft length, a prompt-lookup continuation (the tokens that followed the latest earlier
   occurrence of the output's last few tokens, forced draft included), cut where the FSM stops accepting it.

Requests without a structspec grammar get the prompt-lookup draft alone. vLLM verifies every draft in one
target pass under the grammar's masks, so the output is the one vLLM gives without the proposer: drafts only
save passes (greedy outputs are token-identical up to the numerics of a wider pass).

What it relies on in vLLM's internals (0.32): ``propose`` gets the rows' sampled tokens and token buffers, not
their request ids, so building the proposer wraps ``GPUModelRunner.propose_draft_token_ids`` (the CPU runner
inherits it: `structspec.integrations.vllm_hooks.hand_runner_to`) to hand the proposer its runner; the proposer
reads ``runner.input_batch.req_ids`` and each request's ``runner.requests[id]`` (``output_token_ids``,
``sampling_params.structured_outputs``). The engine core's grammar objects live in another process in vLLM's
multi-process mode, so the proposer keeps its own `Matcher` per request, compiled from the same spec
(`structspec.integrations.vllm.request_fsm`, cached per process) and advanced over the request's output tokens
each step. vLLM's V2 model runner
(``VLLM_USE_V2_MODEL_RUNNER=1``) never calls the wrapped method: the proposer refuses to run there (`V2_REFUSED`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from structspec.checks import as_int
from structspec.decoding.fastforward import Forcer
from structspec.errors import OptionError, StructspecError
from structspec.integrations.matcher import Matcher
from structspec.integrations import vllm_hooks
from structspec.integrations.vllm import NAME, request_fsm, whitespace_of
from structspec.vocab import vocab_from_tokenizer

_WHITESPACE = frozenset(b" \t\n\r")

V2_REFUSED = ("structspec's proposer runs on vLLM's V1 model runner (GPUModelRunner or CPUModelRunner), which "
              "hands it its rows' requests; Model Runner V2 does not: set VLLM_USE_V2_MODEL_RUNNER=0, or use "
              "speculative_config={'method': 'ngram'}")
"""The refusal under vLLM's Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``; the GPU builds' default after 0.32)."""

DEFAULT_DRAFT = 8
"""The default ``num_speculative_tokens``: the longest draft a row gets in one step."""


def speculative_config(num_speculative_tokens: int = DEFAULT_DRAFT, prompt_lookup: bool = True) -> dict[str, Any]:
    """The ``speculative_config=`` that runs structspec's proposer in a vLLM engine: `GrammarProposer` (forced
    text, then prompt lookup) or, with ``prompt_lookup=False``, `ForcedProposer` (forced text alone). Changes
    nothing. `OptionError` unless ``num_speculative_tokens`` is an int ≥ 1, and under ``VLLM_USE_V2_MODEL_RUNNER=1``
    (`V2_REFUSED`: vLLM's V2 runner takes no ``custom_class`` proposer)."""
    from vllm import envs

    if envs.VLLM_USE_V2_MODEL_RUNNER:
        raise OptionError(V2_REFUSED)
    count = as_int(num_speculative_tokens)
    if count is None or count < 1:
        raise OptionError(f"num_speculative_tokens must be an int >= 1, got {num_speculative_tokens!r}: pass the "
                          f"longest draft a request may get in one step, e.g. {DEFAULT_DRAFT}")
    proposer = GrammarProposer if prompt_lookup else ForcedProposer
    return {"method": "custom_class", "model": f"{__name__}.{proposer.__name__}", "num_speculative_tokens": count}


def prompt_lookup(token_ids: np.ndarray, min_n: int, max_n: int, count: int) -> list[int]:
    """Up to ``count`` tokens that followed the latest earlier occurrence of ``token_ids``' last n tokens, for the
    longest n in [min_n, max_n] that occurs earlier; [] if none does. Changes nothing."""
    for n in range(min(max_n, len(token_ids) - 1), min_n - 1, -1):
        windows = sliding_window_view(token_ids[:-1], n)  # every n-gram that ends before the last token
        hits = np.flatnonzero((windows == token_ids[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return token_ids[start : start + count].tolist()
    return []


def forced_spelling(forcer: Forcer, state: int) -> tuple[list[int], list[int]]:
    """The forced text from ``state`` and, where it stops only because JSON whitespace may come next, the one other
    byte allowed there (a key's ``"`` and its ``:``, which models write as one token ``":``), in their canonical
    spelling with ``forcer``'s learned splits; the FSM states after each token. The whitespace is skipped in a
    draft only: the target's pass decides. Fills ``forcer``'s cache; changes nothing else."""
    fsm = forcer.fsm
    text, end = forcer.forced_bytes(state)
    allowed = fsm.next_bytes(end) if not fsm.is_final(end) else []
    other = [b for b in allowed if b not in _WHITESPACE]
    if len(other) == 1 and len(other) < len(allowed):
        text += bytes(other)
    return forcer.spell_text(state, text) if text else ([], [])


@dataclass
class ProposerStats:
    """What a proposer drafted since it was built (or last `GrammarProposer.reset_stats`)."""

    steps: int = 0
    """Calls to ``propose``: one per engine step that sampled tokens."""
    forced_drafted: int = 0
    """Draft tokens spelling the grammar's forced text."""
    lookup_drafted: int = 0
    """Draft tokens from prompt lookup (after the forced text, or alone)."""


@dataclass(eq=False)
class _Request:
    """The proposer's view of one request: its grammar state (None: no structspec grammar, or its output left
    the FSM) over its first ``consumed`` output tokens, and the forced part of its last draft."""

    matcher: Matcher | None
    forcer: Forcer | None
    consumed: int = 0
    forced: list[int] = field(default_factory=list)
    spelled: dict[int, tuple[list[int], list[int]]] = field(default_factory=dict)  # `forced_spelling` per state


class GrammarProposer:
    """vLLM's ``custom_class`` proposer: each row's draft is its grammar's forced text, then prompt lookup the
    grammar accepts (see the module docstring). Built by vLLM's model runner with the engine's ``VllmConfig``;
    keeps a `Matcher` per running request (its state changes each ``propose``)."""

    prompt_lookup_min = 2
    """The shortest n-gram prompt lookup matches."""
    prompt_lookup_max = 5
    """The longest n-gram prompt lookup matches (0: no prompt lookup)."""

    def __init__(self, vllm_config: Any) -> None:
        from vllm.tokenizers import cached_tokenizer_from_config

        if getattr(vllm_config, "use_v2_model_runner", False):
            raise StructspecError(V2_REFUSED)
        model_config, structured = vllm_config.model_config, vllm_config.structured_outputs_config
        self.num_speculative_tokens: int = vllm_config.speculative_config.num_speculative_tokens
        self.max_model_len: int = model_config.max_model_len
        vllm_hooks.hand_runner_to(GrammarProposer)
        self.runner: Any = None  # the model runner, set before each propose (`vllm_hooks.hand_runner_to`)
        self.stats = ProposerStats()
        # grammars start after the reasoning under a reasoning parser: the FSM would not match the output there
        # (structured outputs need the tokenizer: vLLM refuses them under skip_tokenizer_init)
        self._grammars = (structured.backend == NAME and not structured.reasoning_parser
                          and not model_config.skip_tokenizer_init)
        self._tokenizer = cached_tokenizer_from_config(model_config=model_config) if self._grammars else None
        self._vocab = vocab_from_tokenizer(self._tokenizer) if self._grammars else None
        self._vocab_size: int = model_config.get_vocab_size()
        self._whitespace = whitespace_of(structured)
        self._requests: dict[str, _Request] = {}

    def load_model(self, model: Any) -> None:
        """vLLM's model runner hands every drafter the target model; this one runs none. Changes nothing."""

    def reset_stats(self) -> None:
        """Zero `stats`. Changes the stats only."""
        self.stats = ProposerStats()

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """One draft per row of vLLM's input batch (``sampled_token_ids[i]``: the tokens row i accepted this
        step; ``token_ids_cpu[i, :num_tokens_no_spec[i]]``: its prompt and output). Advances each request's
        grammar state over its new output tokens; forgets requests that left the batch."""
        if self.runner is None:
            raise StructspecError(V2_REFUSED)
        req_ids, requests = self.runner.input_batch.req_ids, self.runner.requests
        self.stats.steps += 1
        for gone in self._requests.keys() - requests.keys():
            del self._requests[gone]
        drafts = []
        for row, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            room = min(self.num_speculative_tokens, self.max_model_len - length - 1)  # (the bonus token's place)
            if not sampled or room <= 0:  # a prefill chunk, a discarded row, or no room left
                drafts.append([])
                continue
            drafts.append(self._draft(req_ids[row], requests[req_ids[row]], sampled, token_ids_cpu[row, :length],
                                      room))
        return drafts

    def _draft(self, req_id: str, cached: Any, sampled: list[int], context: np.ndarray, room: int) -> list[int]:
        """One row's draft of at most ``room`` tokens. Advances the request's grammar state."""
        request = self._requests.get(req_id)
        if request is None:
            request = self._requests[req_id] = self._request(cached.sampling_params)
        forced, after = self._forced(request, cached.output_token_ids, sampled, room)
        lookup: list[int] = []
        if len(forced) < room and self.prompt_lookup_max:
            if forced:
                context = np.concatenate([context, np.asarray(forced, dtype=context.dtype)])
            lookup = prompt_lookup(context, self.prompt_lookup_min, self.prompt_lookup_max, room - len(forced))
            if request.matcher is not None:  # only what the grammar accepts after the forced text
                lookup = lookup[: len(request.matcher.fsm.walk(after, lookup))] if after is not None else []
        self.stats.forced_drafted += len(forced)
        self.stats.lookup_drafted += len(lookup)
        return forced + lookup

    def _request(self, sampling_params: Any) -> _Request:
        """A new request's grammar state: its structspec FSM's start, or none (no structured output, or a spec
        the backend refuses too: vLLM fails that request itself). Under the structspec backend every structured
        request is structspec's (`structspec.integrations.vllm.check_request` refuses another). Changes nothing."""
        params = getattr(sampling_params, "structured_outputs", None)
        if not self._grammars or params is None:
            return _Request(None, None)
        from vllm.v1.structured_output.request import get_structured_output_key

        try:
            kind, spec = get_structured_output_key(params)
            fsm = request_fsm(kind, spec, self._whitespace, self._vocab, self._vocab_size,
                              sampling_params.all_stop_token_ids)
        except StructspecError:
            return _Request(None, None)
        return _Request(Matcher(fsm), Forcer(fsm, self._tokenizer))

    def _forced(self, request: _Request, output: list[int], sampled: list[int], room: int
                ) -> tuple[list[int], int | None]:
        """The forced draft (at most ``room`` tokens) after the request's output so far, and the FSM state after
        it (None where the grammar is not followed or has ended). Advances the grammar state over the new output
        tokens; learns the split the model chose where it rejected the last forced draft."""
        matcher, forcer = request.matcher, request.forcer
        if matcher is None or forcer is None:
            return [], None
        # the model wrote sampled[i] where forced[i] was drafted (at the same place): spell that text its way
        if request.forced and len(output) - len(sampled) == request.consumed:
            i = next((i for i, (a, b) in enumerate(zip(sampled, request.forced)) if a != b), None)
            if i is not None:
                forcer.learn(request.forced[i], sampled[i])
                request.spelled.clear()  # (spelled with the splits learned so far)
        if len(output) < request.consumed:  # (vLLM never shortens an output; a reset keeps the state exact)
            matcher.reset()
            request.consumed = 0
        if not matcher.accept_tokens(output[request.consumed :]):
            request.matcher = None  # the output left this FSM (not the request's grammar): lookup alone
            return [], None
        request.consumed = len(output)
        if matcher.is_terminated():
            request.forced = []
            return [], None
        if matcher.state not in request.spelled:
            request.spelled[matcher.state] = forced_spelling(forcer, matcher.state)
        tokens, states = request.spelled[matcher.state]
        request.forced = tokens[:room]
        return request.forced, states[len(request.forced) - 1] if request.forced else matcher.state


class ForcedProposer(GrammarProposer):
    """`GrammarProposer` without prompt lookup: each row's draft is its grammar's forced text alone."""

    prompt_lookup_max = 0
