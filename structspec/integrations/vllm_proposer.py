"""A vLLM speculative proposer that drafts what structspec's grammar forces and a prompt-lookup continuation.

``LLM(..., structured_outputs_config={"backend": "structspec"}, speculative_config=speculative_config())``
turns it on (vLLM 0.32's ``custom_class`` method). Each engine step, for each running request under the
structspec backend, `GrammarProposer` drafts what structspec's own loop drafts, through the same
`structspec.decoding.Cursor` and drafter: up to the draft length,

1. the forced text from the request's FSM state (the bytes every continuation starts with: the rest of a key,
   ``":``, an enum's tail) in its canonical spelling (`structspec.decoding.Forcer.spelled`), with the splits
   the model preferred learned per request (`Cursor.learn`);
2. wherever no text is forced, the core's prompt lookup (`structspec.decoding.PromptLookup`: what followed
   the earliest earlier occurrence of the output's last tokens that the FSM allows), as many tokens as pay on
   the engine's pass cost (`structspec.decoding.DraftLength`: all of them on a GPU), forced text spliced in
   again wherever the FSM forces some;
3. then every row's draft is cut together, by what the step's tokens cost at this batch
   (`structspec.integrations.proposal.cut_to_cost`, the own loop's batch rule): at one request the draft as
   sized, at many the forced text first and prompt-lookup tokens only where they are kept often enough.

Requests without a structspec grammar get the prompt-lookup draft alone (`PromptLookup.guess`). vLLM verifies
every draft in one target pass under the grammar's masks, so the output is the one vLLM gives without the
proposer: drafts only save passes (greedy outputs are token-identical up to the numerics of a wider pass).

What it relies on in vLLM's internals (0.32): ``propose`` gets the rows' sampled tokens and token buffers, not
their request ids, so building the proposer wraps ``GPUModelRunner.propose_draft_token_ids`` (the CPU runner
inherits it: `structspec.integrations.vllm_hooks.hand_runner_to`) to hand the proposer its runner; the proposer
reads ``runner.input_batch.req_ids`` and each request's ``runner.requests[id]`` (``output_token_ids``,
``sampling_params.structured_outputs``). The engine core's grammar objects live in another process in vLLM's
multi-process mode, so the proposer keeps its own `Cursor` per request
(`structspec.integrations.proposal.RequestDraft`), over the FSM compiled from the same spec
(`structspec.integrations.vllm.request_fsm`, cached per process) and advanced over the request's output tokens
each step. vLLM's V2 model runner (``VLLM_USE_V2_MODEL_RUNNER=1``) never calls the wrapped method: the proposer
refuses to run there (`V2_REFUSED`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from structspec.checks import as_int
from structspec.decoding import CPU_COST, FLAT_COST, FORCED, Cursor, DraftLength, Forcer, PromptLookup
from structspec.errors import OptionError, StructspecError
from structspec.integrations import vllm_hooks
from structspec.integrations.proposal import RequestDraft, cut_to_cost
from structspec.integrations.vllm import NAME, request_fsm, whitespace_of
from structspec.vocab import vocab_from_tokenizer

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


@dataclass
class ProposerStats:
    """What a proposer drafted since it was built (or last `GrammarProposer.reset_stats`)."""

    steps: int = 0
    """Calls to ``propose``: one per engine step that sampled tokens."""
    forced_drafted: int = 0
    """Draft tokens spelling the grammar's forced text."""
    lookup_drafted: int = 0
    """Draft tokens from prompt lookup (after the forced text, or alone)."""


class GrammarProposer:
    """vLLM's ``custom_class`` proposer: each row's draft is its grammar's forced text and prompt lookup the
    grammar accepts (see the module docstring). Built by vLLM's model runner with the engine's ``VllmConfig``;
    keeps a `Cursor` per running request (its state changes each ``propose``)."""

    prompt_lookup = True
    """Draft prompt lookup between the forced text (False: forced text alone)."""

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
        self._requests: dict[str, RequestDraft] = {}
        self._lookup = PromptLookup() if self.prompt_lookup else None  # (its state lasts one draft: shared)
        # the pass cost drafts are sized by, as in structspec's own loop: a GPU's pass costs the same for a few
        # tokens more (flat: lookup as long as it goes), a CPU's more per fed token (its prior, CPU_COST)
        device = getattr(getattr(vllm_config, "device_config", None), "device_type", "cuda")
        self._cost = CPU_COST if device == "cpu" else FLAT_COST

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
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        drafting: dict[int, RequestDraft] = {}  # by row: the requests drafted for this step
        for row, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            room = min(self.num_speculative_tokens, self.max_model_len - length - 1)  # (the bonus token's place)
            if sampled and room > 0:  # (not a prefill chunk, a discarded row, or a row without room)
                cached, request = requests[req_ids[row]], self._requests.get(req_ids[row])
                if request is None:
                    request = self._requests[req_ids[row]] = self._request(cached.sampling_params)
                request.propose(cached.output_token_ids, sampled, token_ids_cpu[row, :length].tolist(), room,
                                self._lookup)
                drafting[row] = request
        # one step verifies every row's draft: cut them together by what the step's tokens cost
        for row, tokens in zip(drafting, cut_to_cost(list(drafting.values()), self._cost)):
            drafts[row] = tokens
            forced = drafting[row].draft.sources.count(FORCED)
            self.stats.forced_drafted += forced
            self.stats.lookup_drafted += len(tokens) - forced
        return drafts

    def _request(self, sampling_params: Any) -> RequestDraft:
        """A new request's grammar state: a cursor at its structspec FSM's start, or none (no structured output,
        or a spec the backend refuses too: vLLM fails that request itself). Under the structspec backend every
        structured request is structspec's (`structspec.integrations.vllm.check_request` refuses another).
        Changes nothing."""
        params = getattr(sampling_params, "structured_outputs", None)
        if not self._grammars or params is None:
            return RequestDraft(None)
        from vllm.v1.structured_output.request import get_structured_output_key

        try:
            kind, spec = get_structured_output_key(params)
            fsm = request_fsm(kind, spec, self._whitespace, self._vocab, self._vocab_size,
                              sampling_params.all_stop_token_ids)
        except StructspecError:
            return RequestDraft(None)
        return RequestDraft(Cursor(fsm, Forcer(fsm, self._tokenizer)), DraftLength(self._cost))


class ForcedProposer(GrammarProposer):
    """`GrammarProposer` without prompt lookup: each row's draft is its grammar's forced text alone."""

    prompt_lookup = False
