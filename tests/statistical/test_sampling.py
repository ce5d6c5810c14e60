"""Sampling keeps the constrained distribution: on `FakeLM`, plain masked sampling and speculative sampling with
each kind of drafter draw complete outputs with the exact probabilities of the masked, warped model (Pearson's
chi-square test against the enumerated distribution, 600 seeded runs)."""

from __future__ import annotations

import pytest

import structspec
from structspec import Regex
from structspec.decoding.drafters.factory import SelfDraft, make_drafter
from structspec.decoding.sampling import SamplingConfig
from structspec.testing import FakeLM, chi_square_pvalue, exact_output_distribution, sample_outputs

pytestmark = pytest.mark.slow  # 10 to 35 s each on a loaded 2-core machine (600 decodes)

SPEC, PROMPT, TEMPERATURE = Regex(r"(ab|ba|a|b)c{0,2}"), "pick:", 1.5


@pytest.mark.parametrize("draft", [None, "prompt_lookup", SelfDraft(), SelfDraft(threshold=True)], ids=str)
def test_sampled_outputs_follow_the_constrained_distribution(draft: object) -> None:
    lm = FakeLM()
    fsm = structspec.compile(SPEC, lm).fsm
    exact = exact_output_distribution(lm, fsm, lm.encode_prompt(PROMPT), SamplingConfig(True, TEMPERATURE))
    assert abs(sum(exact.values()) - 1) < 1e-6 and len(exact) > 5
    counts, drafted, accepted = sample_outputs(lm, SPEC, PROMPT, make_drafter(draft, lm), 600, TEMPERATURE)
    if isinstance(draft, SelfDraft):  # drafts drawn from another model's q: some kept, some rejected
        assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, exact) > 0.001
    assert chi_square_pvalue(counts, exact_output_distribution(  # and not the distribution of another model
        FakeLM(seed=7), fsm, lm.encode_prompt(PROMPT), SamplingConfig(True, TEMPERATURE))) < 0.001
