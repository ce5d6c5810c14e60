"""One output's decode as plain values: fast-forward, draft, then verify what a target pass computed.

`RowDecode` is the algorithm of one row; the drivers (`structspec.decoding.loop`
for one sequence, `structspec.decoding.batch` for many per pass) own the model,
its KV cache and the masks. Each turn:

1. `prepare`: fast-forward the tokens the FSM forces (no model call), stop if
   the output is complete or a budget is spent, and draft a candidate under the
   FSM — forced text in its canonical spelling (spliced for free) and the
   drafter's tokens. Returns the window to feed: pending tokens + candidate.
2. the driver runs one target pass over the window, keeping logits for the
   candidate positions and the bonus position, masked by `mask_states`;
3. `accept`: verify (greedy match or speculative sampling,
   `structspec.decoding.verify`), keep the accepted path and the target's own
   token. FSM states are kept per output position, so rollback is indexing;
   the driver drops the rejected rest from its cache.

A batch driver may `fit` a greedy row's window to the width its pass takes
(`structspec.decoding.budget.choose_width`): the candidate cut to its first
nodes, or, where the pending tokens alone are longer (a long forced run), a
chunk of them fed with no logits and nothing to verify (`accept_chunk`).
Pending tokens are output already and greedy output never depends on drafts,
so neither changes the row's tokens.

A candidate is a chain, or a token tree (`TreeDrafting`, `structspec.decoding.tree`)
when the driver runs the slot path (``trees``) and the row is greedy: its window
then carries each token's parent (`window_parents`) and position
(`window_positions`), and the verified path is one branch of it. A greedy row
shows the target's choice at every candidate position to a drafter that learns
from them (`Observing`, `structspec.decoding.lookahead`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.budget import DEFAULT_COST, DraftLength, PassCost
from structspec.decoding.drafters import Drafter
from structspec.decoding.fastforward import FastForward, Forcer
from structspec.decoding.sampling import SamplingConfig, warp_logits
from structspec.decoding.verify import accept_tree, verify_sampled
from structspec.errors import OptionError
from structspec.result import DraftStats, Stats, StopReason

FORCED, MODEL = "forced", "model"  # sources besides drafter names


@dataclass(frozen=True)
class DecodeOptions:
    """How to decode; ``max_new_tokens`` counts output tokens (EOS is not output)."""

    max_new_tokens: int = 512
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int | None = None
    fast_forward: FastForward = "exact"
    output_logprobs: bool = False  # keep each output token's log-probability (`token_logprobs`)

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


@dataclass(eq=False)
class RowDecode:
    """The decode state of one output after ``prompt_ids``; changed by `prepare` and `accept` only.

    ``cached`` counts the positions the target's KV cache holds for this row
    (prompt and output tokens it has seen); ``pending`` are tokens it has not
    seen yet, fed at the next pass.
    """

    fsm: TokenFSM
    prompt_ids: list[int]
    options: DecodeOptions
    forcer: Forcer | None
    drafter: Drafter | None
    generator: torch.Generator | None
    stats: Stats
    max_context: int | None = None  # the model's positions; None: unbounded
    lengths: DraftLength | None = None  # how long a draft pays (with a drafter)
    trees: bool = False  # the driver verifies token trees (the slot path): a greedy `TreeDrafting` row drafts them
    cached: int = 0
    pending: list[int] = field(default_factory=list)
    chunk: int = 0  # pending tokens the next pass feeds with no logits (`fit`); 0: all of them and the candidate
    out: list[int] = field(default_factory=list)
    states: list[int] = field(default_factory=list)  # states[i]: the FSM state after out[i]
    sources: list[str] = field(default_factory=list)
    logprobs: list[float] | None = None  # per output token, kept only with ``options.output_logprobs``
    stop: StopReason | None = None
    candidate: Candidate = field(default_factory=lambda: Candidate())

    @classmethod
    def start(
        cls, fsm: TokenFSM, tokenizer: object, prompt_ids: list[int], options: DecodeOptions,
        drafter: Drafter | None, generator: torch.Generator | None, max_context: int | None = None,
        cost: PassCost = DEFAULT_COST, trees: bool = False,
    ) -> RowDecode:
        """A row before its first pass: the whole prompt is pending. ``cost``: the target's pass cost by
        tokens fed, which sets draft lengths (`structspec.decoding.budget`); ``trees``: whether the driver
        verifies token trees."""
        forcer = Forcer(fsm, tokenizer) if options.fast_forward == "exact" else None
        stats = Stats(prompt_tokens=len(prompt_ids))
        lengths = DraftLength(cost) if drafter is not None else None
        return cls(fsm, list(prompt_ids), options, forcer, drafter, generator, stats, max_context, lengths, trees,
                   pending=list(prompt_ids), logprobs=[] if options.output_logprobs else None)

    @property
    def state(self) -> int:
        return self.states[-1] if self.states else self.fsm.initial_state

    def prepare(self, rows: int = 1) -> list[int] | None:
        """Fast-forward and draft; the window to feed next (pending + candidate), or None once stopped.
        ``rows``: how many rows share the pass (sets the draft length of a greedy row)."""
        if self.stop is not None:
            return None
        t0 = time.perf_counter()
        forced = self.forcer.force(self.state) if self.forcer else None
        if forced:
            self.pending += forced.token_ids
            self.out += forced.token_ids
            self.states += forced.states
            self.sources += [FORCED] * len(forced.token_ids)
            if self.logprobs is not None:  # the FSM allowed nothing else: probability 1
                self.logprobs += [0.0] * len(forced.token_ids)
        self.stats.constraint_seconds += time.perf_counter() - t0
        budget = self.options.max_new_tokens
        if len(self.out) > budget:
            del self.out[budget:], self.states[budget:], self.sources[budget:]
            if self.logprobs is not None:
                del self.logprobs[budget:]
            return self._finish("max_new_tokens")
        if self.fsm.is_complete(self.state):
            return self._finish("fsm_complete")
        limit = budget - len(self.out)  # candidate tokens
        if self.max_context is not None:
            room = self.max_context - self.cached - len(self.pending)
            if room < 0:  # the pending tokens do not fit: the context is full
                return self._finish("max_context")
            limit = min(limit, room)
        shared = 1 if self.options.sampling.do_sample else rows  # a sampled row drafts alike in any batch
        drafted = self.lengths.choose(len(self.pending), limit, shared) if self.lengths else 0
        context = self.prompt_ids + self.out
        if self.trees and isinstance(self.drafter, TreeDrafting) and not self.options.sampling.do_sample:
            self.candidate = self.drafter.draft_tree(
                self.forcer, self.fsm, context, self.state, limit, drafted, self.options, self.stats)
        else:
            self.candidate = draft_candidate(
                self.drafter, self.forcer, self.fsm, context, self.state,
                limit, drafted, self.options, self.generator, self.stats,
            )
        return self.pending + self.candidate.tokens

    def window_gains(self) -> list[float]:
        """Expected tokens the last window adds to the row's cache when only its first ``w`` tokens are fed
        (entry ``w − 1``, for every ``w`` up to its length; `fit`): the pending tokens fed, then, once all are,
        the candidate's expected kept path (`DraftLength.expected_kept`). Changes nothing."""
        cand, fed = self.candidate, len(self.pending)
        kept = (self.lengths.expected_kept(cand.parent_indices(), [s != FORCED for s in cand.sources]) if self.lengths
                else [float(n) for n in range(1, len(cand.tokens) + 1)])  # no drafter: forced text only
        return [float(w) for w in range(1, fed + 1)] + [fed + k for k in kept]

    def fit(self, width: int) -> list[int]:
        """The last window cut to its first ``width`` tokens (whole where it fits): the candidate keeps its first
        nodes (a chain's prefix; a tree's topological prefix is a tree), or, where the pending tokens alone are
        longer, the pass feeds a chunk of them with no candidate and no logits. Cuts greedy rows only: a sampled
        row's draft was drawn with its generator, so the driver's width fits it. Changes the candidate and `chunk`."""
        fed, cand = len(self.pending), self.candidate
        if width < fed:
            self.chunk, self.candidate = width, Candidate()
            return self.pending[:width]
        n = width - fed
        self.candidate = Candidate(cand.tokens[:n], cand.states[:n], cand.sources[:n], cand.q[:n],
                                   cand.parents[:n] if cand.parents is not None else None)
        return self.pending + self.candidate.tokens

    def mask_states(self) -> list[int]:
        """The FSM state each logits row of the last window is masked by: the state before each candidate
        token, then the bonus row's; none for a chunk. Does not change anything."""
        return [] if self.chunk else [self.state] + self.candidate.states

    def window_parents(self) -> list[int]:
        """Each token's parent as an offset in the last window (−1 for the first, which follows the cache):
        the pending tokens fed form a chain, the candidate's roots follow the last of them. Changes nothing."""
        fed = self.chunk or len(self.pending)
        return list(range(-1, fed - 1)) + [fed + p for p in self.candidate.parent_indices()]

    def window_positions(self) -> list[int]:
        """Each token's position in the last window: one past its parent's (siblings share one). Changes
        nothing."""
        positions: list[int] = []
        for p in self.window_parents():
            positions.append(positions[p] + 1 if p >= 0 else self.cached)
        return positions

    def verify(self, logits: torch.Tensor, choices: list[int] | None = None) -> tuple[list[int], int]:
        """The target's verdict on the candidate from its masked ``logits`` [len(candidate) + 1, vocab]:
        (verified path as candidate indices, next token). A sampled row draws from its generator; a greedy row
        takes each logits row's argmax (``choices``, where the driver read them already) and shows them to an
        `Observing` drafter, which learns from them. Changes nothing in the row."""
        cand = self.candidate
        if self.options.sampling.do_sample:  # sampled rows draft chains only
            accepted, token = verify_sampled(logits, cand.tokens, cand.q, self.options.sampling, self.generator)
            return list(range(accepted)), token
        if choices is None:
            choices = logits.argmax(-1).tolist()
        if isinstance(self.drafter, Observing):
            self.drafter.observe(self.prompt_ids + self.out, cand, choices)
        return self.choose(choices)

    def choose(self, choices: list[int]) -> tuple[list[int], int]:
        """The greedy verdict from the target's masked argmax at each logits row (``choices``): (verified
        path, next token). Changes nothing."""
        return accept_tree(choices, self.candidate.tokens, self.candidate.parent_indices())

    def path_logprobs(self, logits: torch.Tensor, path: list[int], token: int) -> list[float] | None:
        """With ``options.output_logprobs``, the log-probabilities of the ``path``'s tokens and ``token`` under
        the masked ``logits`` of the last window (rows: the root's, then the one after each path node); else
        None. Changes nothing."""
        if self.logprobs is None:
            return None
        rows = [0] + [1 + i for i in path]
        return token_logprobs(logits[rows], [self.candidate.tokens[i] for i in path] + [token], self.options.sampling)

    def accept(self, path: list[int], token: int, scores: list[float] | None = None) -> list[int]:
        """Keep the candidate's tokens on ``path`` (candidate indices from the root; a chain's accepted prefix
        is ``range(accepted)``) and the target's ``token`` (EOS ends the row). ``scores`` are their
        ``len(path) + 1`` log-probabilities (`path_logprobs`), kept when the row keeps log-probabilities.
        Returns the window offsets whose KV stays in the cache (the pending tokens, then the path's: a prefix
        for a chain); the driver drops the rest."""
        t0 = time.perf_counter()
        cand, fed, accepted = self.candidate, len(self.pending), len(path)
        parents = cand.parent_indices()
        last = path[-1] if path else -1
        rejected = next((i for i, p in enumerate(parents) if p == last and cand.sources[i] == FORCED), None)
        if rejected is not None and self.forcer:
            self.forcer.learn(cand.tokens[rejected], token)
        state = self.state
        self.out += [cand.tokens[i] for i in path]
        self.states += [cand.states[i] for i in path]
        self.sources += [cand.sources[i] for i in path]
        if self.logprobs is not None:
            assert scores is not None, "a row keeping log-probabilities is given its scores"
            self.logprobs += scores[:accepted]
        self.cached += fed + accepted
        self.pending = []
        _count_drafts(self.stats, self.drafter, cand, path)
        if cand.parents is not None:
            self.stats.tree_nodes += len(cand.tokens)
        if self.lengths is not None:
            drafted = [s != FORCED for s in cand.sources]
            depth: list[int] = []  # drafter tokens from the root to each node: a chain's deepest is all of them
            for i, p in enumerate(parents):
                depth.append((depth[p] if p >= 0 else 0) + drafted[i])
            self.lengths.record(max(depth, default=0), sum(drafted[i] for i in path))
        self.candidate = Candidate()
        if accepted:
            state = self.states[-1]
        if self.fsm.is_complete(state):  # the candidate finished the output; the target's token is EOS
            self._finish("fsm_complete")
        elif token in self.fsm.eos_token_ids:
            self._finish("eos")
        elif len(self.out) == self.options.max_new_tokens:
            self._finish("max_new_tokens")
        else:
            self.out.append(token)
            self.states.append(self.fsm.next_state(state, token))
            self.sources.append(MODEL)
            if self.logprobs is not None:
                self.logprobs.append(scores[accepted])  # type: ignore[index]
            self.pending = [token]
        self.stats.constraint_seconds += time.perf_counter() - t0
        return list(range(fed)) + [fed + i for i in path]

    def accept_chunk(self) -> list[int]:
        """After a pass that fed a chunk (`fit`): those pending tokens are in the cache, the rest stay
        pending. Returns their window offsets, all kept (changes the row)."""
        fed, self.chunk = self.chunk, 0
        self.cached += fed
        del self.pending[:fed]
        return list(range(fed))

    def decoded(self) -> Decoded:
        """The row's output so far as a `Decoded` (call once stopped). Does not change the row."""
        _count_output(self.stats, self.fsm, self.out, self.sources)
        assert self.stop is not None, "decoded() is called on a stopped row"
        return Decoded(self.out, self.sources, self.stop, self.stats, self.logprobs)

    def _finish(self, reason: StopReason) -> None:
        self.stop = reason


def token_logprobs(logits: torch.Tensor, tokens: list[int], sampling: SamplingConfig) -> list[float]:
    """Log-probability of ``tokens[i]`` under row ``i`` of the masked ``logits`` [≥ len(tokens), vocab]: the
    warped distribution a sampler draws from, or the masked softmax when greedy (a single allowed token
    scores 0.0)."""
    rows = logits[: len(tokens)].float()
    if sampling.do_sample:
        rows = warp_logits(rows, sampling)
    at = torch.arange(len(tokens), device=rows.device)
    picked = rows.log_softmax(-1)[at, torch.tensor(tokens, device=rows.device)]
    return picked.tolist()


@dataclass
class Candidate:
    """Drafted tokens with the FSM state after each, who proposed it, and its draft distribution: a chain, or a
    token tree in topological order whose ``parents[i]`` is the index of the token ``i`` follows (−1: the
    pending tokens)."""

    tokens: list[int] = field(default_factory=list)
    states: list[int] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    q: list[torch.Tensor | None] = field(default_factory=list)  # None: a point mass
    parents: list[int] | None = None  # None: a chain

    def parent_indices(self) -> list[int]:
        """Each token's parent index (a chain's: ``i − 1``). Changes nothing."""
        return self.parents if self.parents is not None else list(range(-1, len(self.tokens) - 1))


@runtime_checkable
class TreeDrafting(Drafter, Protocol):
    """A drafter that drafts token trees for greedy rows (`structspec.decoding.tree.TreeDrafter`); a chain
    through `Drafter.next` elsewhere."""

    def draft_tree(
        self, forcer: Forcer | None, fsm: TokenFSM, context: list[int], state: int, limit: int, drafted: int,
        options: DecodeOptions, stats: Stats,
    ) -> Candidate:
        """A token tree after ``context`` (in ``state``), at most ``limit`` deep, its size set by ``drafted``
        (the drafter tokens the cost model would feed); every token allowed by the FSM."""


@runtime_checkable
class Observing(Protocol):
    """A drafter that learns from the target's choices (`structspec.decoding.lookahead.LookaheadDrafter`)."""

    def observe(self, context: list[int], candidate: Candidate, choices: list[int]) -> None:
        """The target's masked argmax at the root (``choices[0]``) and after each token ``i`` of ``candidate``
        (``choices[1 + i]``), drafted after ``context`` (changes the drafter)."""


def draft_candidate(
    drafter: Drafter | None, forcer: Forcer | None, fsm: TokenFSM, context: list[int], state: int, limit: int,
    drafted: int, options: DecodeOptions, generator: torch.Generator | None, stats: Stats,
) -> Candidate:
    """Up to ``limit`` tokens after ``context`` (in ``state``): forced text spelled canonically wherever the
    FSM forces some, at most ``drafted`` of the drafter's tokens elsewhere; every token is allowed by the FSM."""
    cand = Candidate()
    if drafter is not None:
        drafter.begin()
    while len(cand.tokens) < limit and not fsm.is_complete(state):
        t0 = time.perf_counter()
        spliced, spliced_states = forcer.spelled(state) if forcer else ([], [])
        if spliced:
            # a state the vocabulary cannot leave ends the candidate: only the output reaching it may raise
            n = min(next((i for i, s in enumerate(spliced_states) if not fsm.spellable(s)), len(spliced)),
                    limit - len(cand.tokens))
            if n == 0:
                break
            cand.tokens += spliced[:n]
            cand.states += spliced_states[:n]
            cand.sources += [FORCED] * n
            cand.q += [None] * n
            state = spliced_states[n - 1]
            stats.constraint_seconds += time.perf_counter() - t0
            continue
        if drafter is None or drafted == 0:
            break
        drafted -= 1
        passes = drafter.passes
        step = drafter.next(context + cand.tokens, state, fsm, options.sampling, generator)
        entry = stats.drafts.setdefault(step.source if step else drafter.name, DraftStats())
        entry.seconds += time.perf_counter() - t0
        entry.draft_passes += drafter.passes - passes
        next_state = fsm.next_state(state, step.token) if step else None
        if step is None or next_state is None or not fsm.spellable(next_state):
            break
        cand.tokens.append(step.token)
        cand.states.append(next_state)
        cand.sources.append(step.source)
        cand.q.append(step.q)
        state = next_state
    return cand


def _count_drafts(stats: Stats, drafter: Drafter | None, cand: Candidate, path: list[int]) -> None:
    """Per-source drafted/accepted counts of one verified candidate (a tree's every node is drafted, its path
    accepted); tells the drafter how it did."""
    drafted: dict[str, int] = {}
    kept: dict[str, int] = {}
    on_path = set(path)
    for i, source in enumerate(cand.sources):
        drafted[source] = drafted.get(source, 0) + 1
        kept[source] = kept.get(source, 0) + (i in on_path)
    for source, n in drafted.items():
        entry = stats.drafts.setdefault(source, DraftStats())
        entry.drafted += n
        entry.accepted += kept[source]
        entry.verify_passes += 1
    if drafter is not None:
        drafter.feedback(drafted, kept)


def _count_output(stats: Stats, fsm: TokenFSM, out: list[int], sources: list[str]) -> None:
    stats.output_tokens = len(out)
    stats.forced_tokens = sources[: len(out)].count(FORCED)
    stats.model_tokens = sources[: len(out)].count(MODEL)
    stats.forced_bytes = sum(len(fsm.vocab.token_bytes[t] or b"") for t, s in zip(out, sources) if s == FORCED)

