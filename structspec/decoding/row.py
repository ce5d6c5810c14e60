"""One output's decode as plain values: fast-forward, draft, then commit what a target pass computed.

`RowDecode` is the algorithm of one row; the drivers (`structspec.decoding.loop`
for one sequence, `structspec.decoding.batch` for many per pass) own the model,
its KV cache and the masks, and run a turn in two calls:

1. `prepare`: fast-forward the tokens the FSM forces (no model call), stop if
   the output is complete or a budget is spent, and draft a candidate under the
   FSM — forced text in its canonical spelling (spliced for free) and the
   drafter's tokens. Returns a frozen `structspec.decoding.window.Window`
   (pending tokens + candidate, their positions, parents, mask states and
   gains), or the `Decoded` once the row stopped;
2. the driver cuts the window to the width its pass pays for (`Window.first`),
   runs one target pass over it (`structspec.decoding.passes.run_pass`) and
   hands the masked logits to `commit`: verify (greedy match or speculative
   sampling, `structspec.decoding.verify`), keep the accepted path and the
   target's own token, record the pass in the stats. The output's FSM states,
   its forced text and learned splits are its `structspec.decoding.cursor.Cursor`
   (the one every adapter drives too), so rollback is indexing; `commit` says
   which window tokens stay in the cache and the driver drops the rest.

A window cut short of its pending tokens is a chunk of them, fed with no logits
and nothing to verify. Pending tokens are output already and greedy output
never depends on drafts, so no cut changes a greedy row's tokens; a sampled
row's draft was drawn with its generator, so it is fed whole.

A candidate is a chain (`structspec.decoding.chain.Chain`), or a token tree (`TreeDrafting`,
`structspec.decoding.drafters.tree`) when the driver runs the slot path (``trees``) and the row is greedy: the verified
path is then one branch of it. A greedy row shows the target's choice at every candidate position to a drafter
that learns from them (`Observing`, `structspec.decoding.drafters.lookahead`). A chain whose drafter waits on a batched
draft pass makes `prepare` return that `DraftRequest`: the batch driver runs the pass and calls `prepare` again,
which drafts on from where the chain stopped.

The row is the one writer of its `Stats`: the drivers hand it what a pass cost (`commit`, `prefilled`).
A row whose output reaches a state the vocabulary cannot spell on from stops with ``"error"`` and the
`UnspellableError` in ``error``, checked in `prepare` before anything reads the state (the verdict is kept
per FSM state).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.cost import DraftLength, PassCost
from structspec.decoding.candidate import FORCED, MODEL, Candidate, DraftRequest
from structspec.decoding.chain import Chain
from structspec.decoding.cursor import Cursor
from structspec.decoding.drafter import Drafter, ModelDrafting, Observing, TreeDrafting, Turn
from structspec.decoding.fastforward import FastForward, Forcer
from structspec.decoding.repetition import Repetition, path_tails, repetition_logits
from structspec.decoding.sampling import SamplingConfig, token_logprobs
from structspec.decoding.verify import accept_tree, verify_sampled
from structspec.decoding.window import Window
from structspec.errors import OptionError, UnspellableError
from structspec.models.protocol import LanguageModel
from structspec.result import DraftStats, Stats, StopReason


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; ``max_new_tokens`` counts output tokens (EOS is not output)."""

    max_new_tokens: int = 512
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    fast_forward: FastForward = "exact"
    output_logprobs: bool = False  # keep each output token's log-probability (`token_logprobs`)
    repetition: Repetition = field(default_factory=Repetition)  # applied to every verified logits row

    def __post_init__(self) -> None:
        if self.max_new_tokens <= 0:
            raise OptionError(f"max_new_tokens must be ≥ 1, got {self.max_new_tokens}")
        if self.fast_forward == "canonical":
            raise OptionError(
                "fast_forward='canonical' was retired: use 'exact', which splices the canonical spelling into "
                "verified drafts, is lossless and needs fewer passes"
            )
        if self.fast_forward not in ("off", "exact"):
            raise OptionError(f"fast_forward must be 'off' or 'exact', got {self.fast_forward!r}")


@dataclass
class Decoded:
    """Raw loop output, before parsing: tokens, how each was produced, why it stopped."""

    token_ids: list[int]
    sources: list[str]  # per token: "forced", "model" or the drafter's name
    stop_reason: StopReason
    stats: Stats
    logprobs: list[float] | None = None  # per token, with ``output_logprobs``
    error: UnspellableError | None = None  # with stop_reason "error": the state the vocabulary cannot leave


@dataclass(frozen=True)
class RowInput:
    """One row to decode: its index in the caller's list, FSM, prompt ids, drafter and generator."""

    index: int
    fsm: TokenFSM
    prompt_ids: list[int]
    drafter: Drafter | None
    generator: torch.Generator | None


@dataclass(frozen=True)
class Committed:
    """What a row kept of a pass: ``kept``, the window offsets whose KV stays in the cache (the pending tokens fed,
    then the verified path: a prefix for a chain), and the output tokens (with their sources) the turn added:
    forced, accepted drafts and the target's own."""

    kept: list[int]
    token_ids: list[int]
    sources: list[str]


@dataclass(eq=False)
class RowDecode:
    """The decode state of one output (``item``); changed by `prepare`, `commit` and `prefilled`.

    ``cached`` counts the positions the target's KV cache holds for this row
    (prompt and output tokens it has seen); ``pending`` are tokens it has not
    seen yet, fed at the next pass.
    """

    item: RowInput  # the FSM, prompt, drafter and generator
    options: DecodeOptions
    cursor: Cursor  # the output's FSM states, forced text and learned splits
    stats: Stats
    max_context: int | None = None  # the model's positions; None: unbounded
    lengths: DraftLength | None = None  # the one decision on draft lengths (with a drafter)
    trees: bool = False  # the driver verifies token trees (the slot path): a greedy `TreeDrafting` row drafts them
    cached: int = 0
    pending: list[int] = field(default_factory=list)
    out: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # per output token, computed with ``output_logprobs``
    stop: StopReason | None = None
    error: UnspellableError | None = None  # why the row stopped with "error"
    chain: Chain | None = None  # a chain still being drafted (its drafter waits on a batched draft pass)
    told: int = 0  # output tokens a `Committed` has handed out already

    @classmethod
    def start(cls, item: RowInput, options: DecodeOptions, lm: LanguageModel, cost: PassCost,
              pool: DraftLength | None = None) -> RowDecode:
        """``item``'s row before its first pass on ``lm``: the whole prompt is pending. ``cost``: the target's
        pass cost by tokens fed, which sets draft lengths with what a pass of the drafter's model costs
        (`structspec.decoding.cost.DraftLength`), from ``pool``'s acceptance where a greedy row is given one (the
        rows of its job; a sampled row drafts by its own history alone, so that a seed reproduces its sample in
        any job). A model that batches
        (`LM.batchable`) runs on the slot path, where a greedy row's tree drafter drafts token trees. Changes
        nothing."""
        cursor = Cursor(item.fsm, Forcer(item.fsm, lm.tokenizer))
        stats = Stats(prompt_tokens=len(item.prompt_ids), dtype=str(lm.dtype).removeprefix("torch."),
                      batch_invariant=lm.batch_invariant)
        drafter, pool = item.drafter, None if options.sampling.do_sample else pool
        if isinstance(drafter, ModelDrafting):  # its passes cost, and it stops itself after a token it is unsure of
            lengths: DraftLength | None = DraftLength(cost, drafter.draft_pass_cost(lm), unsure_stops=True, pool=pool)
        else:
            lengths = DraftLength(cost, pool=pool) if drafter is not None else None
        return cls(item, options, cursor, stats, lm.max_context, lengths, lm.batchable, pending=list(item.prompt_ids))

    @property
    def state(self) -> int:
        return self.cursor.state

    @property
    def forcer(self) -> Forcer | None:
        """The cursor's forcer where fast-forward is on, else None. Changes nothing."""
        return self.cursor.forcer if self.options.fast_forward == "exact" else None

    def prepare(self) -> Window | DraftRequest | Decoded:
        """Fast-forward and draft: the `Window` to feed next (pending + candidate), the `Decoded` once stopped,
        or the `DraftRequest` of a drafter waiting on a batched draft pass (call again once it ran: the chain
        goes on from there). The draft is as long as it pays for a row alone; a batch then feeds it as far as it
        pays there (`Window.first`). Changes the row and its drafter."""
        if self.stop is not None:
            return self._decoded()
        if self.chain is None:
            turn = self._turn()
            if turn is None:
                return self._decoded()
            if self.trees and isinstance(self.item.drafter, TreeDrafting) and not self.options.sampling.do_sample:
                return self._window(self.item.drafter.draft_tree(turn))
            self.chain = Chain(self.item.drafter, turn)
        if (request := self.chain.extend()) is not None:
            return request
        candidate, self.chain = self.chain.candidate, None
        return self._window(candidate)

    def _turn(self) -> Turn | None:
        """Fast-forward the forced tokens, then stop the row (None) or say what its next candidate may be."""
        t0 = time.perf_counter()
        if forced := self.cursor.forced() if self.forcer else None:
            n = len(forced.token_ids)  # the FSM allowed nothing else: probability 1
            self._emit(forced.token_ids, [FORCED] * n, [0.0] * n)
            self.pending += forced.token_ids
        self.stats.constraint_seconds += time.perf_counter() - t0
        budget, fsm, state = self.options.max_new_tokens, self.item.fsm, self.state
        room = budget if self.max_context is None else self.max_context - self.cached - len(self.pending)
        if len(self.out) > budget:
            self.cursor.rollback(len(self.out) - budget)
            for values in (self.out, self.sources, self.logprobs):
                del values[budget:]
            self.stop = "max_new_tokens"
        # the one place an unspellable state is met: drafts never enter one, only the output does
        elif (error := fsm.unspellable(state)) is not None:
            self.stop, self.error = "error", error
        elif fsm.is_complete(state):
            self.stop = "fsm_complete"
        elif room < 0:  # the pending tokens do not fit: the context is full
            self.stop = "max_context"
        if self.stop is not None:
            return None
        limit = min(budget - len(self.out), room)  # candidate tokens
        drafted = self.lengths.choose(len(self.pending), limit) if self.lengths else 0
        context = self.item.prompt_ids + self.out
        return self.cursor.turn(context, limit, drafted, self.options.sampling, self.item.generator,
                                self.forcer is not None)

    def _window(self, cand: Candidate) -> Window:
        """``cand`` after the pending tokens, as a window with its gains: the pending tokens fed, then, once all
        are, the candidate's expected kept path (`DraftLength.expected_kept`). Changes nothing."""
        fed = len(self.pending)
        kept = (self.lengths.expected_kept(cand.parent_indices(), [s != FORCED for s in cand.sources]) if self.lengths
                else [float(n) for n in range(1, len(cand.tokens) + 1)])  # no drafter: forced text only
        gains = tuple([float(w) for w in range(1, fed + 1)] + [fed + k for k in kept])
        return Window(self.item.fsm, tuple(self.pending), cand, self.cached, self.state, gains,
                      self.options.sampling.do_sample)

    def commit(self, window: Window, logits: torch.Tensor, choices: list[int] | None = None,
               model_seconds: float = 0.0, constraint_seconds: float = 0.0) -> Committed:
        """A target pass fed ``window`` (this row's last, maybe cut: `Window.first`) and computed its masked
        ``logits`` [len(window.states), vocab] (``choices``: each row's argmax, where the driver read them
        already), costing the row these seconds (its share of a batched pass). Applies the repetition controls to
        each logits row from its own prefix (`structspec.decoding.repetition`), verifies the candidate, keeps
        the verified path and the target's own token (EOS ends the row), records the pass. A chunk is kept
        whole with nothing to verify. Changes the row, its stats, generator, forcer and drafter."""
        self.stats.target_forward_passes += 1
        self.stats.tokens_fed.append(len(window.tokens))
        self.stats.model_seconds += model_seconds
        self.stats.constraint_seconds += constraint_seconds
        if window.chunk:
            self.cached += window.chunk
            del self.pending[: window.chunk]
            kept = list(range(window.chunk))
        else:
            if self.options.repetition.active:  # each row from its own prefix; the driver's argmax read none
                tails = path_tails(window.candidate.tokens, window.candidate.parent_indices())
                logits = repetition_logits(logits, self.item.prompt_ids + self.out, tails, self.options.repetition)
                choices = None
            path, token = self._verify(window.candidate, logits, choices)
            kept = self._accept(window, path, token, self._path_logprobs(window.candidate, logits, path, token))
        told, self.told = self.told, len(self.out)
        return Committed(kept, self.out[told:], self.sources[told:])

    def _verify(self, cand: Candidate, logits: torch.Tensor, choices: list[int] | None) -> tuple[list[int], int]:
        """The target's verdict on ``cand`` from its masked ``logits`` [len(cand) + 1, vocab]: (verified path as
        candidate indices, next token). A sampled row draws from its generator (which advances); a greedy row
        takes each logits row's argmax (``choices``, where the driver read them already) and shows them to an
        `Observing` drafter, which learns from them. Changes the generator and the drafter, not the row."""
        if self.options.sampling.do_sample:  # sampled rows draft chains only
            accepted, token = verify_sampled(logits, cand.tokens, cand.q, self.options.sampling, self.item.generator)
            return list(range(accepted)), token
        if choices is None:
            choices = logits.argmax(-1).tolist()
        if isinstance(self.item.drafter, Observing):
            self.item.drafter.observe(self.item.prompt_ids + self.out, cand, choices)
        return accept_tree(choices, cand.tokens, cand.parent_indices())

    def _path_logprobs(self, cand: Candidate, logits: torch.Tensor, path: list[int], token: int) -> list[float]:
        """The log-probabilities of the ``path``'s tokens and ``token`` under the masked ``logits`` (rows: the
        root's, then the one after each path node) with ``options.output_logprobs``; else zeros, never read.
        Changes nothing."""
        if not self.options.output_logprobs:
            return [0.0] * (len(path) + 1)
        rows = [0] + [1 + i for i in path]
        return token_logprobs(logits[rows], [cand.tokens[i] for i in path] + [token], self.options.sampling)

    def _accept(self, window: Window, path: list[int], token: int, scores: list[float]) -> list[int]:
        """Keep the candidate's tokens on ``path`` (candidate indices from the root; a chain's accepted prefix
        is ``range(accepted)``) and the target's ``token`` (EOS ends the row), with their ``len(path) + 1``
        log-probabilities ``scores``. Returns the window offsets whose KV stays in the cache. Changes the row,
        its stats, forcer and drafter."""
        t0 = time.perf_counter()
        cand, fed, accepted, fsm = window.candidate, len(window.pending), len(path), self.item.fsm
        parents = cand.parent_indices()
        if self.forcer:
            self.cursor.learn(cand, path, token)
        self._emit([cand.tokens[i] for i in path], [cand.sources[i] for i in path], scores[:accepted])
        self.cached += fed + accepted
        self.pending = []
        self._count_drafts(cand, path)
        if self.lengths is not None:
            drafted = [s != FORCED for s in cand.sources]
            depth: list[int] = []  # drafter tokens from the root to each node: a chain's deepest is all of them
            for i, p in enumerate(parents):
                depth.append((depth[p] if p >= 0 else 0) + drafted[i])
            self.lengths.record(max(depth, default=0), sum(drafted[i] for i in path), cand.draft_passes,
                                len(drafted) - sum(drafted))
        state = self.state
        if fsm.is_complete(state):  # the candidate finished the output; the target's token is EOS
            self.stop = "fsm_complete"
        elif token in fsm.eos_token_ids:
            self.stop = "eos"
        elif len(self.out) == self.options.max_new_tokens:
            self.stop = "max_new_tokens"
        else:
            self._emit([token], [MODEL], scores[accepted:])
            self.pending = [token]
        self.stats.constraint_seconds += time.perf_counter() - t0
        return list(range(fed)) + [fed + i for i in path]

    def _emit(self, tokens: list[int], sources: list[str], logprobs: list[float]) -> None:
        """Append output ``tokens`` (the cursor accepts them: the FSM allowed each), their sources and
        log-probabilities (changes the row)."""
        accepted = self.cursor.accept(tokens)
        assert accepted, "a row emits only tokens its FSM allowed: forced, verified under the masks, or masked"
        self.out += tokens
        self.sources += sources
        self.logprobs += logprobs

    def prefilled(self, fed: int, seconds: float, reused: int = 0) -> None:
        """The prompt but its last token is in the cache: ``reused`` tokens from held chunks or the prompts' shared
        prefix and ``fed`` from a prefill of its own that took ``seconds`` (with the copy of what was reused); the
        last token stays pending. Changes the row and its stats."""
        self.cached, self.pending = reused + fed, self.item.prompt_ids[reused + fed :]
        if fed:
            self.stats.prefill_passes += 1
        self.stats.prefix_tokens_reused = reused
        self.stats.model_seconds += seconds

    def _decoded(self) -> Decoded:
        """The stopped row's output as a `Decoded`. Fills the output counts of the row's stats; changes nothing
        else."""
        stats, out, sources = self.stats, self.out, self.sources
        stats.output_tokens = len(out)
        stats.forced_tokens = sources.count(FORCED)
        stats.model_tokens = sources.count(MODEL)
        spelled = self.item.fsm.vocab.token_bytes
        stats.forced_bytes = sum(len(spelled[t] or b"") for t, s in zip(out, sources) if s == FORCED)
        logprobs = self.logprobs if self.options.output_logprobs else None
        return Decoded(out, sources, self.stop, stats, logprobs, self.error)

    def _count_drafts(self, cand: Candidate, path: list[int]) -> None:
        """Per-source drafted/accepted counts and drafting time of the verified candidate ``cand`` (a tree's every
        node is drafted, its ``path`` accepted); tells the drafter how it did. Changes the stats and the drafter."""
        stats = self.stats
        for source, seconds in cand.seconds.items():  # (forced text spliced: constraint time)
            if source == FORCED:
                stats.constraint_seconds += seconds
            else:
                stats.drafts.setdefault(source, DraftStats()).seconds += seconds
        if self.item.drafter is not None and cand.draft_passes:
            stats.drafts.setdefault(self.item.drafter.name, DraftStats()).draft_passes += cand.draft_passes
        drafted, kept = Counter(cand.sources), Counter(cand.sources[i] for i in path)
        for source, n in drafted.items():
            entry = stats.drafts.setdefault(source, DraftStats())
            entry.drafted += n
            entry.accepted += kept[source]
            entry.verify_passes += 1
        if cand.parents is not None:
            stats.tree_nodes += len(cand.tokens)
        if self.item.drafter is not None:
            self.item.drafter.feedback(drafted, kept)
