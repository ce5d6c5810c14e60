"""Drafters: cheap guesses of the next tokens, all behind one small interface.

The decode loop asks a drafter for one token at a time (`Drafter.next`), with
the token stream so far and the FSM state; it splices forced text in between
for free and stops the candidate where the FSM rejects a token or the drafter
returns None. A drafter may look at the FSM to draft *with* the mask; the loop
checks every token anyway. After the target's verdict the loop calls
`Drafter.feedback` so adaptive drafters can tune their length.

* `PromptLookup`: copy what followed the last n tokens earlier in the context
  (extraction copies from the document). No model.
* `ModelDrafter`: a smaller causal LM with the target's tokenizer, masked by
  the FSM, with its own KV cache kept in sync by common prefix. Its `Policy`
  decides the draft length: `Schedule` (+2/−1, stop below a confidence) or
  `Threshold` (cumulative probability above an adaptive threshold).
* self-draft: a `ModelDrafter` over `LM.early_exit` (the target's first layers
  plus its final norm and LM head), a draft model for any target.
* `CrossTokenizerDrafter`: a draft model with another tokenizer, translated
  through text.
* `Composite`: prompt lookup first, a model drafter where lookup has nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from structspec.errors import SpecError
from structspec.lm import LanguageModel
from structspec.automaton.fsm import TokenFSM
from structspec.decoding.sampling import SamplingConfig, probabilities, sample


@dataclass(frozen=True)
class Step:
    """One drafted token; ``q`` is the draft's distribution when it was sampled, None for a point mass."""

    token: int
    source: str
    q: torch.Tensor | None = None


@runtime_checkable
class Drafter(Protocol):
    """What the decode loop needs of a drafter; ``name`` labels its tokens in `Result.sources`."""

    name: str
    passes: int  # draft forward passes so far

    def begin(self) -> None:
        """A new candidate starts (reset per-candidate counters)."""

    def next(
        self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
        generator: torch.Generator | None,
    ) -> Step | None:
        """The next draft token after ``context`` (prompt + output + candidate so far), or None to stop."""

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        """How many tokens of each source the last candidate had and the target accepted."""


@dataclass
class PromptLookup:
    """Prompt-lookup decoding: find the last ``n`` tokens (``max_ngram`` down to 1) earlier in the context
    and propose what followed them, at most ``max_tokens`` per candidate.

    The earliest match whose continuation the FSM allows wins: the document
    comes before the answer in an extraction prompt. A candidate starts only
    from a match of at least ``min_start`` tokens: one token (the ``":"`` after
    a key) matches all over the prompt and the output, and what follows it is
    rarely the value. On Qwen2.5-Coder-0.5B's greedy outputs of 10 example tasks
    (replayed, so pass counts are exact), starting from 2-token matches cut the
    tokens fed by 26% and raised acceptance from 17% to 23%, for 1.18× the
    passes: fewer seconds on a CPU, where a fed token costs a share of a pass.
    """

    max_ngram: int = 3
    max_tokens: int = 10
    name: str = "prompt_lookup"
    passes: int = 0
    min_start: int = 2
    _count: int = 0

    def begin(self) -> None:
        self._count = 0

    def next(self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Step | None:
        if self._count >= self.max_tokens:
            return None
        shortest = self.min_start if self._count == 0 else 1  # once copying, the copy's own tokens extend the match
        for n in range(min(self.max_ngram, len(context) - 1), shortest - 1, -1):
            pattern, first = context[-n:], context[-n]
            for i in range(len(context) - n):
                if context[i] == first and context[i : i + n] == pattern:
                    token = context[i + n]
                    if fsm.next_state(state, token) is not None:
                        self._count += 1
                        return Step(token, self.name)
        return None

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        pass


class Policy(Protocol):
    """When a model drafter stops drafting; ``probs`` are its probabilities of this candidate's tokens."""

    def keep_going(self, probs: list[float]) -> bool: ...

    def feedback(self, probs: list[float], accepted: int) -> None: ...


@dataclass
class Schedule:
    """The heuristic schedule: draft ``length`` tokens (start 5; +2 after a fully accepted draft, −1
    otherwise), and stop early after a token whose draft probability is below ``confidence`` (dynamic
    speculation; None disables)."""

    length: int = 5
    confidence: float | None = 0.4
    max_length: int = 32

    def keep_going(self, probs: list[float]) -> bool:
        if len(probs) >= self.length:
            return False
        return not probs or self.confidence is None or probs[-1] >= self.confidence

    def feedback(self, probs: list[float], accepted: int) -> None:
        if not probs:
            return
        self.length = min(self.length + 2, self.max_length) if accepted == len(probs) else max(self.length - 1, 1)


@dataclass
class Threshold:
    """Threshold decoding: keep drafting while the cumulative draft probability stays above ``threshold``.

    After a rejection the threshold moves halfway toward the cumulative
    probability of the last accepted draft token (toward 1 when none was
    accepted); after a fully accepted draft it drops by ``step``; it stays in
    [``low``, ``high``].
    """

    threshold: float = 0.5
    step: float = 0.1
    low: float = 0.05
    high: float = 0.95
    max_length: int = 32

    def keep_going(self, probs: list[float]) -> bool:
        return len(probs) < self.max_length and math.prod(probs) >= self.threshold

    def feedback(self, probs: list[float], accepted: int) -> None:
        if not probs:
            return
        if accepted < len(probs):
            toward = math.prod(probs[:accepted]) if accepted else 1.0
            self.threshold += (toward - self.threshold) / 2
        else:
            self.threshold -= self.step
        self.threshold = min(max(self.threshold, self.low), self.high)


@dataclass(eq=False)
class _DraftModel:
    """What the model drafters share: a draft LM and its KV cache over the token stream."""

    lm: LanguageModel

    def __post_init__(self) -> None:
        self._context: DraftContext = _CachedContext(self.lm)

    @property
    def passes(self) -> int:
        """Draft forward passes so far."""
        return self._context.passes

    def attach(self, context: DraftContext) -> None:
        """Draft from ``context`` (a row of a batched draft cache) instead of a cache of its own (changes the
        drafter)."""
        self._context = context


@dataclass(eq=False)
class ModelDrafter(_DraftModel):
    """A draft LM with the target's tokenizer, drafting under the FSM mask (see module doc)."""

    name: str = "draft_model"
    policy: Policy = field(default_factory=Schedule)
    _probs: list[float] = field(default_factory=list)
    # this candidate's steps by context length: a batched row asks again after its draft pass has run,
    # and must get the same draws back
    _steps: dict[int, tuple[Step | None, float]] = field(default_factory=dict)

    def begin(self) -> None:
        self._probs = []

    def next(self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Step | None:
        if not self.policy.keep_going(self._probs):
            return None
        if len(context) in self._steps:
            step, prob = self._steps[len(context)]
            self._probs.append(prob)
            return step
        logits = _fit(self._context.logits_after(context), fsm.logits_width)
        fsm.mask_logits_inplace(logits[None], [state])
        # A candidate cannot carry EOS, so the draft distribution is q without the EOS ids: drawing from full q
        # and dropping an EOS draw would bias speculative sampling.
        logits[list(fsm.eos_token_ids)] = float("-inf")
        if torch.isinf(logits).all():
            return None
        if sampling.do_sample:
            q = probabilities(logits.cpu(), sampling)  # verified on the CPU, next to the target's p
            token = sample(q, generator)
        else:
            q, token = None, int(logits.argmax())
        prob = float((q if q is not None else logits.softmax(-1))[token])
        self._probs.append(prob)
        self._steps[len(context)] = (Step(token, self.name, q), prob)
        return self._steps[len(context)][0]

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        self._steps.clear()
        self.policy.feedback(self._probs, accepted.get(self.name, 0))


@dataclass(eq=False)
class CrossTokenizerDrafter(_DraftModel):
    """A draft LM with a different tokenizer: it continues the text greedily (unconstrained, in its own
    vocabulary) and the text is re-tokenized with the target's tokenizer.

    The two token streams stay aligned through text: each chunk starts from the
    target context decoded to text and re-encoded by the draft tokenizer, and
    the draft KV cache keeps the common prefix. Drafts are deterministic, so
    they verify as point masses. The last translated token is dropped (it may
    merge with the text that follows).
    """

    target_tokenizer: Any
    target_vocab: Any
    name: str = "draft_model"
    policy: Schedule = field(default_factory=lambda: Schedule(confidence=None))
    _buffer: list[int] = field(default_factory=list)  # translated tokens, proposed from _base on
    _base: int = 0
    _count: int = 0

    def begin(self) -> None:
        self._count = 0

    def next(self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Step | None:
        if self._count >= self.policy.length:
            return None
        done = len(context) - self._base
        if not (0 <= done < len(self._buffer) and context[self._base :] == self._buffer[:done]):
            self._translate_chunk(context)
            done = 0
        if done >= len(self._buffer):
            return None
        self._count += 1
        return Step(self._buffer[done], self.name)

    def _translate_chunk(self, context: list[int]) -> None:
        # HF decode keeps special tokens as text (chat markers), which the draft tokenizer parses back
        text = self.target_tokenizer.decode(context, clean_up_tokenization_spaces=False)
        draft_ids = list(self.lm.tokenizer(text, add_special_tokens=False)["input_ids"])
        drafted: list[int] = []
        for _ in range(self.policy.length + 1):  # one spare token: the last translated one is dropped
            token = int(self._context.logits_after(draft_ids + drafted).argmax())
            if token == self.lm.vocab.eos_token_id:
                break
            drafted.append(token)
        new_text = self.lm.vocab.spell(drafted)
        try:
            ids = self.target_tokenizer.encode(new_text.decode("utf-8"), add_special_tokens=False)[:-1]
        except UnicodeDecodeError:
            ids = []
        spelled = self.target_vocab.spell(ids)
        if spelled != new_text[: len(spelled)]:
            ids = []  # the tokenizer normalized the text: no faithful translation
        self._buffer, self._base = ids, len(context)

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        n = drafted.get(self.name, 0)
        self.policy.feedback([1.0] * n, accepted.get(self.name, 0))


@dataclass(eq=False)
class Composite:
    """Prompt lookup first; ``fallback`` (a model drafter) where lookup has nothing to propose.

    A fallback that does not pay is switched off: once it has drafted
    ``warmup`` tokens with an acceptance rate under ``min_acceptance``, its
    draft passes cost more than its accepted tokens save.
    """

    lookup: PromptLookup
    fallback: Any
    min_acceptance: float = 0.3
    warmup: int = 16
    _drafted: int = 0
    _accepted: int = 0

    @property
    def name(self) -> str:
        return self.fallback.name

    @property
    def passes(self) -> int:
        return self.fallback.passes

    @property
    def fallback_on(self) -> bool:
        return self._drafted < self.warmup or self._accepted >= self.min_acceptance * self._drafted

    def begin(self) -> None:
        self.lookup.begin()
        self.fallback.begin()

    def next(self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Step | None:
        step = self.lookup.next(context, state, fsm, sampling, generator)
        if step is None and self.fallback_on:
            step = self.fallback.next(context, state, fsm, sampling, generator)
        return step

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        self._drafted += drafted.get(self.fallback.name, 0)
        self._accepted += accepted.get(self.fallback.name, 0)
        self.lookup.feedback(drafted, accepted)
        self.fallback.feedback(drafted, accepted)


class DraftContext(Protocol):
    """Where a model drafter gets next-token logits: its own KV cache, or a row of a batched one."""

    passes: int

    def logits_after(self, context: list[int]) -> torch.Tensor: ...


class _CachedContext:
    """An LM with a KV cache over a token stream that changes at the end: feeds only what is new."""

    def __init__(self, lm: LanguageModel) -> None:
        self.lm = lm
        self.cache: Any = None
        self.seen: list[int] = []
        self.last: torch.Tensor | None = None  # logits after `seen`
        self.passes = 0

    def logits_after(self, context: list[int]) -> torch.Tensor:
        """Next-token logits after ``context`` [vocab] (a fresh tensor; one pass unless already known)."""
        n = next((i for i, (a, b) in enumerate(zip(self.seen, context)) if a != b), min(len(self.seen), len(context)))
        if n == len(context) == len(self.seen) and self.last is not None:
            return self.last.clone()
        if self.cache is None:
            self.cache, n = self.lm.new_cache(), 0
        n = min(n, len(context) - 1)  # at least one token to feed
        self.lm.crop(self.cache, n)
        self.last = self.lm.forward(context[n:], self.cache)[-1]
        self.passes += 1
        self.seen = list(context)
        return self.last.clone()


def _fit(logits: torch.Tensor, width: int) -> torch.Tensor:
    """Draft logits cut or padded (with -inf) to the target's logits width; extra ids belong to no token."""
    if len(logits) >= width:
        return logits[:width]
    return torch.cat([logits, logits.new_full((width - len(logits),), float("-inf"))])


SHORT_NAMES = ("prompt_lookup", "self", "threshold", "auto")


def make_drafter(draft: Drafter | LanguageModel | str | None, target: LanguageModel) -> Drafter | None:
    """The drafter for ``draft=``: None, a `Drafter`, a loaded LM (draft model) or one of `SHORT_NAMES`."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, LanguageModel):
        if draft.vocab.fingerprint == target.vocab.fingerprint:
            return ModelDrafter(draft)
        return CrossTokenizerDrafter(draft, target.tokenizer, target.vocab)
    if draft == "prompt_lookup":
        return PromptLookup()
    if draft == "self":
        return ModelDrafter(target.early_exit(), name="self_draft")
    if draft == "threshold":
        return ModelDrafter(target.early_exit(), name="threshold", policy=Threshold())
    if draft == "auto":
        # Self-draft tokens pay only where a pass that verifies them costs about what a one-token step does:
        # on a GPU (8 tokens fed cost 1.1× one, `structspec.tools.pass_cost`); on a CPU each fed token adds
        # to the pass and a quarter-model draft pass per token, and prompt lookup alone was faster.
        if getattr(target, "device", torch.device("cpu")).type != "cuda":
            return PromptLookup()
        return Composite(PromptLookup(), ModelDrafter(target.early_exit(), name="self_draft"))
    raise SpecError(
        f"draft={draft!r} is not a drafter: use None, a loaded LM (draft model), a Drafter, "
        f"or one of {', '.join(map(repr, SHORT_NAMES))}"
    )
