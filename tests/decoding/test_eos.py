"""Several end tokens: an instruct model's ``<|im_end|>`` beside the tokenizer's EOS.

The byte-level tiny tokenizer has three special tokens: ``<eos>`` (0, its EOS), ``<bos>`` (1) and
``<|im_start|>`` (2). Id 2 stands in for a second end token here; the `prefers_second` fixture makes the random
model prefer it wherever it is allowed, so the output ends on it as soon as the language may end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from transformers import GenerationConfig

import structspec
from structspec import OptionError
from structspec.automaton import TokenFSM
from structspec.integrations.matcher import Matcher
from structspec.integrations.transformers import LogitsProcessor, StopWhenComplete

SECOND = 2  # <|im_start|>: a special token, so it may end the output
SPEC = structspec.Regex("[a-z]{1,6}")


@pytest.fixture
def prefers_second(byte_lm: structspec.LM) -> Iterator[structspec.LM]:
    """``byte_lm`` preferring the SECOND token wherever it is allowed; restored after the test.

    The final norm's output is pinned to SECOND's (lengthened) output-embedding row, so however the LM head
    is applied (whole, or to the allowed rows only), SECOND's logit is by far the largest.
    """
    head = byte_lm.model.get_output_embeddings().weight
    saved = head[SECOND].detach().clone()
    with torch.no_grad():
        head[SECOND] *= 10
    direction = head[SECOND].detach().clone()
    handle = byte_lm.model.model.norm.register_forward_hook(lambda module, inputs, out: direction.expand_as(out))
    yield byte_lm
    handle.remove()
    with torch.no_grad():
        head[SECOND] = saved


def _final_states(fsm: TokenFSM, letter: int) -> list[int]:
    """The initial state and the states after one to six letters (the first is not final, the rest are)."""
    states = [fsm.initial_state]
    for _ in range(6):
        states.append(fsm.next_state(states[-1], letter))
    return states


def test_every_eos_id_is_allowed_exactly_in_final_states(byte_lm: structspec.LM) -> None:
    fsm = TokenFSM.from_regex("[a-z]{1,6}", byte_lm.vocab, byte_lm.logits_width, [0, SECOND])
    assert (fsm.eos_token_id, fsm.eos_token_ids) == (0, (0, SECOND))
    letter = byte_lm.vocab.single_byte_tokens[ord("a")]
    for state in _final_states(fsm, letter):
        allowed = fsm.allowed_token_ids(state).tolist()
        assert allowed == sorted(allowed)
        assert (0 in allowed, SECOND in allowed) == (fsm.is_final(state),) * 2
        assert fsm.next_state(state, SECOND) is None and fsm.next_state(state, 0) is None
    complete = _final_states(fsm, letter)[-1]
    assert fsm.is_complete(complete) and fsm.allowed_token_ids(complete).tolist() == [0, SECOND]


def test_the_bitmask_sets_every_eos_id_in_final_states_only(byte_lm: structspec.LM) -> None:
    fsm = TokenFSM.from_regex("[a-z]{1,6}", byte_lm.vocab, byte_lm.logits_width, [SECOND, 0])
    states = _final_states(fsm, byte_lm.vocab.single_byte_tokens[ord("a")])
    bitmask = fsm.allocate_token_bitmask(len(states))
    for row, state in enumerate(states):
        fsm.fill_next_token_bitmask(bitmask, row, state)
    bit = lambda row, token: bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)  # noqa: E731
    for row, state in enumerate(states):
        assert bit(row, 0) == bit(row, SECOND) == fsm.is_final(state)
        assert not bit(row, 1)  # <bos> is special but not an end token


def test_the_eos_set_is_part_of_the_cache_key(byte_lm: structspec.LM) -> None:
    one = TokenFSM.from_regex("[a-z]{1,6}", byte_lm.vocab, byte_lm.logits_width)
    two = TokenFSM.from_regex("[a-z]{1,6}", byte_lm.vocab, byte_lm.logits_width, [0, SECOND])
    assert one.eos_token_ids == (0,) and two.eos_token_ids == (0, SECOND)
    final = one.next_state(one.initial_state, byte_lm.vocab.single_byte_tokens[ord("a")])
    assert SECOND not in one.allowed_token_ids(final) and SECOND in two.allowed_token_ids(final)
    assert TokenFSM.from_regex("[a-z]{1,6}", byte_lm.vocab, byte_lm.logits_width, SECOND).eos_token_ids == (SECOND,)


@pytest.mark.parametrize("draft", [None, "prompt_lookup"])
def test_a_second_eos_id_ends_the_output_with_eos(prefers_second: structspec.LM, draft: str | None) -> None:
    result = structspec.generate_result(prefers_second, SPEC, "word:", eos_token_id=[0, SECOND], draft=draft)
    assert result.stop_reason == "eos" and len(result.token_ids) == 1 and result.value == result.text
    assert result.text.isalpha()
    # Without it in the set, the same model cannot end early: the FSM completes the output.
    alone = structspec.generate_result(prefers_second, SPEC, "word:", draft=draft)
    assert alone.stop_reason == "fsm_complete" and len(alone.text) == 6


def test_generation_config_and_batches_take_a_list(prefers_second: structspec.LM) -> None:
    config = GenerationConfig(eos_token_id=[0, SECOND])
    single = structspec.generate_result(prefers_second, SPEC, "word:", generation_config=config)
    batch = structspec.generate_batch(prefers_second, SPEC, ["word:", "name:"], batch_size=2,
                                      generation_config=config)
    assert [r.stop_reason for r in (single, *batch)] == ["eos"] * 3
    assert batch[0].token_ids == single.token_ids


def test_sampling_ends_on_a_second_eos_id(prefers_second: structspec.LM) -> None:
    result = structspec.generate_result(prefers_second, SPEC, "word:", eos_token_id=[SECOND], do_sample=True,
                                        seed=0)
    assert result.stop_reason == "eos" and len(result.token_ids) == 1


@pytest.mark.parametrize("value", [5, [0, 5], [], [10_000]])
def test_an_end_token_that_is_text_or_absent_is_an_option_error(byte_lm: structspec.LM, value) -> None:
    with pytest.raises(OptionError, match="eos_token_id"):
        structspec.generate_result(byte_lm, SPEC, "word:", eos_token_id=value)
    with pytest.raises(OptionError, match="eos_token_id"):
        structspec.compile(SPEC, byte_lm, eos_token_id=value)


def test_the_matcher_terminates_on_any_eos_id(byte_lm: structspec.LM) -> None:
    compiled = structspec.compile(SPEC, byte_lm, eos_token_id=[0, SECOND])
    letter = byte_lm.vocab.single_byte_tokens[ord("a")]
    matcher = Matcher(compiled.fsm)
    assert not matcher.accept_tokens([SECOND])  # not final yet
    assert matcher.accept_tokens([letter, SECOND]) and matcher.is_terminated()
    bitmask = compiled.fsm.allocate_token_bitmask(1)
    matcher.fill_next_token_bitmask(bitmask, 0)  # an ended output allows the end tokens alone
    ids = [t for t in range(byte_lm.logits_width) if (int(bitmask[0, t // 32]) >> (t % 32)) & 1]
    assert ids == [0, SECOND]


def test_the_logits_processor_ends_on_a_second_eos_id(prefers_second: structspec.LM) -> None:
    lm = prefers_second
    processor = LogitsProcessor(structspec.compile(SPEC, lm, eos_token_id=[0, SECOND]), lm)
    prompt = torch.tensor([lm.encode_prompt("word:")])
    out = lm.model.generate(prompt, attention_mask=torch.ones_like(prompt), logits_processor=[processor],
                            stopping_criteria=[StopWhenComplete(processor)], do_sample=False, max_new_tokens=10,
                            eos_token_id=[0, SECOND], pad_token_id=0)
    new = out[0, prompt.shape[1] :].tolist()
    assert len(new) == 2 and new[-1] == SECOND and lm.vocab.decode(new[:1]).isalpha()
    ours = structspec.generate_result(lm, SPEC, "word:", eos_token_id=[0, SECOND], draft=None)
    assert ours.token_ids == new[:1]

