"""The decode loop on `FakeLM` (made-up logits from a hash of the whole prefix, no model): its cache bookkeeping,
lossless drafting with every drafter, and exact pass counts, in milliseconds per decode."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
import torch
from pydantic import BaseModel, Field

import structspec
from structspec import Regex
from structspec.models.protocol import LanguageModel
from structspec.testing import FakeLM


class Person(BaseModel):
    name: Annotated[str, Field(pattern=r"[A-Z][a-z]{1,8}")]
    age: Annotated[int, Field(ge=0, le=120)]
    color: Literal["red", "green", "blue"]
    active: bool


PROMPT = 'Copy the record: {"name":"Alice","age":31,"color":"red","active":true}\nRecord: '
# Ends of every kind: the FSM completes (Person, the finite regex, the array), the model picks EOS where the
# language may go on (a few allowed tokens beside EOS at each step), or the budget runs out (the free string).
SPECS = {
    "pydantic": Person,
    "regex": Regex(r"(red|green|blue)-[0-9]{2,4}"),
    "punctuation": Regex(r"[!?]+"),
    "array": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 4},
    "free-string": {"type": "string"},
}
DRAFTERS = ["prompt_lookup", "lookahead", structspec.TreeDrafter()]
BUDGET = 40


def run(lm: FakeLM, spec: object, **options: object) -> structspec.Result:
    return structspec.generate_result(lm, spec, PROMPT, max_new_tokens=BUDGET, **options)


def test_logits_are_deterministic_and_depend_on_the_whole_prefix() -> None:
    lm = FakeLM()
    assert isinstance(lm, LanguageModel)  # as `make_drafter` asks of a draft model
    ids = lm.encode_prompt(PROMPT)
    logits = lm.forward(ids, lm.new_cache(), logits_to_keep=3)
    assert logits.shape == (3, lm.logits_width) and logits.dtype == torch.float32
    assert torch.equal(FakeLM().forward(ids, FakeLM().new_cache(), 3), logits)  # another instance, same seed
    assert not torch.equal(FakeLM(seed=1).forward(ids, FakeLM().new_cache(), 3), logits)
    first_changed = [ids[0] + 1] + ids[1:]
    assert (lm.forward(first_changed, lm.new_cache(), 3) != logits).any(dim=1).all()  # each row: the first id counts


def test_allowed_rows_keep_only_their_ids() -> None:
    lm = FakeLM()
    ids = lm.encode_prompt(PROMPT)
    full = lm.forward(ids, lm.new_cache(), logits_to_keep=2)
    some = lm.forward(ids, lm.new_cache(), logits_to_keep=2, allowed=[torch.tensor([5, 9]), None])
    assert torch.equal(some[1], full[1])
    assert torch.equal(some[0, [5, 9]], full[0, [5, 9]]) and torch.isinf(some[0]).sum() == lm.logits_width - 2


def test_a_cropped_and_refed_cache_gives_the_logits_of_a_fresh_pass() -> None:
    lm = FakeLM()
    ids = lm.encode_prompt(PROMPT)
    fresh = lm.forward(ids, lm.new_cache(), logits_to_keep=len(ids) - 9)
    rejected = [7, 8, 9]  # a draft the target turned down
    cache = lm.new_cache()
    lm.forward(ids[:5], cache)
    lm.forward(ids[5:9] + rejected, cache)
    cache.crop_slots(9)
    assert torch.equal(lm.forward(ids[9:], cache, logits_to_keep=len(ids) - 9), fresh)
    stale = lm.new_cache()  # the same passes without the crop: every later position sees the rejected draft
    lm.forward(ids[:9] + rejected, stale)
    assert (lm.forward(ids[9:], stale, logits_to_keep=len(ids) - 9) != fresh).any(dim=1).all()


@pytest.mark.parametrize("mode", ["off", "exact"])
@pytest.mark.parametrize("draft", DRAFTERS, ids=str)
def test_greedy_output_with_every_drafter_equals_plain_masked_greedy(draft: str, mode: str) -> None:
    accepted = rejected = 0
    for name, spec in SPECS.items():
        plain = run(FakeLM(), spec, draft=None, fast_forward="off")
        lm = FakeLM()
        drafted = run(lm, spec, draft=draft, fast_forward=mode)
        assert (drafted.token_ids, drafted.stop_reason) == (plain.token_ids, plain.stop_reason), name
        assert lm.passes == drafted.stats.target_forward_passes <= plain.stats.target_forward_passes, name
        assert drafted.stats.tokens_fed == lm.fed, name
        for source, d in drafted.stats.drafts.items():
            accepted += d.accepted if source != "forced" else 0
            rejected += d.drafted - d.accepted if source != "forced" else 0
    assert rejected > 0  # the table tests verification: some drafts were turned down...
    if mode == "off":
        assert accepted > 0  # ...and some kept (exact mode forces the tokens drafts would have guessed here)


@pytest.mark.parametrize("name", list(SPECS))
def test_plain_masked_decoding_takes_one_pass_per_token_the_model_chooses(name: str) -> None:
    lm = FakeLM()
    off = run(lm, SPECS[name], draft=None, fast_forward="off")
    # one last pass adds no token: it picks EOS, or it finds the budget spent (EOS there would end it as "eos");
    # a completed FSM ends without asking the model
    last = off.stop_reason != "fsm_complete"
    assert lm.passes == off.stats.target_forward_passes == len(off.token_ids) + last
    assert lm.fed == [len(lm.encode_prompt(PROMPT))] + [1] * (lm.passes - 1)  # the prompt, then each token chosen

    lm = FakeLM()
    exact = run(lm, SPECS[name], draft=None, fast_forward="exact")
    assert exact.token_ids == off.token_ids
    model = exact.sources.count("model")
    assert model + exact.sources.count("forced") == len(exact.token_ids)
    assert lm.passes == exact.stats.target_forward_passes == model + last  # forced tokens cost no pass


def test_the_table_ends_in_every_way() -> None:
    reasons = {name: run(FakeLM(), spec, draft=None).stop_reason for name, spec in SPECS.items()}
    assert set(reasons.values()) == {"fsm_complete", "eos", "max_new_tokens"}, reasons
