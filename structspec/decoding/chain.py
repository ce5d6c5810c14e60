"""A chain candidate: forced text spelled canonically wherever the FSM forces some, a drafter's tokens
elsewhere, every token allowed by the FSM."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from structspec.decoding.candidate import FORCED, Candidate, DraftRequest, enterable
from structspec.decoding.drafter import Drafter, Turn


@dataclass(eq=False)
class Chain:
    """A chain being drafted under ``turn`` by ``drafter`` (None: forced text only). Making one starts the
    drafter's candidate (`Drafter.begin`)."""

    drafter: Drafter | None
    turn: Turn
    candidate: Candidate = field(default_factory=Candidate)

    def __post_init__(self) -> None:
        if self.drafter is not None:
            self.drafter.begin()
            self._passes = self.drafter.passes

    def extend(self) -> DraftRequest | None:
        """Draft on from the candidate's end until it is done (None) or the drafter asks for draft logits (the
        request: call again once the draft pass ran). Changes the candidate and the drafter."""
        turn, cand, fsm, forcer = self.turn, self.candidate, self.turn.fsm, self.turn.forcer
        state = cand.states[-1] if cand.states else turn.state
        drafted = turn.drafted - sum(s != FORCED for s in cand.sources)
        while len(cand.tokens) < turn.limit and not fsm.is_complete(state):
            t0 = time.perf_counter()
            spliced, spliced_states = forcer.spelled(state) if forcer else ([], [])
            if spliced:
                n = min(enterable(fsm, spliced_states), turn.limit - len(cand.tokens))
                if n == 0:
                    break
                cand.tokens += spliced[:n]
                cand.states += spliced_states[:n]
                cand.sources += [FORCED] * n
                cand.q += [None] * n
                state = spliced_states[n - 1]
                cand.time(FORCED, time.perf_counter() - t0)
                continue
            if self.drafter is None or drafted == 0:
                break
            step = self.drafter.next(turn, turn.context + cand.tokens, state)
            if isinstance(step, DraftRequest):
                return step
            drafted -= 1
            cand.time(step.source if step else self.drafter.name, time.perf_counter() - t0)
            next_state = fsm.next_state(state, step.token) if step else None
            if step is None or next_state is None or not enterable(fsm, [next_state]):
                break
            cand.append(step, next_state)
            state = next_state
        if self.drafter is not None:
            cand.draft_passes = self.drafter.passes - self._passes
        return None


def draft_chain(drafter: Drafter | None, turn: Turn) -> Candidate:
    """The chain ``drafter`` (one that never asks for draft logits: no batched draft model) drafts under
    ``turn``. Changes the drafter's per-candidate state."""
    chain = Chain(drafter, turn)
    request = chain.extend()
    assert request is None, "a drafter drafting inside a tree asks for no batched draft pass"
    return chain.candidate
