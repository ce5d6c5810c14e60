"""What a speculative proposer in an engine keeps per request: a cursor it moves over the engine's output, and
the draft it proposed last, so the splits the model preferred are learned as in structspec's own loop.

An engine verifies the draft itself and reports only what it sampled; `RequestDraft.advance` reads the
verdict from that (the first token that differs from the draft) and hands it to `Cursor.learn` and to the
request's `DraftLength`, the rules the own loop's row applies to its verified candidates: forced text, and only
as many prompt-lookup tokens as pay on the engine's pass-cost curve (`structspec.decoding.cost`). vLLM's
proposer (`structspec.integrations.vllm_proposer`) keeps one per running request; this module imports no
engine, so tests drive it without one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from structspec.decoding import FORCED, Candidate, Cursor, DraftLength, PassCost, PromptLookup, choose_widths


@dataclass(eq=False)
class RequestDraft:
    """An engine's request as a proposer sees it: its `Cursor` over the output so far (None: no structspec
    grammar, or its output left the FSM), how long its drafts pay (``lengths``: by the engine's pass cost; None:
    as long as the drafter makes them) and its last draft, drafted after ``drafted_at`` output tokens."""

    cursor: Cursor | None
    lengths: DraftLength | None = None
    draft: Candidate = field(default_factory=Candidate)
    drafted_at: int = -1

    def advance(self, output: list[int], sampled: list[int]) -> None:
        """Move the cursor over the new ``output`` tokens, ``sampled`` this step; where the model rejected forced
        text of the last draft for another token, spell that text its way from now on. Changes the request (its
        cursor is dropped where the output leaves the FSM)."""
        cursor = self.cursor
        if cursor is None:
            return
        draft = self.draft
        if draft.tokens and len(output) - len(sampled) == self.drafted_at:  # the step verified that draft
            kept = next((i for i, (a, b) in enumerate(zip(sampled, draft.tokens)) if a != b), None)
            if kept is not None:
                cursor.learn(draft, list(range(kept)), sampled[kept])
            if self.lengths is not None:
                drafted = [s != FORCED for s in draft.sources]
                self.lengths.record(sum(drafted), sum(drafted[: len(draft.tokens) if kept is None else kept]))
        if len(output) < cursor.accepted:  # (vLLM never shortens an output; a reset keeps the state exact)
            cursor.reset()
        if not cursor.accept(output[cursor.accepted :]):
            self.cursor = None  # the output left this FSM (not the request's grammar): lookup alone

    def propose(self, output: list[int], sampled: list[int], context: list[int], room: int,
                lookup: PromptLookup | None) -> Candidate:
        """The draft of at most ``room`` tokens after ``context`` (the prompt and ``output``, of which ``sampled``
        are this step's): forced text and ``lookup``'s tokens under the FSM (`Cursor.draft`), or ``lookup``'s
        alone without a grammar to follow. Advances the request (`advance`)."""
        self.advance(output, sampled)
        if self.cursor is None:
            guess = lookup.guess(context, room) if lookup else []
            self.draft = Candidate(tokens=guess, sources=[lookup.name] * len(guess) if lookup else [])  # (no states)
            return self.draft
        drafted = self.lengths.choose(1, room) if self.lengths is not None else room  # (1: the sampled token)
        self.draft, self.drafted_at = self.cursor.draft(lookup, context, room, drafted), len(output)
        return self.draft

    def gains(self) -> list[float]:
        """The tokens a step expects to keep of this request when it feeds the sampled token and the last draft's
        first ``w − 1`` tokens, for each ``w`` (`structspec.decoding.choose_widths`' gains). Changes nothing."""
        draft = self.draft
        if self.lengths is None:  # (every token as if kept: the draft goes whole where nothing else feeds)
            return [float(w) for w in range(1, len(draft.tokens) + 2)]
        kept = self.lengths.expected_kept(draft.parent_indices(), [s != FORCED for s in draft.sources])
        return [1.0, *(1.0 + k for k in kept)]


def cut_to_cost(requests: list[RequestDraft], cost: PassCost) -> list[list[int]]:
    """The tokens of each request's last draft worth one engine step for all of them: each feeds its sampled
    token, then as many of its draft's tokens as keep the step's expected tokens per unit of its cost
    (``cost`` of the tokens fed in all, `choose_widths`) from falling, as the own loop's batch cuts its rows'
    windows. At one request that is the draft as `DraftLength` sized it; at many, forced text (kept nearly
    always) before prompt-lookup tokens, which must then be kept more often to pay. Changes each request's last
    draft to its cut."""
    widths = choose_widths([r.gains() for r in requests], cost, [1] * len(requests))
    out = []
    for request, width in zip(requests, widths):
        request.draft = request.draft.first(width - 1)
        out.append(request.draft.tokens)
    return out
