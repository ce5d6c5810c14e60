"""Per-token log-probabilities (streaming and generation_config are still to come)."""

from __future__ import annotations

import pytest

import structspec

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"]}


@pytest.mark.parametrize("lm_name", ["byte_lm", "sp_lm"])
def test_logprobs_equal_masked_log_softmax(lm_name: str, request: pytest.FixtureRequest) -> None:
    lm = request.getfixturevalue(lm_name)
    r = structspec.generate_result(lm, SCHEMA, "x", fast_forward="off", draft=None, output_logprobs=True,
                                   max_new_tokens=12)
    assert r.logprobs is not None and len(r.logprobs) == len(r.token_ids)
    fsm = structspec.compile(SCHEMA, lm).fsm
    prompt = lm.encode_prompt("x")
    state = fsm.initial_state
    for i, token in enumerate(r.token_ids):
        logits = lm.forward(prompt + r.token_ids[:i], lm.new_cache(), logits_to_keep=1)
        fsm.mask_logits_inplace(logits, [state])
        expected = float(logits[0].float().log_softmax(-1)[token])
        assert r.logprobs[i] == pytest.approx(expected, abs=1e-4)
        if len(fsm.allowed_token_ids(state)) == 1:
            assert r.logprobs[i] == 0.0
        state = fsm.next_state(state, token)


def test_logprobs_with_drafts_and_forcing(byte_lm: structspec.LM) -> None:
    r = structspec.generate_result(byte_lm, SCHEMA, 'name "ab"', output_logprobs=True, max_new_tokens=20)
    plain = structspec.generate_result(byte_lm, SCHEMA, 'name "ab"', max_new_tokens=20)
    assert r.token_ids == plain.token_ids and plain.logprobs is None
    assert r.logprobs is not None and len(r.logprobs) == len(r.token_ids)
    assert all(lp <= 1e-6 for lp in r.logprobs)
