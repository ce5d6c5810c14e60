"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using Lookahead
Decoding"): the target's own verify pass runs a Jacobi iteration on guessed future tokens, and the n-grams
it produces become drafts. No draft model.

`LookaheadDrafter` drafts a token tree (`structspec.decoding.drafter.TreeDrafting`) of a main branch and
siblings, merged into a trie where they share a prefix:

1. **the main branch**: a chain continued, token by token, by the longest match of its last tokens in the
   n-gram pool (the target's most recent choice after them) or, failing that, earlier in the context
   (prompt lookup), forced text spliced in (`structspec.decoding.chain.Chain`);
2. **closing siblings**: where the main branch copies on past punctuation (``,`` `` |`` ...), ends on a copied
   token or drafts nothing, the value closed there and the forced text after it (``","`` + the next key, ``,"``
   + the next key after a number, ``}``: `Forcer.closing`): the document goes on past a value's end, the target
   closes the value there; and after each, at the root and where the main branch's forced key ends, guesses at
   the next value's start from the document (`structspec.decoding.drafters.values.value_starts`);
3. **respelling siblings**: forced and closing text spelled another way (`Forcer.respellings`) from its
   punctuation on: Qwen writes ``":"`` after one key and ``":`` + ``"`` after another, ``","`` +
   ``title`` after one value and ``",`` + ``"title`` after the next, so the learned split is right only part of
   the time (at most `RESPELL_NODES` nodes, nearest the root first);
4. **the Jacobi branch**: the guess window, up to ``window`` guesses for the tokens after the context, cut
   at the first token the FSM does not allow and refilled from there (`_Refill`): as the main branch goes
   on but from a single matched token, else with the allowed token the context used last, so the
   iteration always has guesses to start from.

After the pass the row shows the drafter the target's masked argmax at every node (`observe`, called by
`structspec.decoding.row.RowDecode.commit`). Along the Jacobi branch those choices are one Jacobi step:
each guess's successor, computed from the guesses before it. They become the next guess window, which the
next tree takes from past the tokens the row committed in between (accepted, the target's own, forced).
At every node the last tokens and the target's choice after them are an n-gram the target produced; the
pool keeps them by those tokens (the most recent ``max_pool`` keys), so guesses that were wrong where they
stood still draft once the output reaches their tokens.

Verification is the tree's (`structspec.decoding.verify.accept_tree`): greedy output is plain masked
decoding's, and the branches the target did not take cost only their share of the pass. Tree size comes
from the cost model as `structspec.decoding.drafters.tree.TreeDrafter`'s does: at most ``drafted`` drafter tokens
on the main branch and ``drafted`` nodes beyond it.

Trees are for greedy rows. A sampled row drafts the main branch as a chain (through `Drafter.next`) and
learns nothing, so it drafts what prompt lookup drafts. Rows on a model that cannot batch (`LM.batchable`,
sliding windows) draft chains too; their pool learns from the target's choice after each chain token, but
they have no Jacobi branch.

Typical use::

    structspec.generate_result(lm, Character, prompt, draft="lookahead")
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from structspec.decoding.candidate import FORCED, Candidate, Step, enterable
from structspec.decoding.chain import draft_chain
from structspec.decoding.drafter import Turn
from structspec.decoding.fastforward import Forcer
from structspec.decoding.drafters.lookup import Pool, PromptLookup, continuation
from structspec.decoding.drafters.values import value_starts

PUNCTUATION = {b",", b".", b";", b"|", b"(", b")", b"\n"}  # where a copied value likely ended, as a token's first byte
RESPELL_NODES = 8  # nodes for other spellings of forced and closing text
RECENT = 64  # context tokens a refill looks back over for a guess to start from: a scan per guessed token


@dataclass(eq=False)
class LookaheadDrafter:
    """Lookahead decoding (module doc): token trees for greedy rows, and a `Drafter` whose chain is the pool's
    n-grams, then prompt lookup's. It keeps one row's guess window and pool: one instance per row
    (``draft="lookahead"`` makes one per row).

    ``window``: Jacobi guesses per tree; ``max_ngram``: the longest run of last tokens matched, in the pool
    and in the context; ``max_tokens``, ``min_start`` and ``min_text``: as `PromptLookup`'s; ``max_pool``:
    n-grams kept.
    """

    window: int = 5
    max_ngram: int = 3
    max_tokens: int = 10
    min_start: int = 2
    min_text: int = 1
    max_pool: int = 4096
    name: str = "lookahead"
    passes: int = 0  # no draft model: the Jacobi step rides in the target's verify pass
    _pool: Pool = field(default_factory=dict)  # last tokens → the target's choice after them
    _origin: list[int] = field(default_factory=list)  # the context the guess window follows
    _guesses: list[int] = field(default_factory=list)  # the guess window: tokens for the positions after _origin
    _branch: list[int] = field(default_factory=list)  # the last candidate's Jacobi branch, as node indices
    _lookup: PromptLookup = field(init=False)  # the main branch: the pool's n-grams, then prompt lookup's

    def __post_init__(self) -> None:
        self._lookup = PromptLookup(self.max_ngram, self.max_tokens, self.name, min_start=self.min_start,
                                    min_text=self.min_text, pool=self._pool)

    def draft_tree(self, turn: Turn) -> Candidate:
        """The main branch, closing, value-start and respelling siblings and the Jacobi branch after the turn's
        context (module doc), no path longer than ``turn.limit``, at most ``turn.drafted`` drafter tokens on the
        main branch, ``turn.drafted`` nodes of closings, value starts and the Jacobi branch beyond it, and
        `RESPELL_NODES` respelling nodes.
        Every token is allowed by the FSM. Reads the FSM's caches and the guess window; changes only the
        drafter's record of this candidate."""
        fsm, forcer, context, state, limit = turn.fsm, turn.forcer, turn.context, turn.state, turn.limit
        tree = draft_chain(self, turn)
        tree.parents = tree.parent_indices()  # the chain, as a tree the Jacobi branch hangs from
        depth = min(self.window, limit)
        guesses = self._guesses_after(context)[:depth]
        states = fsm.walk(state, guesses)  # up to the first guess the FSM does not allow
        states = states[: enterable(fsm, states)]
        guesses = guesses[: len(states)]
        room = depth - len(guesses)
        refill = draft_chain(_Refill(self), replace(turn, context=context + guesses,
                                                    state=states[-1] if states else state, limit=room, drafted=room))
        spine = len(tree.tokens)
        closings = self._close(tree, turn, spine) if forcer is not None else []
        jacobi = Candidate(guesses + refill.tokens, states + refill.states, [self.name] * len(guesses) + refill.sources)
        self._branch = _graft(tree, jacobi, turn.drafted - (len(tree.tokens) - spine))
        if forcer is not None:
            self._respell(tree, turn, spine, closings)
        return tree

    def _respell(self, tree: Candidate, turn: Turn, spine: int, closings: list[tuple[int, bytes]]) -> None:
        """Siblings that spell text another way (`Forcer.respellings`): forced text from its punctuation tokens on,
        and each of ``closings`` (a closing sibling's parent and text): the target picks its own split of ``":"``
        or ``","`` key by key. At most `RESPELL_NODES` nodes, the main branch's (it ends before ``spine``) first,
        each nearest the root first. Changes ``tree``."""
        fsm, forcer, state, limit, budget = turn.fsm, turn.forcer, turn.state, turn.limit, RESPELL_NODES
        assert forcer is not None, "respellings are of forced text"
        parents, spelled = tree.parent_indices(), [fsm.vocab.token_bytes[t] or b"" for t in tree.tokens]
        sites: list[tuple[int, bytes | None]] = [  # at forced punctuation (``":"``, ``","``): where splits vary
            (p, None) for i, p in enumerate(parents)
            if tree.sources[i] == FORCED and not any(chr(b).isalnum() for b in spelled[i])]
        for p, text in sorted(sites + closings, key=lambda site: (site[0] >= spine, _depth(parents, site[0]))):
            for ids, states in forcer.respellings(tree.states[p] if p >= 0 else state, text):
                room = limit - _depth(parents, p)
                if budget <= 0 or room <= 0:
                    return
                size = len(tree.tokens)
                _graft(tree, Candidate(ids[:room], states, [self.name] + [FORCED] * (len(ids) - 1)), budget, p)
                budget -= len(tree.tokens) - size

    def _close(self, tree: Candidate, turn: Turn, spine: int) -> list[tuple[int, bytes]]:
        """Siblings that close the value the main branch copies (`Forcer.closing`: ``","`` and the next key),
        where the copy goes on past punctuation or ends, and at the root where it drafts nothing: the document
        goes on past a value's end (or holds no more of it), the target closes the value there; then guesses at
        a value's start (`_value_starts`) after each closing, at the root and where the main branch's forced key
        ends. At most ``turn.drafted`` nodes in all, nearest the root first. Changes ``tree``; returns each
        closing's parent and text."""
        fsm, forcer, context, state, limit = turn.fsm, turn.forcer, turn.context, turn.state, turn.limit
        budget = turn.drafted
        assert forcer is not None, "closings are spelled by the forcer"
        closings: list[tuple[int, bytes]] = []
        for p in range(-1, spine):
            child = p + 1
            if child < spine:
                spelled = (fsm.vocab.token_bytes[tree.tokens[child]] or b"").lstrip(b" ")  # (`` |`` too)
                if tree.sources[child] != self.name or spelled[:1] not in PUNCTUATION:
                    continue
            elif p >= 0 and tree.sources[p] != self.name:
                continue  # the branch ends on forced text: nothing copied to close
            close, states = forcer.closing(tree.states[p] if p >= 0 else state)
            if budget <= 0 or not close or (child < spine and close[0] == tree.tokens[child]):
                continue
            size = len(tree.tokens)
            sources = [self.name] + [FORCED] * (len(close) - 1)
            nodes = _graft(tree, Candidate(close[: limit - child], states, sources), budget, p)
            budget -= len(tree.tokens) - size
            closings.append((p, fsm.vocab.spell(close)))
            if len(nodes) == len(close):  # the next value's start
                opened = replace(turn, context=context + tree.tokens[: p + 1] + close, state=states[-1],
                                 limit=limit - child - len(close), drafted=budget)
                budget -= self._value_starts(tree, forcer, opened, nodes[-1])
        for p in range(-1, spine):  # at the root, and where the main branch's forced text (a key) ends
            if p < 0 or (tree.sources[p] == FORCED and (p + 1 == spine or tree.sources[p + 1] != FORCED)):
                opened = replace(turn, context=context + tree.tokens[: p + 1],
                                 state=tree.states[p] if p >= 0 else state, limit=limit - p - 1, drafted=budget)
                budget -= self._value_starts(tree, forcer, opened, p)
        return closings

    def _value_starts(self, tree: Candidate, forcer: Forcer, opened: Turn, node: int) -> int:
        """Hang guesses at how a value opened at ``node`` of ``tree`` (−1: its root) goes on, reached by
        ``opened``'s context in its state (`value_starts`: where the document goes on after the value before, and
        after the key's words), at most ``opened.limit`` deep, ``opened.drafted`` nodes. Changes ``tree``; returns
        the nodes it added."""
        size, room, budget = len(tree.tokens), opened.limit, opened.drafted
        for text in value_starts(opened.fsm.vocab.spell(opened.context)) if room > 0 else ():
            left = budget - (len(tree.tokens) - size)
            if left <= 0:
                break
            ids, states = forcer.spell_text(opened.state, text)
            _graft(tree, Candidate(ids[:room], states, [self.name] * len(ids)), left, node)
        return len(tree.tokens) - size

    def observe(self, context: list[int], candidate: Candidate, choices: list[int]) -> None:
        """Learn from the target's masked argmax at the root (``choices[0]``) and after each node ``i`` of
        ``candidate`` (``choices[1 + i]``), drafted after ``context``: each node's last tokens and the choice
        after them go into the pool, and the choices along the Jacobi branch become the guess window. Changes
        the drafter."""
        root = tuple(context[-self.max_ngram :])
        tails: list[tuple[int, ...]] = []  # each node's last max_ngram tokens
        for token, parent in zip(candidate.tokens, candidate.parent_indices()):
            tails.append(((tails[parent] if parent >= 0 else root) + (token,))[-self.max_ngram :])
        for tail, choice in zip([root, *tails], choices):
            for n in range(1, len(tail) + 1):
                self._pool.pop(tail[-n:], None)  # inserted again last: the most recent
                self._pool[tail[-n:]] = choice
        while len(self._pool) > self.max_pool:
            del self._pool[next(iter(self._pool))]  # the oldest
        branch = [i for i in self._branch if i < len(candidate.tokens)]  # a batch may cut the tree (`Window.first`)
        self._origin, self._guesses = list(context), [choices[0]] + [choices[1 + i] for i in branch]

    def begin(self) -> None:
        self._lookup.begin()
        self._branch = []

    def next(self, turn: Turn, context: list[int], state: int) -> Step | None:
        return self._lookup.next(turn, context, state)

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        pass  # fixed sizes: the cost model caps them

    def _guesses_after(self, context: list[int]) -> list[int]:
        """The guess window's tokens for the positions after ``context``: none unless the window was made after
        a prefix of it. Changes nothing."""
        start = len(self._origin)
        if len(context) < start or context[:start] != self._origin:
            return []
        return self._guesses[len(context) - start :]


@dataclass(eq=False)
class _Refill:
    """The Jacobi branch's refill as a `Drafter`: ``owner``'s continuation from a single matched token on, else
    the allowed token the context used last among its last `RECENT` (a guess for the iteration to start
    from). Changes nothing."""

    owner: LookaheadDrafter
    passes: int = 0

    @property
    def name(self) -> str:
        return self.owner.name

    def begin(self) -> None:
        pass

    def next(self, turn: Turn, context: list[int], state: int) -> Step | None:
        allows, owner = turn.allows(state), self.owner
        token = continuation(context, owner.max_ngram, 1, allows, owner._pool)
        if token is None:
            token = next((t for t in reversed(context[-RECENT:]) if allows(t)), None)
        return Step(token, self.name) if token is not None else None

    def feedback(self, drafted: dict[str, int], accepted: dict[str, int]) -> None:
        pass


def _graft(tree: Candidate, chain: Candidate, budget: int, root: int = -1) -> list[int]:
    """Hang ``chain`` (its tokens, the states they reach and who proposed them) from node ``root`` of ``tree``
    (−1: its root), sharing each node that already holds the chain's token under the same parent, with at most
    ``budget`` new nodes. Changes ``tree``; returns the chain's node indices (fewer than its tokens if the
    budget ran out)."""
    parents: list[int] = tree.parents  # type: ignore[assignment]  # a tree
    nodes: list[int] = []
    for token, state, source in zip(chain.tokens, chain.states, chain.sources):
        parent = nodes[-1] if nodes else root
        node = next((i for i, (t, p) in enumerate(zip(tree.tokens, parents)) if p == parent and t == token), None)
        if node is None:
            if budget == 0:
                break
            budget -= 1
            node = len(tree.tokens)
            tree.tokens.append(token)
            tree.states.append(state)
            tree.sources.append(source)
            tree.q.append(None)
            parents.append(parent)
        nodes.append(node)
    return nodes


def _depth(parents: list[int], node: int) -> int:
    """How many tokens deep ``node`` of a tree is (−1, the root: 0)."""
    depth = 0
    while node >= 0:
        node, depth = parents[node], depth + 1
    return depth
