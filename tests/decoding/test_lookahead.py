"""Lookahead decoding: greedy output equals plain masked decoding, single-row and batched; every tree node is
allowed by the FSM; a Jacobi step becomes the next guess window and its n-grams become drafts the target
accepts; sampled rows draft prompt lookup's chains."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
import torch
from pydantic import BaseModel

import structspec
from structspec import Regex
from structspec.automaton.fsm import TokenFSM
from structspec.decoding import cost
from structspec.decoding.cost import FLAT_COST
from structspec.decoding.candidate import Candidate
from structspec.decoding.drafter import Turn
from structspec.decoding.drafters.factory import make_drafter
from structspec.decoding.fastforward import Forcer
from structspec.decoding.drafters.lookahead import LookaheadDrafter
from structspec.decoding.drafters.lookup import PromptLookup
from structspec.decoding.loop import decode
from structspec.decoding.row import DecodeOptions, RowInput
from structspec.decoding.sampling import SamplingConfig
from structspec.decoding.verify import accept_tree
from structspec.testing import CountingLM, restricted
from structspec.tools.benchmarks.harness import methods
from tests.numerics import logprobs_approx


class Hero(BaseModel):
    name: str
    home: str
    mount: Literal["horse", "griffin", "boat"]
    level: int


# repeated phrases to copy, enums, a list whose items repeat: the pool and prompt lookup both have work
DOC = "Mira Vale of Oakford rides a griffin. Mira Vale of Oakford is level 7. Mira Vale rides north, then north."
WAYS = {"type": "array", "items": {"enum": ["north", "south", "east"]}, "maxItems": 6}
CASES = [(Hero, DOC), (WAYS, DOC), (Regex(r"(ab|cd|ef)( (ab|cd|ef)){5}"), "Pick."),
         ({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}, DOC)]
N = 48


def plain(lm: structspec.LM, spec: object, prompt: str, **options: object) -> structspec.Result:
    return structspec.generate_result(lm, spec, prompt, max_new_tokens=N, fast_forward="off", draft=None, **options)


def lookahead(lm: structspec.LM, spec: object, prompt: str, **options: object) -> structspec.Result:
    return structspec.generate_result(lm, spec, prompt, max_new_tokens=N, draft="lookahead", **options)


def _turn(fsm: TokenFSM, forcer: Forcer | None, context: list[int], state: int, limit: int) -> Turn:
    """A greedy turn after ``context`` in ``state``, at most ``limit`` deep and 16 drafter tokens."""
    return Turn(fsm, forcer, SamplingConfig(), None, context, state, limit, 16)


@dataclass(eq=False)
class _Recording(LookaheadDrafter):
    """A lookahead drafter that keeps every tree it drafts with its root state and depth limit."""

    trees: list[tuple[TokenFSM, int, int, Candidate]] = field(default_factory=list)

    def draft_tree(self, turn: Turn) -> Candidate:
        tree = super().draft_tree(turn)
        self.trees.append((turn.fsm, turn.state, turn.limit, tree))
        return tree


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_lookahead_greedy_equals_plain_masked_decoding_and_every_node_is_allowed(
        kind: str, request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(kind)
    nodes = passes = accepted = branched = 0
    for spec, prompt in CASES:
        drafter = _Recording()
        base = plain(lm, spec, prompt)
        got = structspec.generate_result(lm, spec, prompt, max_new_tokens=N, draft=drafter)
        assert (got.token_ids, got.stop_reason) == (base.token_ids, base.stop_reason), spec
        assert got.stats.draft_passes == 0  # no draft model: the drafts ride in the target's pass
        nodes, passes = nodes + got.stats.tree_nodes, passes + got.stats.target_forward_passes
        accepted += got.stats.drafts["lookahead"].accepted
        assert len(drafter.trees) == got.stats.target_forward_passes
        for fsm, root, limit, tree in drafter.trees:
            parents = tree.parent_indices()
            depth: list[int] = []
            for i, (token, parent) in enumerate(zip(tree.tokens, parents)):
                assert -1 <= parent < i  # parents come first
                assert fsm.next_state(tree.states[parent] if parent >= 0 else root, token) == tree.states[i]
                depth.append(depth[parent] + 1 if parent >= 0 else 1)
            assert max(depth, default=0) <= limit
            siblings = list(zip(parents, tree.tokens))
            assert len(set(siblings)) == len(siblings)  # a trie: branches share their common prefix
            branched += len(set(parents)) < len(parents)  # some node has two children
    assert nodes > 2 * passes and accepted > 0  # trees, not chains, were fed, and some branch was verified
    assert branched > 0  # the Jacobi branch left the main branch somewhere


@pytest.mark.slow
def test_lookahead_logprobs_equal_plain_logprobs(byte_lm: structspec.LM) -> None:
    base = plain(byte_lm, Hero, DOC, output_logprobs=True)
    got = lookahead(byte_lm, Hero, DOC, output_logprobs=True)
    assert got.token_ids == base.token_ids
    assert got.stats.drafts["lookahead"].accepted > 0
    assert got.logprobs == logprobs_approx(base.logprobs, byte_lm.dtype)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_batched_lookahead_rows_equal_plain_and_the_row_alone(kind: str, request: pytest.FixtureRequest,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    lm = request.getfixturevalue(kind)
    monkeypatch.setattr(cost, "prior_cost", lambda lm: FLAT_COST)  # every window whole, as alone
    rows = CASES + CASES[::-1]  # mixed specs, each beside others than the first time
    base, alone = [plain(lm, *row) for row in rows], [lookahead(lm, *row) for row in rows]
    for batch_size in (1, 3):
        got = structspec.generate_batch(lm, [spec for spec, _ in rows], [prompt for _, prompt in rows],
                                        batch_size=batch_size, max_new_tokens=N, draft="lookahead")
        assert [(r.token_ids, r.stop_reason) for r in got] == [(r.token_ids, r.stop_reason) for r in base]
        # each row keeps its own window and pool: the same trees in any batch, so the same passes
        assert [r.stats.target_forward_passes for r in got] == [r.stats.target_forward_passes for r in alone]
        assert sum(r.stats.tree_nodes for r in got) > 0


def _scripted_pass(drafter: LookaheadDrafter, fsm: TokenFSM, context: list[int], target: dict[tuple[int, int], int],
                   other: int) -> tuple[Candidate, list[int], int]:
    """One verify pass of a scripted target that chooses by the last two tokens (``other`` where ``target`` has
    no entry): draft a tree after ``context``, show the drafter the choices, return (tree, path, next token)."""
    state = fsm.walk(fsm.initial_state, context)[-1]
    tree = drafter.draft_tree(_turn(fsm, None, context, state, 40 - len(context)))
    reached = [context]  # the tokens before the root, then before each node's choice
    for token, parent in zip(tree.tokens, tree.parent_indices()):
        reached.append(reached[parent + 1] + [token])
    choices = [target.get((r[-2], r[-1]), other) for r in reached]
    drafter.observe(context, tree, choices)
    path, token = accept_tree(choices, tree.tokens, tree.parent_indices())
    return tree, path, token


def test_a_jacobi_step_is_the_next_guess_window_and_its_ngrams_become_accepted_drafts(byte_lm: structspec.LM) -> None:
    fsm = structspec.compile(Regex("[a-z]{40}"), byte_lm).fsm
    p, q, r, s, t, u, v, w, x, z = (fsm.vocab.single_byte_tokens[ord(c)] for c in "pqrstuvwxz")
    context = [p, q, r, s, t, u, p, q]
    # the target: after ...p q comes r s, then v (prompt lookup copies r s t u); after s t it says w, after
    # t u x; after s v comes t, after v t comes w
    target = {(p, q): r, (q, r): s, (r, s): v, (s, t): w, (t, u): x, (s, v): t, (v, t): w, (t, w): x}
    drafter = LookaheadDrafter(window=4)

    tree, path, token = _scripted_pass(drafter, fsm, context, target, z)
    assert tree.tokens[:6] == [r, s, t, u, p, q] and tree.parents == list(range(-1, len(tree.tokens) - 1))
    assert [tree.tokens[i] for i in path] == [r, s] and token == v  # the Jacobi branch is the copy's first 4
    context += [r, s, v]
    # the Jacobi step: the choices after the branch's r s t u were s v w x; past the 3 committed tokens the
    # window guesses w x, hung from the root where the main branch has nothing
    tree, path, token = _scripted_pass(drafter, fsm, context, target, z)
    assert tree.tokens[:2] == [w, x] and tree.parents[:2] == [-1, 0]
    assert (path, token) == ([], t)
    context += [t]
    # the n-gram the first pass produced at the rejected node t (after t, w) drafts here, where prompt lookup
    # has no two-token match and would copy u; the target accepts it
    assert PromptLookup(min_text=0).next(_turn(fsm, None, context, 0, 0), context,
                                         fsm.walk(fsm.initial_state, context)[-1]) is None
    tree, path, token = _scripted_pass(drafter, fsm, context, target, z)
    assert [tree.tokens[i] for i in path] == [w] and tree.sources[path[0]] == "lookahead" and token == x


class _BigramLM:
    """A target whose logits depend only on the token they follow (a fixed random table), through both the
    single-row and the slot path; everything else delegates to ``lm``."""

    def __init__(self, lm: structspec.LM, seed: int) -> None:
        self.lm = lm
        self.table = torch.randn(lm.logits_width, lm.logits_width, generator=torch.Generator().manual_seed(seed))

    def forward(self, token_ids: list[int], cache: object, logits_to_keep: int = 1, allowed: object = None
                ) -> torch.Tensor:
        return restricted(self.table[token_ids[-logits_to_keep:]].clone(), allowed)

    def forward_slots(self, windows: list[list[int]], positions: object, attend: object, cache: object,
                      rows: list[tuple[int, int]], allowed: object = None) -> torch.Tensor:
        return restricted(self.table[[windows[b][j] for b, j in rows]].clone(), allowed)

    def __getattr__(self, name: str) -> object:
        return getattr(self.lm, name)


def test_lookahead_saves_passes_where_prompt_lookup_has_nothing_to_copy(byte_lm: structspec.LM) -> None:
    target = _BigramLM(byte_lm, seed=3)  # its output repeats no two tokens within these 40
    fsm = structspec.compile(Regex("[a-z]{80}"), byte_lm).fsm
    prompt, options = byte_lm.encode_prompt("Write letters."), DecodeOptions(40, fast_forward="off")
    base = decode(target, RowInput(0, fsm, prompt, None, None), options, FLAT_COST)
    copied = decode(target, RowInput(0, fsm, prompt, PromptLookup(), None), options, FLAT_COST)
    got = decode(target, RowInput(0, fsm, prompt, LookaheadDrafter(), None), options, FLAT_COST)
    assert got.token_ids == copied.token_ids == base.token_ids
    assert copied.stats.target_forward_passes == base.stats.target_forward_passes  # nothing copied
    assert got.stats.drafts["lookahead"].accepted > 0
    assert got.stats.target_forward_passes < base.stats.target_forward_passes
    # every pass feeds its pending tokens (the prompt, then the target's last token) and every tree node
    fed, passes = got.stats.tokens_fed, got.stats.target_forward_passes
    assert len(fed) == passes and sum(fed) == len(prompt) + passes - 1 + got.stats.tree_nodes > sum(base.stats.tokens_fed)


def test_sampled_rows_draft_prompt_lookups_chains(byte_lm: structspec.LM) -> None:
    drafter = LookaheadDrafter()
    assert make_drafter(drafter, byte_lm) is drafter
    pairs, prompt = Regex(r"(ab|cd)( (ab|cd)){15}"), "ab cd ab ab cd cd ab"  # a sample repeats pairs to copy
    got = lookahead(byte_lm, pairs, prompt, do_sample=True, seed=0)
    copied = structspec.generate_result(byte_lm, pairs, prompt, max_new_tokens=N, draft="prompt_lookup",
                                        do_sample=True, seed=0)
    assert got.stats.tree_nodes == 0
    assert got.token_ids == copied.token_ids  # a sampled row learns nothing: prompt lookup's drafts, its draws
    ours, theirs = got.stats.drafts["lookahead"], copied.stats.drafts["prompt_lookup"]
    assert (ours.drafted, ours.accepted) == (theirs.drafted, theirs.accepted) and ours.drafted > ours.accepted > 0


def test_lookahead_is_a_drafter_name_and_a_bench_row(byte_lm: structspec.LM) -> None:
    assert isinstance(make_drafter("lookahead", byte_lm), LookaheadDrafter)
    rows = methods(trees=True)
    assert rows["+ lookahead"] == {"fast_forward": "exact", "draft": "lookahead"}
    assert list(rows).index("+ lookahead") == list(rows).index("+ tree") + 1
    assert "+ lookahead" not in methods()


def _strings(lm: structspec.LM, *names: str) -> tuple[TokenFSM, Forcer]:
    """The FSM of an object of required string members ``names``, and its forcer."""
    spec = {"type": "object", "properties": {n: {"type": "string"} for n in names}, "required": list(names)}
    fsm = structspec.compile(spec, lm).fsm
    return fsm, Forcer(fsm, lm.tokenizer)


def test_lookahead_closes_the_copied_string_where_the_copy_goes_on_past_punctuation(qwen_lm: structspec.LM) -> None:
    fsm, forcer = _strings(qwen_lm, "vendor", "date")
    enc = qwen_lm.tokenizer.encode
    context = enc("Invoice from Brightline Design Studio, issued on 2024-03-14.", add_special_tokens=False) + enc(
        '{"vendor":"Brightline Design', add_special_tokens=False)
    state = fsm.walk(fsm.initial_state, context[-enc('{"vendor":"Brightline Design', add_special_tokens=False)
                                                   .__len__():])[-1]
    tree = LookaheadDrafter().draft_tree(_turn(fsm, forcer, context, state, 16))
    parents, spelled = tree.parent_indices(), [qwen_lm.vocab.decode([t]) for t in tree.tokens]
    main = [i for i in range(len(tree.tokens)) if parents[i] == i - 1 and all(p == j - 1 for j, p in
                                                                              enumerate(parents[: i + 1]))]
    assert "".join(spelled[i] for i in main).startswith(" Studio, issued")  # the copy goes on past the value
    comma = next(i for i in main if spelled[i] == ",")
    # the closed string hangs where the comma does: '","' then the forced next key, as the target writes it
    # and, spelled another way (`Forcer.respellings`), '",' then '"date' as Qwen writes some of its keys
    close = [i for i in range(len(tree.tokens)) if parents[i] == parents[comma] and i != comma]
    assert [spelled[i] for i in close] == ['","', '",']
    chains = {}
    for first in close:
        chain = chains[first] = [first]
        while "".join(spelled[i] for i in chain) != '","date":"':
            chain.append(next(i for i in range(len(tree.tokens)) if parents[i] == chain[-1]))
        assert tree.sources[first] == "lookahead" and {tree.sources[i] for i in chain[1:]} == {"forced"}
    # and after the first, the date's value as the document goes on after the vendor's (`value_starts`)
    after = next(i for i in range(len(tree.tokens)) if parents[i] == chains[close[0]][-1])
    assert spelled[after] == "issued" and tree.sources[after] == "lookahead"


def test_lookahead_drafts_the_next_value_from_where_the_document_goes_on(qwen_lm: structspec.LM) -> None:
    fsm, forcer = _strings(qwen_lm, "name", "title")
    enc = qwen_lm.tokenizer.encode
    doc = enc("Regards -- Elena Vasquez | Senior Procurement Manager | Arcadia Foods", add_special_tokens=False)

    def paths(tree) -> list[str]:
        parents = tree.parent_indices()
        leaves = set(range(len(tree.tokens))) - set(parents)
        out = []
        for leaf in leaves:
            path = [leaf]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            out.append(qwen_lm.vocab.decode([tree.tokens[i] for i in reversed(path)]))
        return out

    def tree_after(output: str):
        out = enc(output, add_special_tokens=False)
        state = fsm.walk(fsm.initial_state, out)[-1]
        return LookaheadDrafter().draft_tree(_turn(fsm, forcer, doc + out, state, 16))

    # at the root, where the title's value opens after the name copied from the document
    assert any(p.startswith("Senior Procurement") for p in paths(tree_after('{"name":"Elena Vasquez","title":"')))
    # after a closing sibling: the name closed, the forced key, then the title's start
    assert any(p.startswith(' Vasquez","title":"Senior') for p in paths(tree_after('{"name":"Elena')))


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["prompt_lookup", "lookahead"])
def test_no_choosing_pass_feeds_more_than_the_models_max_pass_tokens(byte_lm: structspec.LM, draft: str) -> None:
    """Where longer passes would not equal one-token steps bit for bit (`LM.max_pass_tokens`), chains and trees
    are cut to fit, and the output stays plain masked decoding's."""
    prompt = "copy: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog"
    spec = Regex(r"[a-z ,]{30,80}")
    plain = structspec.generate_result(byte_lm, spec, prompt, draft=None, fast_forward="off", max_new_tokens=80)
    free = structspec.generate_result(byte_lm, spec, prompt, draft=draft, max_new_tokens=80)
    capped = CountingLM(byte_lm)
    capped.max_pass_tokens = 4
    result = structspec.generate_result(capped, spec, prompt, draft=draft, max_new_tokens=80)
    assert max(free.stats.tokens_fed[1:]) > 4  # (the first pass feeds the prompt)
    assert max(result.stats.tokens_fed[1:]) <= 4
    assert result.token_ids == free.token_ids == plain.token_ids
    rows = structspec.generate_batch(capped, [spec] * 3, [prompt] * 3, batch_size=3, draft=draft, max_new_tokens=80)
    for row in rows:  # three rows share each pass of at most 4 tokens: 2 at most to one of them
        assert max(row.stats.tokens_fed) <= 4 - 2 and row.token_ids == plain.token_ids
