"""Drafters: cheap guesses of the next tokens, all behind one small interface.

The decode loop asks a drafter for one token at a time (`Drafter.next`), with
the token stream so far and the FSM state; it splices forced text in between
for free and stops the candidate where the FSM rejects a token or the drafter
returns None. A drafter may look at the FSM to draft *with* the mask; the loop
checks every token anyway. After the target's verdict the loop calls
`Drafter.feedback` so adaptive drafters can tune their length.

* `PromptLookup`: copy what followed the last n tokens earlier in the context
  (extraction copies from the document), or the last bytes where the tokens
  differ (`copied_text`). No model.
* `ModelDrafter`: a smaller causal LM with the target's tokenizer, masked by
  the FSM, with its own KV cache kept in sync by common prefix. Its `Policy`
  decides the draft length: `Schedule` (+2/−1, stop below a confidence) or
  `Threshold` (cumulative probability above an adaptive threshold).
* self-draft: a `ModelDrafter` over `LM.early_exit` (the target's first layers
  plus its final norm and LM head), a draft model for any target.
* `StagedDrafter`: staged speculation, a draft model whose own drafts come
  from prompt lookup and are checked by the draft in one of its passes, so it
  spends fewer passes than tokens drafted. ``draft="staged"`` stages self-draft;
  ``draft=Staged(lm)`` stages a loaded draft LM (through text, as
  `CrossTokenizerDrafter` with a ``lookup``, where its tokenizer differs).
* `CrossTokenizerDrafter`: a draft model with another tokenizer, translated
  through text.
* `Composite`: prompt lookup first, a model drafter where lookup has nothing.
* ``draft="tree"``: `structspec.decoding.tree.TreeDrafter`, token trees.
* ``draft="lookahead"``: `structspec.decoding.lookahead.LookaheadDrafter`, lookahead decoding (the
  target's own Jacobi step and the n-grams it produces, in token trees).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from structspec.errors import SpecError
from structspec.models.protocol import LanguageModel
from structspec.vocab import TokenVocab
from structspec.automaton.fsm import TokenFSM
from structspec.decoding.sampling import SamplingConfig, probabilities, sample


TEXT_MATCH = 32  # the most last bytes `copied_text` matches; longer runs add no confidence
TEXT_TOKEN = 32  # the longest token `copied_text` proposes: what follows a match is read this far


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

    Where no token n-gram matches, the text may (`copied_text`, a run of at
    least ``min_text`` last bytes; 0 switches it off): the output spells
    ``"INV`` + ``-2024`` what the document tokenized ``" INV"`` + ``-2024``. On
    the same 12 tasks with the stored float32 pass-cost curve, 0.427 → 0.342
    target passes per output token and 10% less pass cost (one run each).
    """

    max_ngram: int = 3
    max_tokens: int = 10
    name: str = "prompt_lookup"
    passes: int = 0
    min_start: int = 2
    min_text: int = 1
    _count: int = 0

    def begin(self) -> None:
        self._count = 0

    def next(self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Step | None:
        if self._count >= self.max_tokens:
            return None
        shortest = self.min_start if self._count == 0 else 1  # once copying, the copy's own tokens extend the match
        def allows(t: int) -> bool:
            return fsm.next_state(state, t) is not None

        token = _copied(context, self.max_ngram, shortest, allows)
        if token is None and self.min_text:
            token = copied_text(context, fsm.vocab, allows, self.min_text)
        if token is None:
            return None
        self._count += 1
        return Step(token, self.name)

    def guess(self, context: list[int], limit: int, next_state: Callable[[int, int], int | None] = lambda s, t: s,
              state: int = 0) -> list[int]:
        """Up to ``limit`` tokens a fresh candidate after ``context`` would copy (its first from a match of
        ``min_start`` tokens), each allowed by ``next_state`` (an FSM's, from ``state``; by default every
        token is). Does not change the lookup."""
        guess: list[int] = []
        while len(guess) < limit:
            token = _copied(context + guess, self.max_ngram, self.min_start if not guess else 1,
                            lambda t: next_state(state, t) is not None)
            if token is None:
                break
            guess.append(token)
            state = next_state(state, token)
        return guess

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        pass


def continuations(context: list[int], longest: int, shortest: int, allows: Callable[[int], bool]) -> Iterator[int]:
    """The tokens that followed the last ``n`` tokens of ``context`` at their earlier occurrences, earliest first,
    for the longest ``n`` (``longest`` down to ``shortest``) with an occurrence whose token ``allows`` accepts;
    only those it accepts. Lazy: taking the first scans no further. Changes nothing."""
    for n in range(min(longest, len(context) - 1), shortest - 1, -1):
        pattern, first = context[-n:], context[-n]
        found = False
        for i in range(len(context) - n):
            if context[i] == first and context[i : i + n] == pattern and allows(context[i + n]):
                found = True
                yield context[i + n]
        if found:
            return


def _copied(context: list[int], longest: int, shortest: int, allows: Callable[[int], bool]) -> int | None:
    """The first of `continuations`: what followed the longest matching n-gram at its earliest occurrence."""
    return next(continuations(context, longest, shortest, allows), None)


def copied_text(context: list[int], vocab: TokenVocab, allows: Callable[[int], bool], shortest: int) -> int | None:
    """Prompt lookup by text, where the tokens differ but the bytes repeat: the document's ``" INV-2024"`` is
    the output's ``"INV`` + ``-2024`` (no token n-gram matches), its ``" Elena Vasquez"`` the output's ``"E`` +
    ``lena`` + ... Finds the longest run of ``context``'s last bytes (at most `TEXT_MATCH`, at least
    ``shortest``) earlier in the context, earliest first, and proposes the longest token spelling a prefix of
    what follows there that ``allows`` accepts, or None. Changes nothing."""
    text = vocab.spell(context)
    ids = vocab.ids_by_bytes
    for n in range(min(TEXT_MATCH, len(text) - 1), shortest - 1, -1):
        run = text[-n:]
        at = text.find(run, 0, len(text) - 1)  # an occurrence with a byte after it: an earlier one
        if at < 0:
            continue
        while at >= 0:  # the longest run found decides: a shorter one is a weaker guess than none
            rest = text[at + n : at + n + TEXT_TOKEN]
            for size in range(len(rest), 0, -1):
                token = ids.get(rest[:size])
                if token is not None and allows(token):
                    return token
            at = text.find(run, at + 1, len(text) - 1)
        return None
    return None


# A value being written at the end of the output: the scalar value before it if any (``Elena Vasquez`` in
# ``"name":"Elena Vasquez","title":"Sen``), its key (``title``) and what of it is written (``Sen``).
_OPENING = re.compile(
    rb'(?::(?:"((?:[^"\\]|\\.)+)"|(-?[0-9][0-9.eE+-]*))[]},{[]*)?"([^"\\]*)":"?([^"\\,{}[\]:]*)$')
_SKIPPED = re.compile(rb"(?:[\s|,;:.\-()/$#*]|\xe2\x82\xac|\xc2\xa3)*")  # separators, currency signs
_WORDS = re.compile(rb"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")  # of a key: snake_case, camelCase, kebab-case
VALUE_START = 32  # bytes of the document `value_starts` reads for one guess, cut back to a word's end
LABEL_GAP = 20  # the most bytes between a key's word and the colon after it (``Tracking number: 1Z...``)


def value_starts(text: bytes, most: int = 3) -> list[bytes]:
    """Where ``text`` (a prompt and the output so far) ends inside a value's first bytes (or where it opens),
    up to ``most`` guesses at how it goes on, from the document, best first: the document's text after the
    value before it (documents list fields in the order schemas do: ``Elena Vasquez | Senior Procurement
    Manager``), then after the words of the value's key (``Tracking number: 1Z999...`` for ``tracking_number``,
    after the colon where one follows), each where the document goes on as the value's written bytes do; then,
    once some are written, the first word the document starts with them after the value before, and the first
    of all (``"date":"2`` → ``024-03-14``).
    Separators and currency signs skipped; each at most `VALUE_START` bytes, ended at ``|`` or a line's end,
    else at a word's end where one fits. Changes nothing."""
    found = _OPENING.search(text, max(len(text) - 256, 0))
    if found is None:
        return []

    def after_label(at: int) -> int:  # past the colon of a label that follows (``. Vendor: Müller``), if any
        colon = text.find(b":", at, at + LABEL_GAP)
        return colon + 1 if colon >= 0 else at

    starts: list[int] = []
    value, written = found.group(1) or found.group(2), found.group(4)
    before = -1  # where the value before ends in the document
    if value is not None:  # (its first occurrence before the output's copy of it)
        at = text.find(value, 0, found.start() + 2)
        if at >= 0:
            before = at + len(value)
            starts.append(after_label(before))
    for word in dict.fromkeys(w.lower() for w in _WORDS.findall(found.group(3)) if len(w) >= 3):
        # a label, not a list of names (``fields: status, weight_kg``) nor a JSON key (``"status":``)
        label = re.compile(rb"(?<![A-Za-z0-9_])" + re.escape(word) + rb'(?![A-Za-z0-9_",.;])', re.IGNORECASE)
        starts += [after_label(match.end()) for match in label.finditer(text, 0, found.start())]
    if written:  # a word the document starts so, the first after the value before, then the first of all
        word = re.compile(rb"(?<![A-Za-z0-9])" + re.escape(written))
        starts += [match.start() for match in (word.search(text, max(before, 0), found.start()),
                                               word.search(text, 0, found.start())) if match]
    out: list[bytes] = []
    for at in starts:
        at = _SKIPPED.match(text, at).end()
        if text[at : at + len(written)] != written:
            continue
        rest = re.split(rb"[|\n]", text[at + len(written) : at + VALUE_START], maxsplit=1)[0]  # a field ends there
        space = rest.rfind(b" ") if len(rest) == VALUE_START - len(written) else -1  # (cut: end at a word's end)
        guess = _SKIPPED.sub(b"", (rest[:space] if space > 0 else rest)[::-1], count=1)[::-1]  # (trailing ones)
        if guess and guess not in out:
            out.append(guess)
            if len(out) == most:
                break
    return out


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
        self._own = _CachedContext(self.lm)
        self._context: DraftContext = self._own  # a `ModelDrafter` in a batch draws from a batch row instead

    @property
    def passes(self) -> int:
        """Draft forward passes so far."""
        return self._context.passes

    def attach(self, context: DraftContext) -> None:
        """Draft from ``context`` (a row of a batched draft cache) instead of a cache of its own (changes the
        drafter)."""
        self._context = context


@dataclass(eq=False)
class _PolicyDraft(_DraftModel):
    """A draft model whose ``policy`` sets the draft length from its probabilities of this candidate's tokens."""

    name: str = "draft_model"
    policy: Policy = field(default_factory=Schedule)
    _probs: list[float] = field(default_factory=list)

    def begin(self) -> None:
        self._probs = []

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        self.policy.feedback(self._probs, accepted.get(self.name, 0))


@dataclass(eq=False)
class ModelDrafter(_PolicyDraft):
    """A draft LM with the target's tokenizer, drafting under the FSM mask (see module doc)."""

    # this candidate's steps by context length: a batched row asks again after its draft pass has run,
    # and must get the same draws back
    _steps: dict[int, tuple[Step | None, float]] = field(default_factory=dict)

    def next(self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Step | None:
        if not self.policy.keep_going(self._probs):
            return None
        if len(context) in self._steps:
            step, prob = self._steps[len(context)]
            self._probs.append(prob)
            return step
        logits = _masked(self._context.logits_after(context)[None], fsm, [state])[0]
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
        super().feedback(drafted, accepted)


@dataclass(eq=False)
class StagedDrafter(_PolicyDraft):
    """Staged speculation (Spector & Ré 2023, "Accelerating LLM Inference with Staged Speculative Decoding"):
    a draft LM with the target's tokenizer whose own drafts come from prompt lookup.

    Where it needs tokens after a context, ``lookup`` guesses how it goes on
    (up to its ``max_tokens``, each allowed by the FSM) and ONE draft pass over
    the new context tail plus the guess gives the draft's logits at every
    guessed position. The guess's longest prefix that equals the draft's own
    masked greedy choice is drafted, then the draft's own token after it:
    several tokens for one pass. With no guess that is one pass per token, as
    `ModelDrafter` takes. The tokens drafted after a context are kept, so the
    next calls along them cost no pass; ``policy`` decides where the candidate
    stops, as `ModelDrafter`'s does. The rejected guess tail leaves the draft
    cache at the next pass (`_CachedContext` keeps the common prefix).

    Drafts are greedy, sampled rows included: point masses (``q`` None), which
    verification accepts iff the target's own draw equals the draft, so a
    sampled row draws exactly what plain sampling draws with the same seed
    (`structspec.decoding.verify`). Its cache is its own: a batch drafts for it
    row by row.
    """

    name: str = "staged_draft_model"
    lookup: PromptLookup = field(default_factory=PromptLookup)
    _run: list[int] = field(default_factory=list)  # a context, then the tokens drafted after it
    _run_probs: list[float] = field(default_factory=list)  # the draft's probability of each drafted token

    def next(self, context: list[int], state: int, fsm: TokenFSM, sampling: SamplingConfig,
             generator: torch.Generator | None) -> Step | None:
        if not self.policy.keep_going(self._probs):
            return None
        start = len(self._run) - len(self._run_probs)
        if not (start <= len(context) < len(self._run) and self._run[: len(context)] == context):
            self._draft_run(context, state, fsm)
            start = len(context)
            if start == len(self._run):  # the FSM allows nothing but EOS
                return None
        self._probs.append(self._run_probs[len(context) - start])
        return Step(self._run[len(context)], self.name)

    def _draft_run(self, context: list[int], state: int, fsm: TokenFSM) -> None:
        """Draft the tokens after ``context`` (in ``state``) that one draft pass verifies: the guess's prefix the
        draft agrees with, then the draft's own token (one pass; changes the run and the draft cache)."""
        guess = self.lookup.guess(context, self.lookup.max_tokens, fsm.next_state, state)
        walked = fsm.walk(state, guess)
        keep = next((i for i, s in enumerate(walked) if not fsm.spellable(s)), len(walked))  # masks of states
        guess, states = guess[:keep], [state] + walked[:keep]  # the vocabulary cannot leave would raise
        logits = _masked(self._own.logits_along(context + guess, len(context)), fsm, states)
        tokens: list[int] = []
        probs: list[float] = []
        for row, proposed in zip(logits, guess + [None]):
            if torch.isinf(row).all():
                break
            token = int(row.argmax())
            tokens.append(token)
            probs.append(float(row.softmax(-1)[token]))
            if token != proposed:
                break
        self._run, self._run_probs = context + tokens, probs


@dataclass(eq=False)
class CrossTokenizerDrafter(_DraftModel):
    """A draft LM with a different tokenizer: it continues the text greedily (unconstrained, in its own
    vocabulary) and the text is re-tokenized with the target's tokenizer.

    The two token streams stay aligned through text: each chunk starts from the
    target context decoded to text and re-encoded by the draft tokenizer, and
    the draft KV cache keeps the common prefix. Drafts are deterministic, so
    they verify as point masses. The last translated token is dropped (it may
    merge with the text that follows).

    With a ``lookup`` (staged speculation, as `StagedDrafter`), a chunk starts
    from prompt lookup's guess in the draft tokenizer's ids over the re-encoded
    context, checked by the draft in one pass; past the guess's first mismatch
    it goes on one pass per token. The chunk is the same greedy text either way.
    """

    target_tokenizer: Any
    target_vocab: Any
    name: str = "draft_model"
    policy: Schedule = field(default_factory=lambda: Schedule(confidence=None))
    lookup: PromptLookup | None = None  # None: one draft pass per token
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
        drafted = self._greedy(draft_ids, self.policy.length + 1)  # one spare token: the last translated is dropped
        new_text = self.lm.vocab.spell(drafted)
        try:
            ids = self.target_tokenizer.encode(new_text.decode("utf-8"), add_special_tokens=False)[:-1]
        except UnicodeDecodeError:
            ids = []
        spelled = self.target_vocab.spell(ids)
        if spelled != new_text[: len(spelled)]:
            ids = []  # the tokenizer normalized the text: no faithful translation
        self._buffer, self._base = ids, len(context)

    def _greedy(self, draft_ids: list[int], limit: int) -> list[int]:
        """The draft's greedy continuation of ``draft_ids``, up to ``limit`` tokens and short of EOS: the first
        pass also checks the lookup's guess, each later pass adds one token. Changes the draft cache."""
        guess = self.lookup.guess(draft_ids, limit - 1) if self.lookup is not None else []
        drafted: list[int] = []
        while len(drafted) < limit:
            rows = self._own.logits_along(draft_ids + drafted + guess, len(draft_ids) + len(drafted))
            rows = rows[:, : len(self.lm.vocab.token_bytes)]  # ids past the vocabulary (padding) spell nothing
            for row, proposed in zip(rows, guess + [None]):
                token = int(row.argmax())
                if token == self.lm.vocab.eos_token_id:
                    return drafted
                drafted.append(token)
                if token != proposed:
                    break
            guess = []
        return drafted

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
        return self.logits_along(context, len(context))[-1]

    def logits_along(self, context: list[int], start: int) -> torch.Tensor:
        """Next-token logits after ``context[:i]`` for each ``i`` in ``start..len(context)``
        [len(context) − start + 1, vocab], a fresh tensor: one pass feeding ``context`` from its common prefix
        with what the cache holds, or from ``start − 1`` if that is shorter (no pass when only the known last
        logits are asked for). Changes the cache: it then holds ``context``."""
        if start == len(context) and context == self.seen and self.last is not None:
            return self.last.clone()[None]
        n = next((i for i, (a, b) in enumerate(zip(self.seen, context)) if a != b), min(len(self.seen), len(context)))
        if self.cache is None:
            self.cache, n = self.lm.new_cache(), 0
        n = min(n, start - 1)  # logits after context[:start] come from position start − 1, fed again if cached
        self.lm.crop(self.cache, n)
        logits = self.lm.forward(context[n:], self.cache, logits_to_keep=len(context) - start + 1)
        self.passes += 1
        self.seen, self.last = list(context), logits[-1].clone()
        return logits


def _masked(logits: torch.Tensor, fsm: TokenFSM, states: list[int]) -> torch.Tensor:
    """Draft ``logits`` [rows, vocab] cut or padded (with -inf) to the target's logits width (extra ids belong
    to no token), row ``i`` masked by ``states[i]``, EOS ids at -inf. Changes ``logits``; returns the result.

    A candidate cannot carry EOS, so the draft distribution is q without the EOS
    ids: drawing from full q and dropping an EOS draw would bias speculative sampling.
    """
    width = fsm.logits_width
    if logits.shape[-1] >= width:
        logits = logits[:, :width]
    else:
        logits = torch.cat([logits, logits.new_full((len(logits), width - logits.shape[-1]), float("-inf"))], -1)
    fsm.mask_logits_inplace(logits, states)
    logits[:, list(fsm.eos_token_ids)] = float("-inf")
    return logits


@dataclass(frozen=True)
class Staged:
    """``draft=Staged(lm)``: the loaded draft LM ``lm`` drafting with staged speculation. It names a drafter
    and holds no state, so `generate_batch` takes it and makes one drafter per row."""

    lm: LanguageModel


SHORT_NAMES = ("prompt_lookup", "self", "staged", "threshold", "tree", "lookahead", "auto")


def make_drafter(draft: Drafter | LanguageModel | Staged | str | None, target: LanguageModel) -> Drafter | None:
    """The drafter for ``draft=``: None, a `Drafter`, a loaded LM (draft model), `Staged` (a draft model with
    staged speculation) or one of `SHORT_NAMES`. Makes a new drafter; changes nothing."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if isinstance(draft, LanguageModel):
        if draft.vocab.fingerprint == target.vocab.fingerprint:
            return ModelDrafter(draft)
        return CrossTokenizerDrafter(draft, target.tokenizer, target.vocab)
    if isinstance(draft, Staged):
        if draft.lm.vocab.fingerprint == target.vocab.fingerprint:
            return StagedDrafter(draft.lm)
        return CrossTokenizerDrafter(draft.lm, target.tokenizer, target.vocab, name="staged_draft_model",
                                     lookup=PromptLookup())
    if draft == "prompt_lookup":
        return PromptLookup()
    if draft == "self":
        return ModelDrafter(target.early_exit(), name="self_draft")
    if draft == "staged":
        return StagedDrafter(target.early_exit(), name="staged_self_draft")
    if draft == "tree":
        from structspec.decoding.tree import TreeDrafter  # tree.py imports this module: imported at the top, a cycle

        return TreeDrafter()
    if draft == "lookahead":
        from structspec.decoding.lookahead import LookaheadDrafter  # imports this module, as tree.py does

        return LookaheadDrafter()
    if draft == "threshold":
        return ModelDrafter(target.early_exit(), name="threshold", policy=Threshold())
    if draft == "auto":
        # Self-draft tokens pay only where a pass that verifies them costs about what a one-token step does:
        # on a GPU (8 tokens fed cost 1.1× one, `structspec.tools.pass_cost`); on a CPU each fed token adds
        # to the pass and a quarter-model draft pass per token, and prompt lookup alone was faster.
        if target.device.type != "cuda":
            return PromptLookup()
        return Composite(PromptLookup(), ModelDrafter(target.early_exit(), name="self_draft"))
    raise SpecError(
        f"draft={draft!r} is not a drafter: use None, a loaded LM (draft model), a Drafter, "
        f"or one of {', '.join(map(repr, SHORT_NAMES))}"
    )
