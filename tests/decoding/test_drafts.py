"""Speculative drafting under the FSM: lossless greedy, sampling keeps the distribution, rollback, drafters."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Literal

import pytest
import torch
from pydantic import BaseModel, Field

import structspec
from structspec import OptionError, Regex, SelfDraft, SpecError
from structspec.decoding.candidate import Step
from structspec.decoding.drafters.composite import Composite
from structspec.decoding.drafters import draft_model
from structspec.decoding.drafters.draft_model import ModelDrafter
from structspec.decoding.drafter import Turn
from structspec.decoding.drafters.factory import check_draft, make_drafter
from structspec.decoding.drafters.lookup import PromptLookup, copied_text
from structspec.decoding.cost import DraftLength, draft_pass_cost
from structspec.decoding.drafters.policy import THRESHOLD, Confidence
from structspec.decoding.sampling import SamplingConfig
from structspec.decoding.drafters.values import value_starts
from structspec.tools.tasks import extraction_prompt, load_tasks
from structspec.testing import (
    CountingLM, chi_square_pvalue, exact_output_distribution, restricted, sample_outputs, tiny_lm,
)
from structspec.decoding.verify import accept_tree, residual, verify_sampled
from structspec.result import DraftStats


class Order(BaseModel):
    customer: Annotated[str, Field(pattern=r"[A-Z][a-z]{1,8}")]
    city: Literal["Paris", "London", "Tokyo", "Berlin"]
    items: Annotated[int, Field(json_schema_extra={"maxDigits": 2})]
    paid: bool


SPECS = [Order, Regex(r"(red|green|blue) (small|large) [a-z]{2,6}"), {"type": "array", "items": {"enum": ["Oslo", "Lima"]}, "maxItems": 3}]
PROMPT = "Alice from Paris ordered 12 items, paid: true. Alice lives in Paris."


def run(lm, spec, draft=None, mode: str = "exact", **kw) -> tuple[list[int], structspec.Stats, list[str]]:
    """Token ids, stats and sources of a run, complete or cut by the budget."""
    r = structspec.generate_result(lm, spec, PROMPT, max_new_tokens=60, fast_forward=mode, draft=draft, **kw)
    return r.token_ids, r.stats, r.sources


@pytest.fixture(scope="module")
def other_byte_lm() -> structspec.LM:
    """A different random model with the same tokenizer: a draft that is often rejected."""
    return tiny_lm("byte_level", seed=7)


DRAFTS = ["prompt_lookup", "self", "threshold", "auto", "same_model", "other_model", "other_tokenizer"]


def resolve(draft: str, target, other, sp_lm):
    return {"same_model": target, "other_model": other, "other_tokenizer": sp_lm, "self": SelfDraft(),
            "threshold": SelfDraft(threshold=True)}.get(draft, draft)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["off", "exact"])
@pytest.mark.parametrize("draft", DRAFTS)
def test_greedy_output_equals_plain_masked_decoding(draft: str, mode: str, byte_lm, other_byte_lm, sp_lm) -> None:
    target = CountingLM(byte_lm)
    for spec in SPECS:
        plain, plain_stats, _ = run(byte_lm, spec, None, "off")
        ids, stats, sources = run(target, spec, resolve(draft, byte_lm, other_byte_lm, sp_lm), mode)
        assert ids == plain
        assert stats.target_forward_passes == target.passes
        assert stats.target_forward_passes <= plain_stats.target_forward_passes
        assert len(sources) == len(ids)
        target.passes = 0


@pytest.mark.slow
def test_sentencepiece_target_with_byte_level_drafter_is_lossless(sp_lm, byte_lm) -> None:
    for spec in SPECS:
        assert run(sp_lm, spec, byte_lm)[0] == run(sp_lm, spec, None, "off")[0]
        assert run(sp_lm, spec, "auto")[0] == run(sp_lm, spec, None, "off")[0]


@pytest.mark.slow
def test_a_draft_equal_to_the_target_is_always_accepted(byte_lm, free_drafts) -> None:
    for spec in SPECS:
        ids, stats, sources = run(byte_lm, spec, tiny_lm("byte_level"), "off")
        d = stats.drafts["draft_model"]
        assert d.drafted > 0 and d.accepted == d.drafted
        assert stats.target_forward_passes < len(ids) / 2
        assert sources.count("draft_model") == d.accepted


@pytest.mark.slow
def test_a_different_random_draft_is_often_rejected_and_rolled_back(byte_lm, other_byte_lm, free_drafts) -> None:
    ids, stats, _ = run(byte_lm, Order, other_byte_lm, "off")
    d = stats.drafts["draft_model"]
    assert d.accepted < d.drafted  # rejections happened, and output still equals plain decoding (above)
    assert d.draft_passes >= d.drafted


class _ConstantLM:
    """Logits that always prefer one token; everything else delegates to ``lm``."""

    def __init__(self, lm, favourite: int, runner_up: int) -> None:
        self.lm = lm
        self.row = torch.zeros(lm.logits_width)
        self.row[favourite], self.row[runner_up] = 10.0, 5.0

    def forward(self, token_ids: list[int], cache, logits_to_keep: int = 1, allowed=None) -> torch.Tensor:
        return restricted(self.row.repeat(logits_to_keep, 1), allowed)

    def __getattr__(self, name: str):
        return getattr(self.lm, name)


class _Always:
    """A drafter that proposes one token three times per candidate (free of model passes)."""

    name, passes = "always", 0

    def __init__(self, token: int) -> None:
        self.token, self.count = token, 0

    def begin(self) -> None:
        self.count = 0

    def next(self, turn, context, state) -> Step | None:
        self.count += 1
        return Step(self.token, self.name) if self.count <= 3 else None

    def feedback(self, drafted, accepted) -> None:
        pass


def test_every_verified_row_is_masked_including_the_bonus_row(byte_lm) -> None:
    a, b, z = (byte_lm.tokenizer.convert_tokens_to_ids(c) for c in "abz")
    lm = _ConstantLM(byte_lm, favourite=z, runner_up=a)  # unmasked, every row would pick "z"
    result = structspec.generate_result(lm, Regex("[ab]{12}"), "x", draft=_Always(a), fast_forward="off")
    assert result.text == "a" * 12
    # each pass verified three drafted tokens and took the bonus row's (masked) token
    assert result.stats.drafts["always"].accepted == 9
    assert result.sources.count("model") == result.stats.target_forward_passes == 3


@pytest.mark.slow
def test_sampling_with_point_mass_drafts_is_the_same_sample(byte_lm) -> None:
    """Prompt lookup and forced text verify by drawing y ~ p as plain sampling does: same seed, same output."""
    for seed in range(1, 7):
        plain = run(byte_lm, Order, None, "off", temperature=1.3, seed=seed)[0]
        assert run(byte_lm, Order, "prompt_lookup", "exact", temperature=1.3, seed=seed)[0] == plain


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["other_model", "threshold"])
def test_speculative_sampling_keeps_the_constrained_distribution(draft: str, byte_lm, other_byte_lm,
                                                                 free_drafts) -> None:
    spec = Regex(r"(ab|ba|a|b)c{0,2}")
    config = SamplingConfig(do_sample=True, temperature=1.5)
    fsm = structspec.compile(spec, byte_lm).fsm
    prompt_ids = byte_lm.encode_prompt("pick:")
    exact = exact_output_distribution(byte_lm, fsm, prompt_ids, config)
    assert abs(sum(exact.values()) - 1) < 1e-6 and len(exact) > 5
    drafter = make_drafter(other_byte_lm if draft == "other_model" else SelfDraft(threshold=True), byte_lm)
    counts, drafted, accepted = sample_outputs(byte_lm, spec, "pick:", drafter, 600, temperature=1.5)
    assert 0 < accepted < drafted  # drafts were sampled from q and some were rejected
    assert chi_square_pvalue(counts, exact) > 0.001


def test_greedy_verification_takes_the_target_token_at_the_first_mismatch() -> None:
    choices = torch.tensor([[0.0, 9, 0], [0, 0, 9], [9, 0, 0]]).argmax(-1).tolist()
    chain = [-1, 0]  # a chain is the tree with parents i − 1
    assert accept_tree(choices, [1, 2], chain) == ([0, 1], 0)  # all accepted, bonus row's argmax
    assert accept_tree(choices, [1, 0], chain) == ([0], 2)
    assert accept_tree(choices, [0, 2], chain) == ([], 1)


@pytest.mark.slow
def test_rejection_sampling_accepts_with_p_over_q_and_resamples_the_residual() -> None:
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.6, 0.2])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    logits = p.log().repeat(2, 1)
    gen = torch.Generator().manual_seed(0)
    n, results = 4000, Counter()
    for _ in range(n):  # draft token 1, drawn from q: accepted with probability 0.3 / 0.6
        results[verify_sampled(logits, [1], [q], SamplingConfig(do_sample=True), gen)[0]] += 1
    assert abs(results[1] / n - 0.5) < 0.03


def test_a_model_drafter_stops_only_after_a_token_it_is_unsure_of() -> None:
    per_token = Confidence()
    assert per_token.keep_going([]) and per_token.keep_going([0.9] * 40)  # no length of its own
    assert not per_token.keep_going([0.9, 0.3])  # below the 0.4 floor: stop after it
    assert THRESHOLD.keep_going([0.8]) and not THRESHOLD.keep_going([0.8, 0.6])  # cumulative 0.48 < 0.5


def test_a_draft_model_drafts_what_the_rows_draft_length_decides(byte_lm, monkeypatch) -> None:
    # one decision sets how many tokens a model drafter drafts: the row's `DraftLength`, on the acceptance so far,
    # the pass-cost curve (flat for this tiny model) and what a pass of the draft model costs; the drafter keeps
    # no length of its own (the old schedule started at 5 and grew by 2 a turn)
    asked: list[int] = []
    choose = DraftLength.choose

    def spy(self: DraftLength, fed: int, cap: int) -> int:
        asked.append(choose(self, fed, cap))
        return asked[-1]

    monkeypatch.setattr(DraftLength, "choose", spy)
    spec, prompt, draft = Regex(r"[a-z ]*"), "write:", byte_lm.early_exit(1)  # never complete: drafts run whole

    def drafted(pass_cost: float) -> tuple[list[int], list[int], structspec.Stats]:
        monkeypatch.setattr(draft_model, "draft_pass_cost", lambda draft, target: pass_cost)
        asked.clear()
        r = structspec.generate_result(byte_lm, spec, prompt, max_new_tokens=40,
                                       draft=ModelDrafter(draft, confidence=None))
        return list(asked), r.token_ids, r.stats

    plain = structspec.generate_result(byte_lm, spec, prompt, max_new_tokens=40, draft=None).token_ids
    free, free_ids, free_stats = drafted(0.0)
    share = draft_pass_cost(draft, byte_lm)
    costly, costly_ids, costly_stats = drafted(share)
    assert free_ids == costly_ids == plain
    for lengths, stats in ((free, free_stats), (costly, costly_stats)):
        d = stats.drafts.get("draft_model", DraftStats())
        assert d.drafted == sum(lengths)  # every candidate had exactly the tokens the row asked for
        assert d.draft_passes == d.drafted  # one draft pass a token: what the length counts
    assert free[0] == 40  # a free draft on a flat curve: the whole budget at once
    assert 0 < share < 1 and max(costly) < 5 and sum(costly) < sum(free)  # a costly pass: short drafts


def _turn(fsm) -> Turn:
    """A greedy turn over ``fsm`` (its start unused: the tests give each step's context and state)."""
    return Turn(fsm, None, SamplingConfig(), None, [], fsm.initial_state, 40, 40)


def test_prompt_lookup_copies_what_followed_the_last_tokens(byte_lm) -> None:
    fsm = structspec.compile(Regex(r"[A-Za-z ]{0,40}"), byte_lm).fsm
    enc = byte_lm.tokenizer.encode
    context = enc(" the city is Berlin Mitte. Answer:", add_special_tokens=False) + enc(" the city is", add_special_tokens=False)
    state = fsm.walk(fsm.initial_state, enc(" the city is", add_special_tokens=False))[-1]
    lookup = PromptLookup()
    lookup.begin()
    proposed: list[int] = []
    while step := lookup.next(_turn(fsm), context + proposed, state):
        proposed.append(step.token)
        state = fsm.next_state(state, step.token)
    assert byte_lm.vocab.decode(proposed) == " Berlin Mitte"  # "." is not in the language: lookup stops


def test_prompt_lookup_starts_a_candidate_only_from_a_match_of_min_start_tokens(byte_lm) -> None:
    fsm = structspec.compile(Regex(r"[a-z]{0,40}"), byte_lm).fsm
    a, b, c, d = (byte_lm.tokenizer.convert_tokens_to_ids(t) for t in "abcd")
    context = [a, b, c, d, c]  # the last token, c, occurred before (followed by d); the 2-gram d c did not

    def first(lookup: PromptLookup) -> int | None:
        lookup.begin()
        step = lookup.next(_turn(fsm), context, fsm.initial_state)
        return None if step is None else step.token

    assert first(PromptLookup(min_text=0)) is None  # a 1-token match starts nothing by default
    assert first(PromptLookup(min_start=1, min_text=0)) == d


@pytest.mark.slow
def test_prompt_lookup_copies_the_text_where_the_tokens_differ(qwen_lm) -> None:
    fsm = structspec.compile(Regex(r'"[A-Z0-9-]{0,20}"'), qwen_lm).fsm
    enc = qwen_lm.tokenizer.encode
    doc, out = enc("Invoice INV-2024-0381 from Brightline", add_special_tokens=False), enc('"INV', add_special_tokens=False)
    assert not set(out[1:]) & set(doc)  # the document's " INV" is another token than the output's "INV"
    state = fsm.walk(fsm.initial_state, out)[-1]

    def copy(lookup: PromptLookup) -> str:
        lookup.begin()
        proposed, at = [], state
        while step := lookup.next(_turn(fsm), doc + out + proposed, at):
            proposed.append(step.token)
            at = fsm.next_state(at, step.token)
        return qwen_lm.vocab.decode(proposed)

    assert copy(PromptLookup()) == "-2024-0381"  # " from" is not in the language: the copy stops there
    assert copy(PromptLookup(min_text=0)) == ""  # by tokens alone, nothing matches
    # the longest run of last bytes found decides: where what follows it is not allowed, no shorter run drafts
    blocked = fsm.walk(fsm.initial_state, enc('"INV-2024-0381', add_special_tokens=False))[-1]
    tail = enc('"INV-2024-0381', add_special_tokens=False)
    assert copied_text(doc + tail, qwen_lm.vocab, lambda t: fsm.next_state(blocked, t) is not None, 1) is None


def test_value_starts_read_the_document_on_after_the_value_before_and_after_the_keys_label() -> None:
    doc = b"Thanks -- Elena Vasquez | Senior Procurement Manager | Arcadia Foods Inc. | Tel: 415 555. "
    assert value_starts(doc + b'{"name":"Elena Vasquez","title":"') == [b"Senior Procurement Manager"]
    assert value_starts(doc + b'{"name":"Elena Vasquez","title":"Sen') == [b"ior Procurement Manager"]
    assert value_starts(doc + b'{"name":"Elena Vasquez","title":"Manager') == []  # the document goes on otherwise
    assert value_starts(doc + b'{"name":"Elena Vasquez","title":"Senior Procurement Manager","company":"') == [
        b"Arcadia Foods Inc"]  # the separators after it are left out
    assert value_starts(doc + b'{"name":"Nobody Here","title":"') == []  # the value before is not in the document
    assert value_starts(doc + b'{"name":"Elena Vasquez"') == []  # no value opened
    # a word the document starts with what is written: the first after the value before, then the first of all
    assert value_starts(doc + b'{"name":"Va') == [b"squez"]
    assert value_starts(doc + b'{"name":"Elena Vasquez","city":"Ar","company":"Sen') == [b"ior Procurement Manager"]
    assert value_starts(doc + b'{"name":"Elena Vasquez","city":"Ar') == [b"cadia Foods Inc"]
    assert value_starts(b"Tom Keller wrote: Thanks, Tina\n" + b'{"from":"Tom Keller","to":"T') == [
        b"hanks, Tina", b"om Keller wrote: Thanks, Tina"]
    # after the key's words, past the colon of a label; not where a list of field names names it
    fields = b"Extract these fields: carrier, tracking_number, status.\nDocument:\n"
    shipment = fields + b"Shipped with UPS. Tracking number: 1Z999AA10123456784. Current status: in transit.\n"
    assert value_starts(shipment + b'{"carrier":"') == []
    (guess,) = value_starts(shipment + b'{"carrier":"UPS","tracking_number":"')
    assert guess.startswith(b"1Z999AA10123456784. ")  # (up to a word's end: the FSM cuts it where it must)
    (guess,) = value_starts(shipment + b'{"carrier":"UPS","tracking_number":"1Z999AA10123456784","status":"')
    assert guess.startswith(b"in transit")
    assert value_starts(b"Total due: \xe2\x82\xac2,350.00 in 30 days\n" + b'{"total":') == [b"2,350.00 in 30 days"]


def test_early_exit_shares_weights_and_leaves_the_target_intact(byte_lm) -> None:
    draft = byte_lm.early_exit(layers=1)
    assert len(draft.model.model.layers) == 1 and len(byte_lm.model.model.layers) == 2
    assert draft.model.lm_head.weight.data_ptr() == byte_lm.model.lm_head.weight.data_ptr()
    ids = byte_lm.encode_prompt("hello")
    assert not torch.allclose(draft.forward(ids, draft.new_cache()), byte_lm.forward(ids, byte_lm.new_cache()))
    with pytest.raises(SpecError, match="layers"):
        byte_lm.early_exit(layers=3)


def test_make_drafter_names_and_check_draft_errors(byte_lm, sp_lm) -> None:
    assert isinstance(make_drafter("prompt_lookup", byte_lm), PromptLookup)
    # auto self-drafts only where a verify pass of several tokens costs about one step: on a GPU
    assert isinstance(make_drafter("auto", byte_lm), Composite if byte_lm.device.type == "cuda" else PromptLookup)
    assert make_drafter(SelfDraft(threshold=True), byte_lm).confidence == THRESHOLD
    assert make_drafter(SelfDraft(), byte_lm).name == "self_draft"
    assert isinstance(make_drafter(byte_lm, byte_lm), ModelDrafter)
    assert type(make_drafter(sp_lm, byte_lm)).__name__ == "CrossTokenizerDrafter"
    with pytest.raises(OptionError, match="'medusa' is not one of 'prompt_lookup', 'lookahead', 'auto'"):
        check_draft("medusa")
    with pytest.raises(OptionError, match="did you mean 'lookahead'"):
        check_draft("lookahed")
    with pytest.raises(OptionError, match="draft= got a int: pass None, one of 'prompt_lookup'"):
        check_draft(3)


@pytest.mark.parametrize("name, fix", [("tree", r"TreeDrafter\(\)"), ("self", r"SelfDraft\(\)"),
                                       ("threshold", r"SelfDraft\(threshold=True\)"), ("staged", r"Staged\(\)")])
def test_a_retired_draft_name_says_which_class_to_construct(name: str, fix: str) -> None:
    with pytest.raises(OptionError, match=f"draft={name!r} is no longer a name: pass draft=structspec.{fix}"):
        check_draft(name)
    with pytest.raises(OptionError, match="no longer a name"):
        structspec.GenerateOptions(draft=name)  # before any model loads


REAL = [t for t in load_tasks() if t.schema_name != "invoice"][2::6]


@pytest.mark.real_model
@pytest.mark.parametrize("task", REAL, ids=lambda t: t.id)
def test_smollm2_drafting_is_lossless(smollm2, task) -> None:
    prompt = extraction_prompt(task.text, task.schema)

    def ids(draft):
        return structspec.generate_result(smollm2, task.schema, prompt, max_new_tokens=120, draft=draft).token_ids

    plain = ids(None)
    for draft in ("prompt_lookup", "auto"):
        assert ids(draft) == plain


@pytest.mark.slow
def test_composite_switches_off_a_fallback_that_does_not_pay(byte_lm, other_byte_lm) -> None:
    auto = Composite(PromptLookup(), ModelDrafter(other_byte_lm), min_acceptance=0.9, warmup=4)
    assert auto.fallback_on
    auto.feedback({"draft_model": 5, "prompt_lookup": 3}, {"draft_model": 1, "prompt_lookup": 3})
    assert not auto.fallback_on
    passes = auto.passes
    ids, _, _ = run(byte_lm, Order, auto)
    assert auto.passes == passes  # the fallback drafted nothing more
    assert ids == run(byte_lm, Order, None, "off")[0]


def test_forced_text_is_respelled_the_way_the_target_prefers(byte_lm) -> None:
    from structspec.decoding.fastforward import Forcer

    fsm = structspec.compile(Regex(r'\{"weapon":"(mace|sword)"\}'), byte_lm).fsm
    forcer = Forcer(fsm, byte_lm.tokenizer)
    ids, _ = forcer.spelled(fsm.initial_state)
    first = byte_lm.vocab.token_bytes[ids[0]]
    assert len(first) > 1
    head = byte_lm.tokenizer.convert_tokens_to_ids(byte_lm.tokenizer.convert_ids_to_tokens(ids[0])[:1])
    forcer.learn(ids[0], head)
    respelled, states = forcer.spelled(fsm.initial_state)
    assert respelled[0] == head and len(respelled) > len(ids) and len(states) == len(respelled)
    assert byte_lm.vocab.spell(respelled) == byte_lm.vocab.spell(ids)
