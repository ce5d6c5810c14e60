"""Fast-forward: forced tokens cost no pass of their own, and exact mode is token-identical to plain decoding."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
import torch
from pydantic import BaseModel, Field

import structspec
from structspec import OptionError, Regex
from structspec.automaton.fsm import TokenFSM
from structspec.decoding.fastforward import Forcer, Splits
from structspec.tools.tasks import extraction_prompt, load_tasks
from structspec.testing import CountingLM, restricted


class Hero(BaseModel):
    name: Annotated[str, Field(pattern=r"[A-Z][a-z]{1,8}")]
    armor: Literal["leather", "chainmail", "plate"]
    weapon: Literal["sword", "spear", "crossbow"]
    level: Annotated[int, Field(json_schema_extra={"maxDigits": 2})]
    alive: bool


SPECS = [Hero, Regex(r"(mace|sword|spear)-[0-9]{2}"), {"type": "array", "items": {"enum": ["north", "south"]}, "maxItems": 3}]


def run(lm, spec, mode: str, prompt: object = "Output: ", **kw) -> structspec.Result:
    """Fast-forward alone: no drafter (prompt lookup is on by default)."""
    return structspec.generate_result(lm, spec, prompt, max_new_tokens=120, fast_forward=mode, draft=None, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=["schema", "regex", "array"])
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_exact_is_token_identical_to_plain_masked(kind: str, spec, request) -> None:
    lm = request.getfixturevalue(kind)
    for seed in (None, 3):
        opts = {"temperature": 1.2, "seed": seed} if seed else {}
        off, exact = run(lm, spec, "off", **opts), run(lm, spec, "exact", **opts)
        assert exact.token_ids == off.token_ids
        assert_one_pass_per_model_token(exact)
        assert exact.stats.forced_tokens > 0 or spec is not Hero
        assert exact.stats.target_forward_passes <= off.stats.target_forward_passes - exact.stats.forced_tokens + 1


def assert_one_pass_per_model_token(result: structspec.Result) -> None:
    """Each pass adds one token of the target's own choice, except a last pass that ends the output."""
    s = result.stats
    accepted_drafts = sum(d.accepted for name, d in s.drafts.items() if name != "forced")
    assert s.model_tokens + s.forced_tokens + accepted_drafts == s.output_tokens
    extra = s.target_forward_passes - s.model_tokens
    assert extra == 1 if result.stop_reason == "eos" else extra in (0, 1)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_exact_splices_forced_text_into_the_next_pass(kind: str, request) -> None:
    lm = CountingLM(request.getfixturevalue(kind))
    result = run(lm, Hero, "exact")
    assert isinstance(result.value, Hero)
    s = result.stats
    assert s.forced_tokens > 0 and s.forced_bytes >= len('{"name":"') - 2
    assert s.target_forward_passes == lm.passes
    assert s.target_forward_passes <= s.output_tokens - s.forced_tokens + 1
    # each token is fed once, and so is each rejected draft token (forced text the target spelled otherwise);
    # only tokens still pending when the FSM completes are never fed
    fed = sum(s.tokens_fed)
    seen = s.prompt_tokens + s.output_tokens + sum(d.drafted - d.accepted for d in s.drafts.values())
    assert fed == seen if result.stop_reason == "eos" else fed <= seen
    assert max(s.tokens_fed[1:], default=1) > 1  # spliced forced text was fed with the pass that verified it


def test_canonical_mode_is_retired_with_a_pointer_to_exact(byte_lm) -> None:
    with pytest.raises(OptionError, match="use 'exact'"):
        run(byte_lm, Hero, "canonical")


def test_forced_text_of_keys_and_enum_completion(byte_lm) -> None:
    fsm = structspec.compile(Regex(r'\{"weapon":"(mace|sword)"\}'), byte_lm).fsm
    forcer = Forcer(fsm, byte_lm.tokenizer)
    text, _ = forcer.forced_bytes(fsm.initial_state)
    assert text == b'{"weapon":"'
    state = fsm.walk(fsm.initial_state, byte_lm.tokenizer.encode('{"weapon":"m', add_special_tokens=False))[-1]
    assert forcer.forced_bytes(state)[0] == b'ace"}'


def _object(lm: structspec.LM, **types: str) -> tuple[TokenFSM, Forcer]:
    """The FSM of a closed object whose members (all required) have ``types``, and its forcer."""
    spec = {"type": "object", "properties": {k: {"type": t} for k, t in types.items()}, "required": list(types),
            "additionalProperties": False}
    fsm = structspec.compile(spec, lm).fsm
    return fsm, Forcer(fsm, lm.tokenizer)


@pytest.mark.slow
def test_closing_spells_the_quote_with_the_forced_text_after_it_as_the_tokenizer_does(qwen_lm) -> None:
    fsm, forcer = _object(qwen_lm, a="string", b="string")
    enc = qwen_lm.tokenizer.encode
    inside = fsm.walk(fsm.initial_state, enc('{"a":"xy', add_special_tokens=False))[-1]
    close, states = forcer.closing(inside)
    assert qwen_lm.vocab.decode(close) == '","b":"' and qwen_lm.vocab.decode(close[:1]) == '","'  # one token
    assert close == enc('","b":"', add_special_tokens=False) and states == fsm.walk(inside, close)
    last = fsm.walk(fsm.initial_state, enc('{"a":"x","b":"yz', add_special_tokens=False))[-1]
    assert qwen_lm.vocab.decode(forcer.closing(last)[0]) == '"}'
    digits = structspec.compile(Regex(r"[0-9]{1,5}"), qwen_lm).fsm
    assert Forcer(digits, qwen_lm.tokenizer).closing(digits.initial_state) == ([], [])  # no value to close


def test_closing_ends_a_number_with_the_next_key_or_the_object(qwen_lm) -> None:
    fsm, forcer = _object(qwen_lm, n="integer", price="number")
    enc = qwen_lm.tokenizer.encode
    first = fsm.walk(fsm.initial_state, enc('{"n":12', add_special_tokens=False))[-1]
    close, states = forcer.closing(first)
    assert qwen_lm.vocab.decode(close) == ',"price":' and states == fsm.walk(first, close)
    last = fsm.walk(fsm.initial_state, enc('{"n":1,"price":2.5', add_special_tokens=False))[-1]
    close, states = forcer.closing(last)
    assert qwen_lm.vocab.decode(close) == "}" and fsm.is_final(states[-1])
    start = fsm.walk(fsm.initial_state, enc('{"n":', add_special_tokens=False))[-1]
    assert forcer.closing(start) == ([], [])  # no number written yet: nothing to close


def test_respellings_split_forced_text_another_way_than_the_canonical_spelling(qwen_lm) -> None:
    fsm, forcer = _object(qwen_lm, a="string", b="string")
    enc, decode = qwen_lm.tokenizer.encode, qwen_lm.vocab.decode
    after_b = fsm.walk(fsm.initial_state, enc('{"a":"x","b', add_special_tokens=False))[-1]
    assert decode(forcer.spelled(after_b)[0]) == '":"'  # one token, canonically
    (ids, states), = forcer.respellings(after_b)  # the longest other first token, then the rest
    assert [decode([t]) for t in ids] == ['":', '"'] and states == fsm.walk(after_b, ids)
    two = forcer.respellings(after_b, most=2)
    assert len(two) == 2 and two[0] == (ids, states) and decode(two[1][0][:1]) == '"'
    assert all(decode(spelling) == '":"' for spelling, _ in two)
    inside = fsm.walk(fsm.initial_state, enc('{"a":"xy', add_special_tokens=False))[-1]
    (ids, _), = forcer.respellings(inside, b'","b":"')  # a closing's text, as the lookahead tree passes it
    assert decode(ids) == '","b":"' and decode(ids[:1]) == '",'


def test_a_learned_split_is_forgotten_when_the_target_writes_the_whole_token_again(qwen_lm) -> None:
    fsm, forcer = _object(qwen_lm, a="string", b="string")
    ids = {qwen_lm.vocab.decode([t]): t for t in qwen_lm.tokenizer.encode('":"', add_special_tokens=False)
           + qwen_lm.tokenizer.encode('":', add_special_tokens=False)}
    whole, head = ids['":"'], ids['":']  # one token each in Qwen's vocabulary
    after_b = fsm.walk(fsm.initial_state, qwen_lm.tokenizer.encode('{"a":"x","b', add_special_tokens=False))[-1]
    assert forcer.spelled(after_b)[0] == [whole]
    forcer.learn(whole, head)  # the first key: the target wrote '":' + '"'
    assert forcer.spelled(after_b)[0][0] == head
    forcer.learn(head, whole)  # a later key: '":"' again, so the split is forgotten
    assert forcer.spelled(after_b)[0] == [whole]
    forcer.learn(head, ids['":"'])  # forgetting twice changes nothing
    assert forcer.spelled(after_b)[0] == [whole]


def test_a_split_learned_after_a_key_holds_there_when_another_key_unlearns_it(qwen_lm) -> None:
    fsm, forcer = _object(qwen_lm, name="string", b="string")
    enc, decode = qwen_lm.tokenizer.encode, qwen_lm.vocab.decode
    whole, head = (enc(text, add_special_tokens=False)[0] for text in ('":"', '":'))
    start = fsm.initial_state
    spelled = forcer.spelled(start)[0]
    assert [decode([t]) for t in spelled[-2:]] == ["name", '":"']  # '{"', 'name', '":"': the key's token before
    name = spelled[-2]
    forcer.learn(whole, head, before=name)  # Qwen writes the name key's '":' + '"get'
    assert [decode([t]) for t in forcer.spelled(start)[0][-2:]] == ['":', '"']
    b = enc("b", add_special_tokens=False)[0]
    forcer.learn(head, whole, before=b)  # and another key's '":"' whole
    after_b = fsm.walk(start, enc('{"name":"x","b', add_special_tokens=False))[-1]
    assert forcer.spelled(after_b)[0] == [whole]  # forgotten where nothing is learned for the token before
    assert [decode([t]) for t in forcer.spelled(start)[0][-2:]] == ['":', '"']  # kept after the name key
    assert forcer.splits.head(b, whole) is None and forcer.splits.head(name, whole) == head


def test_forcers_sharing_their_splits_spell_what_either_learned(qwen_lm) -> None:
    fsm, own = _object(qwen_lm, a="string", b="string")
    whole, head = (qwen_lm.tokenizer.encode(text, add_special_tokens=False)[0] for text in ('":"', '":'))
    after_b = fsm.walk(fsm.initial_state, qwen_lm.tokenizer.encode('{"a":"x","b', add_special_tokens=False))[-1]
    shared = Splits()
    first, second = Forcer(fsm, qwen_lm.tokenizer, shared), Forcer(fsm, qwen_lm.tokenizer, shared)
    assert second.spelled(after_b)[0] == [whole]  # (spelled, and cached, before either learns)
    first.learn(whole, head)  # one request's target wrote '":' + '"'
    assert second.spelled(after_b)[0][0] == head  # the other request spells it that way too, its cache dropped
    second.learn(head, whole)  # and the other way back
    assert first.spelled(after_b)[0] == [whole]
    own.learn(whole, head)  # a forcer with splits of its own teaches no other
    assert first.spelled(after_b)[0] == [whole] and own.spelled(after_b)[0][0] == head


def test_complete_output_needs_no_final_pass(byte_lm) -> None:
    counting = CountingLM(byte_lm)
    result = run(counting, Regex(r"(alpha|beta)!!!"), "exact")
    assert result.stop_reason == "fsm_complete"
    assert result.text.endswith("!!!")
    assert counting.passes == 1  # one pass picks a or b; the rest is forced


class ShortestTokenLM(CountingLM):
    """Prefers the shortest allowed token, so it never spells ``","`` or ``":"`` in one token, as SmolLM2 doesn't."""

    def forward(self, token_ids: list[int], cache, logits_to_keep: int = 1, allowed=None) -> torch.Tensor:
        logits = super().forward(token_ids, cache, logits_to_keep)
        scores = torch.zeros(logits.shape[-1])  # columns past the vocabulary are masked anyway
        scores[: len(self.vocab.token_bytes)] = -torch.tensor([float(len(b or b"")) for b in self.vocab.token_bytes])
        return restricted(scores.expand_as(logits).clone(), allowed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_exact_keeps_the_models_spelling_and_learns_its_splits(kind: str, request) -> None:
    lm = ShortestTokenLM(request.getfixturevalue(kind))
    off, exact = run(lm, Hero, "off"), run(lm, Hero, "exact")
    assert exact.token_ids == off.token_ids
    # every token the model chose is still there as it chose it: one byte each
    assert all(len(lm.vocab.token_bytes[t]) == 1 for t in exact.token_ids)
    forced = exact.stats.drafts["forced"]
    assert forced.accepted > 0  # once the split is learned, spliced forced text matches the model's spelling
    assert exact.stats.target_forward_passes < off.stats.target_forward_passes


def test_budget_result_carries_stats(byte_lm) -> None:
    result = structspec.generate_result(byte_lm, Regex(r"[a-z]{40}"), "x", max_new_tokens=4)
    assert result.stop_reason == "max_new_tokens" and result.value is None and len(result.token_ids) == 4
    # four passes chose tokens; a fifth found no EOS where the budget ended
    assert result.stats.output_tokens == 4 and result.stats.target_forward_passes == 5
    with pytest.raises(structspec.TokenBudgetExceeded) as err:
        structspec.generate(byte_lm, Regex(r"[a-z]{40}"), "x", max_new_tokens=4)
    assert err.value.token_ids == result.token_ids and err.value.stats.output_tokens == 4


REAL = [t for t in load_tasks() if t.schema_name != "invoice"][1::5]


@pytest.mark.real_model
@pytest.mark.parametrize("task", REAL, ids=lambda t: t.id)
def test_smollm2_exact_equals_plain(smollm2, task) -> None:
    prompt = extraction_prompt(task.text, task.schema)
    off, exact = run(smollm2, task.schema, "off", prompt), run(smollm2, task.schema, "exact", prompt)
    assert exact.token_ids == off.token_ids  # complete or cut by the budget alike (SmolLM2 may copy forever)
    assert exact.stats.forced_tokens > 0
    assert exact.stats.target_forward_passes <= off.stats.target_forward_passes - exact.stats.forced_tokens + 1


def test_a_target_that_spaces_before_a_byte_stops_getting_it_guessed_past_optional_whitespace(byte_lm) -> None:
    fsm = structspec.compile(Regex(r'\{[ \n]*"a"[ \n]*:[ \n]*"x"[ \n]*\}'), byte_lm).fsm
    forcer, ids, decode = Forcer(fsm, byte_lm.tokenizer), byte_lm.vocab.ids_by_bytes, byte_lm.vocab.decode
    brace, key = (fsm.walk(fsm.initial_state, byte_lm.tokenizer.encode(text, add_special_tokens=False))[-1]
                  for text in ("{", '{"a'))
    assert decode(forcer.spelled(brace)[0]) == '"' and decode(forcer.spelled(key)[0]) == '":'  # guessed past spaces
    forcer.learn(ids[b'"'], ids[b"\n"])  # the target wrote a newline where the draft guessed the quote
    assert forcer.spelled(brace) == ([], [])  # no guess before a quote any more: the drafter's tokens go there
    assert decode(forcer.spelled(key)[0]) == '":'  # the colon, never spaced before, is still guessed
    forcer.learn(ids[b'"'], ids[b"x"])  # a rejection that is no whitespace teaches nothing of the kind
    assert forcer.spelled(brace) == ([], []) and decode(forcer.spelled(key)[0]) == '":'
