"""Token trees (SpecInfer): one target pass verifies several guesses where a single chain would guess wrong.

`TreeDrafter` drafts the chain prompt lookup would (the main branch, forced
text spliced in, `structspec.decoding.chain.Chain`) and adds siblings
along it, nearest the root first:

1. **options**: where the FSM allows only a few tokens (an enum, a Literal),
   each of them;
2. **closing a copied string**: at a word boundary of the main branch (and
   at its end), the token that closes the string there as models spell it,
   ``","`` or ``"}`` rather than ``"`` alone (`Forcer.closing`): prompt lookup
   keeps copying the document past a value's end, the target closes the string;
3. **other prompt-lookup matches**: the tokens that followed the last n-gram
   at its other places in the context.

Every sibling's branch goes on as a chain does, forced text (the next key
after a closed string) and prompt lookup, and the branches merge where they
share a token (a trie). At most ``max_nodes`` nodes go beyond the main branch,
fewer when the cost model would feed fewer drafted tokens (on a CPU a tree
costs its node count). The target's masked argmax at every node picks the
path (`structspec.decoding.verify.accept_tree`); the other branches' KV
becomes holes (`structspec.models.packed_slots`).

Trees are for greedy rows. A sampled row gets the main branch as a chain
(through `Drafter.next`): multi-draft speculative sampling that keeps the
target's distribution is not implemented. So does every row on a model that
cannot batch (`LM.batchable`), whose sliding windows need the single-row loop.

Typical use::

    structspec.generate_result(lm, Character, prompt, draft=TreeDrafter())
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from structspec.automaton.fsm import TokenFSM
from structspec.decoding.candidate import FORCED, Candidate, Step
from structspec.decoding.chain import draft_chain
from structspec.decoding.drafter import Turn
from structspec.decoding.drafters.lookup import PromptLookup, continuations

@dataclass(eq=False)
class TreeDrafter:
    """Drafts token trees for greedy rows (module doc); a `Drafter` whose chain is prompt lookup's.

    ``max_nodes``: nodes beyond the main branch; ``max_options``: the most
    siblings one node gets; ``max_ngram`` and ``max_tokens`` are `PromptLookup`'s.
    """

    max_nodes: int = 16
    max_options: int = 8
    max_ngram: int = 3
    max_tokens: int = 10
    name: str = "tree"
    passes: int = 0  # no draft model
    _lookup: PromptLookup = field(init=False)  # the main branch
    _branch: PromptLookup = field(init=False)  # a sibling's branch

    def __post_init__(self) -> None:
        self._lookup = PromptLookup(self.max_ngram, self.max_tokens, self.name)
        # a sibling's branch copies by tokens only: a text match would draft after every sibling and leave the
        # later siblings no nodes
        self._branch = PromptLookup(self.max_ngram, self.max_tokens, self.name, min_text=0)

    def begin(self) -> None:
        self._lookup.begin()

    def next(self, turn: Turn, context: list[int], state: int) -> Step | None:
        return self._lookup.next(turn, context, state)

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        pass  # fixed sizes: the cost model caps them

    def draft_tree(self, turn: Turn) -> Candidate:
        """A token tree after the turn's context, no path longer than ``turn.limit``, at most
        ``min(max_nodes, turn.drafted)`` nodes beyond the main branch. Every token is allowed by the FSM. Changes
        the drafter's per-candidate counters (`Drafter.begin`), nothing else."""
        tree = draft_chain(self, turn)
        tree.parents = list(range(-1, len(tree.tokens) - 1))
        fsm, forcer, limit = turn.fsm, turn.forcer, turn.limit
        spine, budget = len(tree.tokens), min(self.max_nodes, turn.drafted)
        for p in range(-1, spine):  # the sibling of main-branch node p + 1
            if budget <= 0:
                break
            at = tree.states[p] if p >= 0 else turn.state
            child = tree.tokens[p + 1] if p + 1 < spine else None
            if p + 2 > limit or (child is not None and tree.sources[p + 1] == FORCED) or fsm.is_complete(at):
                continue  # no room, forced text (no choice), or nothing but EOS
            prefix = turn.context + tree.tokens[: p + 1]
            close = forcer.closing(at)[0][:1] if forcer is not None else []
            for token in self._siblings(replace(turn, context=prefix, state=at), child, close)[: self.max_options]:
                if budget <= 0:
                    break
                room = min(limit - p - 2, budget - 1)
                branch = replace(turn, context=prefix + [token], state=fsm.next_state(at, token), limit=room,
                                 drafted=room)
                budget -= self._add_branch(tree, p, token, branch)
        return tree

    def _siblings(self, at: Turn, child: int | None, close: list[int]) -> list[int]:
        """Tokens worth a sibling of ``child`` after ``at``'s context in its state, best first; ``close``: the
        token that closes a string here (`Forcer.closing`), if any. Changes nothing."""
        fsm, state = at.fsm, at.state
        options = self._options(fsm, state)
        if options is not None:
            tokens = options
        else:
            boundary = child is None or not (fsm.vocab.token_bytes[child] or b"")[:1].isalnum()
            # the value may end here: at a word boundary or where the branch ends; else what followed the longest
            # matching n-gram of the context's end at each earlier place (prompt lookup takes the first)
            tokens = (close if boundary else []) + list(continuations(at.context, self.max_ngram, 1, at.allows(state)))
        return [t for t in dict.fromkeys(tokens) if t != child and fsm.spellable(fsm.next_state(state, t))]

    def _options(self, fsm: TokenFSM, state: int) -> list[int] | None:
        """The allowed tokens when they are few (EOS aside): all of them, or those no other allowed token
        extends (an option's whole word, not its first letters); None where the FSM allows more."""
        allowed = fsm.allowed_token_ids(state)
        if len(allowed) > 4 * self.max_options:
            return None
        eos = set(fsm.eos_token_ids)
        spelled = {int(t): fsm.vocab.token_bytes[int(t)] or b"" for t in allowed if int(t) not in eos}
        if len(spelled) > self.max_options:
            spelled = {t: b for t, b in spelled.items()
                       if not any(o != b and o.startswith(b) for o in spelled.values())}
        return list(spelled) if 1 < len(spelled) <= self.max_options else None

    def _add_branch(self, tree: Candidate, parent: int, token: int, branch: Turn) -> int:
        """Append ``token`` (reaching ``branch.state``) under node ``parent`` and, up to ``branch.limit`` more
        nodes, what follows it as a chain would (forced text, prompt lookup). Changes ``tree``; returns the
        nodes added."""
        after = draft_chain(self._branch, branch) if branch.limit > 0 else Candidate()
        start = len(tree.tokens)
        tree.tokens += [token] + after.tokens
        tree.states += [branch.state] + after.states
        tree.sources += [self.name] + after.sources
        tree.q += [None] * (1 + len(after.tokens))
        tree.parents += [parent] + list(range(start, start + len(after.tokens)))  # type: ignore[operator]
        for source, seconds in after.seconds.items():
            tree.time(source, seconds)
        return 1 + len(after.tokens)
