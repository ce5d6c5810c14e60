"""Fast-forward: forced tokens cost no pass; exact mode is token-identical; canonical mode is canonical."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
import torch
from pydantic import BaseModel, Field

import structspec
from structspec import Regex, TokenBudgetExceeded
from structspec.decoding.fastforward import Forcer, noncanonical_forced
from structspec.tools.tasks import extraction_prompt, load_tasks
from structspec.testing import CountingLM


class Hero(BaseModel):
    name: Annotated[str, Field(pattern=r"[A-Z][a-z]{1,8}")]
    armor: Literal["leather", "chainmail", "plate"]
    weapon: Literal["sword", "spear", "crossbow"]
    level: Annotated[int, Field(json_schema_extra={"maxDigits": 2})]
    alive: bool


SPECS = [Hero, Regex(r"(mace|sword|spear)-[0-9]{2}"), {"type": "array", "items": {"enum": ["north", "south"]}, "maxItems": 3}]


def run(lm, spec, mode: str, prompt: object = "Output: ", **kw) -> structspec.Result:
    return structspec.generate_result(lm, spec, prompt, max_new_tokens=120, fast_forward=mode, **kw)


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


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_canonical_forces_keys_and_feeds_them_with_the_next_pass(kind: str, request) -> None:
    lm = CountingLM(request.getfixturevalue(kind))
    result = run(lm, Hero, "canonical")
    assert isinstance(result.value, Hero)
    s = result.stats
    assert s.forced_tokens > 0 and s.forced_bytes >= len('{"name":"') - 2
    # every pass decides one model token; forced tokens ride along in the next pass
    assert s.target_forward_passes == lm.passes
    assert s.target_forward_passes <= s.output_tokens - s.forced_tokens + 1
    # each token is fed once, and so is each rejected draft token (forced text the target spelled otherwise);
    # only tokens still pending when the FSM completes are never fed
    fed = sum(s.tokens_fed)
    seen = s.prompt_tokens + s.output_tokens + sum(d.drafted - d.accepted for d in s.drafts.values())
    assert fed == seen if result.stop_reason == "eos" else fed <= seen
    assert max(s.tokens_fed[1:], default=1) > 1  # forced tokens were fed together


def test_forced_text_of_keys_and_enum_completion(byte_lm) -> None:
    fsm = structspec.compile(Regex(r'\{"weapon":"(mace|sword)"\}'), byte_lm).fsm
    forcer = Forcer(fsm, byte_lm.tokenizer, "canonical")
    text, _ = forcer.forced_bytes(fsm.initial_state)
    assert text == b'{"weapon":"'
    state = fsm.walk(fsm.initial_state, byte_lm.tokenizer.encode('{"weapon":"m', add_special_tokens=False))[-1]
    assert forcer.forced_bytes(state)[0] == b'ace"}'


def test_complete_output_needs_no_final_pass(byte_lm) -> None:
    counting = CountingLM(byte_lm)
    result = run(counting, Regex(r"(alpha|beta)!!!"), "canonical")
    assert result.stop_reason == "fsm_complete"
    assert result.text.endswith("!!!")
    assert counting.passes == 1  # one pass picks a or b; the rest is forced


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_canonical_forced_tokens_match_the_tokenizer(kind: str, request) -> None:
    lm = request.getfixturevalue(kind)
    for spec in SPECS:
        for seed in (1, 2, 3):
            try:
                result = run(lm, spec, "canonical", temperature=1.3, seed=seed)
            except TokenBudgetExceeded:
                continue
            assert noncanonical_forced(lm.tokenizer, lm.vocab, result.token_ids, result.sources) == 0


class ShortestTokenLM(CountingLM):
    """Prefers the shortest allowed token, so it never spells ``","`` or ``":"`` in one token, as SmolLM2 doesn't."""

    def forward(self, token_ids: list[int], cache, logits_to_keep: int = 1) -> torch.Tensor:
        logits = super().forward(token_ids, cache, logits_to_keep)
        scores = torch.zeros(logits.shape[-1])  # columns past the vocabulary are masked anyway
        scores[: len(self.vocab.token_bytes)] = -torch.tensor([float(len(b or b"")) for b in self.vocab.token_bytes])
        return scores.expand_as(logits).clone()


@pytest.mark.parametrize("kind", ["byte_lm", "sp_lm"])
def test_canonical_keeps_the_models_spelling(kind: str, request) -> None:
    lm = ShortestTokenLM(request.getfixturevalue(kind))
    result = run(lm, Hero, "canonical")
    spelled = [lm.vocab.token_bytes[t] for t in result.token_ids]
    # every token the model chose is still there as it chose it: none was re-tokenized into its forced neighbour
    assert all(len(b) == 1 for b, source in zip(spelled, result.sources) if source == "model")
    assert result.stats.forced_tokens > 0  # keys are still forced, from the boundary after the model's "
    # canonical in the whole text, also where forced text ends a word the model began its own way (f, a, l + se)
    assert noncanonical_forced(lm.tokenizer, lm.vocab, result.token_ids, result.sources) == 0


def test_budget_error_carries_stats(byte_lm) -> None:
    with pytest.raises(TokenBudgetExceeded) as err:
        structspec.generate_result(byte_lm, Regex(r"[a-z]{40}"), "x", max_new_tokens=4)
    # four passes chose tokens; a fifth found no EOS where the budget ended
    assert err.value.stats.output_tokens == 4 and err.value.stats.target_forward_passes == 5


REAL = [t for t in load_tasks() if t.schema_name != "invoice"][1::5]


def tokens_and_sources(lm, spec, mode: str, prompt) -> tuple[list[int], list[str], structspec.Stats]:
    """Output of a run, complete or cut by the budget (SmolLM2 sometimes copies a document forever)."""
    try:
        r = run(lm, spec, mode, prompt)
        return r.token_ids, r.sources, r.stats
    except TokenBudgetExceeded as err:
        return err.token_ids, err.sources, err.stats


@pytest.mark.real_model
@pytest.mark.parametrize("task", REAL, ids=lambda t: t.id)
def test_smollm2_exact_equals_plain_and_canonical_is_canonical(smollm2, task) -> None:
    prompt = extraction_prompt(task.text, task.schema)
    off_ids, _, off_stats = tokens_and_sources(smollm2, task.schema, "off", prompt)
    exact_ids, _, exact_stats = tokens_and_sources(smollm2, task.schema, "exact", prompt)
    assert exact_ids == off_ids
    assert exact_stats.target_forward_passes <= off_stats.target_forward_passes - exact_stats.forced_tokens + 1
    ids, sources, stats = tokens_and_sources(smollm2, task.schema, "canonical", prompt)
    assert stats.forced_tokens > 0
    assert noncanonical_forced(smollm2.tokenizer, smollm2.vocab, ids, sources) == 0
