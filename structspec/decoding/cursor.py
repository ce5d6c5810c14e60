"""One output's constrained state over a compiled `TokenFSM`: the cursor every driver and adapter moves.

A `Cursor` holds the FSM states of an output so far (``states[i]``: the state
after its first ``i`` tokens), so `Cursor.rollback` is indexing. It answers
what an engine asks of a grammar — accept / validate / rollback / reset,
``is_terminated`` / ``is_complete``, the packed bitmask of what may come next —
and what structspec's own loop asks: the tokens the FSM forces, the forced text
in its canonical spelling with the splits the target preferred (`Forcer`), and
a candidate drafted under the FSM by a core drafter (`Cursor.draft`).

The row of the own loop (`structspec.decoding.row.RowDecode`), ``Matcher``
(compiling, for engines), the transformers ``LogitsProcessor``, the vLLM
backend's grammar and its proposer all drive this one class, so a fix or a
measurement in one holds in all; `fill_bitmasks` fills a batch's cursors, their first masks on several
threads. Calls that change the cursor: `accept`,
`rollback`, `reset`, `learn`; every other call reads (and fills the FSM's and
the forcer's caches).

Typical engine step, with a speculative draft::

    cursor = Cursor(fsm, Forcer(fsm, tokenizer))
    draft = cursor.draft(PromptLookup(), context, limit=8).tokens
    bitmask = fsm.allocate_token_bitmask(len(draft) + 1)
    for i, token in enumerate(draft):          # one mask row per draft position
        cursor.fill_bitmask(bitmask, i)
        cursor.accept([token])
    cursor.fill_bitmask(bitmask, len(draft))
    ... one target pass, apply_token_bitmask_inplace(logits, bitmask), verify ...
    cursor.rollback(len(draft) - accepted)     # drop the rejected draft tokens
    cursor.accept([bonus_token])               # EOS in a final state terminates
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from structspec.automaton.fsm import TokenFSM
from structspec.checks import as_int
from structspec.decoding.candidate import FORCED, Candidate
from structspec.decoding.chain import draft_chain
from structspec.decoding.drafter import Drafter, Turn
from structspec.decoding.fastforward import Forced, Forcer
from structspec.decoding.fill import compute_masks
from structspec.decoding.sampling import SamplingConfig
from structspec.errors import OptionError

ENDED = -1
"""The state after EOS: the output is finished (DFA states are ≥ 0)."""


class Cursor:
    """One output's position in ``fsm``, and its forced text.

    ``forcer`` spells forced text (`Forcer` with the model's tokenizer) and keeps
    the splits learned for this output; without one, the cursor's own forcer
    knows forced tokens and bytes but spells nothing. EOS is accepted in a final
    state and terminates the cursor; nothing is accepted after it.
    """

    def __init__(self, fsm: TokenFSM, forcer: Forcer | None = None) -> None:
        self.fsm = fsm
        self.forcer = forcer if forcer is not None else Forcer(fsm, None)
        self.states = [fsm.initial_state]  # states[i]: the state after the first i accepted tokens
        self._eos_row: torch.Tensor | None = None

    @property
    def state(self) -> int:
        """The current FSM state (`ENDED` once terminated). Does not change anything."""
        return self.states[-1]

    @property
    def accepted(self) -> int:
        """How many tokens were accepted since the start or the last reset (EOS included)."""
        return len(self.states) - 1

    def copy(self) -> Cursor:
        """A new cursor at the same states, sharing the FSM and the forcer (its learned splits). Changes nothing."""
        twin = Cursor(self.fsm, self.forcer)
        twin.states = list(self.states)
        return twin

    def walk(self, token_ids: list[int]) -> list[int]:
        """The states after each leading token of ``token_ids`` the FSM accepts from here; EOS in a final state
        leads to `ENDED`. Builds DFA rows; does not change the cursor."""
        if self.state == ENDED:
            return []
        states = self.fsm.walk(self.state, token_ids)
        n = len(states)
        if n < len(token_ids) and token_ids[n] in self.fsm.eos_token_ids:
            if self.fsm.is_final(states[-1] if states else self.state):
                states.append(ENDED)
        return states

    def validate(self, token_ids: list[int]) -> int:
        """How many leading tokens of ``token_ids`` the FSM accepts from here. Does not change the cursor."""
        return len(self.walk(token_ids))

    def accept(self, token_ids: list[int]) -> bool:
        """Advance over ``token_ids`` if every one is allowed, else leave the cursor unchanged and return False.
        All or nothing; changes the cursor when it returns True."""
        states = self.walk(token_ids)
        if len(states) < len(token_ids):
            return False
        self.states += states
        return True

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (EOS included). Changes the cursor; `OptionError` (the
        cursor unchanged) unless ``num_tokens`` is an int from 0 to `accepted`."""
        count, accepted = as_int(num_tokens), self.accepted
        if count is None or not 0 <= count <= accepted:
            raise OptionError(f"cannot roll back {num_tokens!r} tokens: {accepted} were accepted since the last "
                              f"reset; pass an int from 0 to {accepted}")
        if count:
            del self.states[-count:]

    def reset(self) -> None:
        """Back to the initial state, as if nothing was accepted. Changes the cursor (not its learned splits)."""
        del self.states[1:]

    def is_terminated(self) -> bool:
        """Whether EOS was accepted: the output has ended. Does not change the cursor."""
        return self.state == ENDED

    def is_complete(self) -> bool:
        """Whether EOS is the only token allowed next: the output is whole. Does not change the cursor."""
        return self.state != ENDED and self.fsm.is_complete(self.state)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write the tokens allowed next into ``bitmask[row]`` (packed int32 as `TokenFSM.allocate_token_bitmask`
        makes it; EOS alone once terminated). Changes ``bitmask`` only; `OptionError` (with the fix) for a
        bitmask or row `TokenFSM.check_token_bitmask` refuses."""
        if self.state != ENDED:
            self.fsm.fill_next_token_bitmask(bitmask, row, self.state)
            return
        if self._eos_row is None:
            self._eos_row = eos_only_row(self.fsm)
        bitmask[self.fsm.check_token_bitmask(bitmask, row)].copy_(self._eos_row)

    def forced(self) -> Forced | None:
        """The tokens the FSM forces from here (while exactly one non-EOS token is allowed) and the states after
        each, or None. Does not change the cursor (accept them to advance)."""
        return self.forcer.force(self.state) if self.state != ENDED else None

    def forced_text(self) -> str:
        """The text every continuation from here starts with ("" if none, or once terminated), ending before a
        character whose bytes are not all forced. Does not change the cursor."""
        if self.state == ENDED:
            return ""
        text, _ = self.forcer.forced_bytes(self.state)
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as error:  # the last character's bytes are not all forced
            return text[: error.start].decode("utf-8")

    def forced_spelling(self) -> tuple[list[int], list[int]]:
        """The forced text from here as tokens, in the canonical spelling with this output's learned splits
        (`Forcer.spelled`), and the states after each; empty without a tokenizer or once terminated. Fills the
        forcer's cache; does not change the cursor."""
        return self.forcer.spelled(self.state) if self.state != ENDED else ([], [])

    def turn(self, context: list[int], limit: int, drafted: int, sampling: SamplingConfig | None = None,
             generator: torch.Generator | None = None, forced: bool = True) -> Turn:
        """The `Turn` a candidate from here is drafted under: after ``context`` (prompt and output so far), at
        most ``limit`` tokens, ``drafted`` of them the drafter's; forced text spliced in unless ``forced`` is
        False (fast-forward off). Changes nothing."""
        return Turn(self.fsm, self.forcer if forced else None, sampling or SamplingConfig(), generator, context,
                    self.state, limit, drafted)

    def draft(self, drafter: Drafter | None, context: list[int], limit: int, drafted: int | None = None) -> Candidate:
        """A greedy chain from here of at most ``limit`` tokens: forced text spliced wherever the FSM forces some,
        ``drafter``'s tokens elsewhere (at most ``drafted``, default ``limit``), every one allowed by the FSM
        (`structspec.decoding.chain`). ``drafter`` must not wait on a batched draft pass. Changes the drafter's
        per-candidate state, not the cursor."""
        if self.state == ENDED:
            return Candidate()
        return draft_chain(drafter, self.turn(context, limit, limit if drafted is None else drafted))

    def learn(self, candidate: Candidate, path: list[int], token: int) -> None:
        """The target verified ``candidate`` (drafted from here), kept the nodes on ``path`` and chose ``token``
        after them: where it rejected forced text, spell that text its way for the rest of the output
        (`Forcer.learn`). Changes the forcer, not the states."""
        last = path[-1] if path else -1
        parents = candidate.parent_indices()
        rejected = next((i for i, p in enumerate(parents) if p == last and candidate.sources[i] == FORCED), None)
        if rejected is not None:  # (the token before it: the candidate's, unknown at its root)
            self.forcer.learn(candidate.tokens[rejected], token, candidate.tokens[last] if last >= 0 else None)


def fill_bitmasks(cursors: Sequence[Cursor], bitmask: torch.Tensor, rows: Sequence[int] | None = None,
                  threads: int | None = None) -> None:
    """Write each cursor's next-token mask into ``bitmask[rows[i]]`` (default: row i), as `Cursor.fill_bitmask`
    does one by one: the masks not computed yet first, on up to ``threads`` threads (`compute_masks`), then
    every row in the caller's thread. Changes ``bitmask`` only (and the FSMs' caches); `OptionError` (with the
    fix) for rows that do not pair with the cursors, and as `Cursor.fill_bitmask` does."""
    at = list(range(len(cursors))) if rows is None else list(rows)
    if len(at) != len(cursors):
        raise OptionError(f"{len(at)} rows for {len(cursors)} cursors: pass one bitmask row per cursor")
    compute_masks([(c.fsm, c.state) for c in cursors if not c.is_terminated()], threads)
    for cursor, row in zip(cursors, at):
        cursor.fill_bitmask(bitmask, row)


def eos_only_row(fsm: TokenFSM) -> torch.Tensor:
    """A packed bitmask row allowing the EOS ids alone: the mask of an output that has ended. Does not change the
    FSM."""
    words = np.zeros(-(-fsm.logits_width // 32), dtype=np.uint32)
    for eos in fsm.eos_token_ids:
        words[eos // 32] |= np.uint32(1 << (eos % 32))
    return torch.from_numpy(words.view(np.int32))
