"""Adapters on tiny random-weight models: transformers' generate with structspec's processor, and the engine
matcher driven by a fake engine loop, each against structspec's plain masked greedy decoding."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal

import pytest
import torch
from pydantic import BaseModel, Field
from transformers import GenerationConfig

import structspec
from structspec import Regex
from structspec.automaton import apply_token_bitmask_inplace
from structspec.errors import OptionError
from structspec.integrations.matcher import Matcher
from structspec.integrations.transformers import LogitsProcessor, StopWhenComplete
from structspec.testing import divergence_margin
from structspec.tools.tasks import extraction_prompt, load_tasks


class Box(BaseModel):
    flag: bool
    size: Literal["small", "medium", "large"]


class Person(BaseModel):
    name: str = Field(max_length=6)
    age: int = Field(ge=0, le=120)


SPECS = [
    Box,
    Person,
    Regex(r"(red|green|blue) [0-9]{2,3}"),
    {"type": "array", "items": {"enum": ["Oslo", "Lima", "Rome"]}, "maxItems": 3},
]
PROMPTS = ["Alice is 31 years old. As JSON:", "Bob", 'The status is active. {"name":"Alice","age":31}']
MAX_NEW = 40


def plain_greedy(lm, spec, prompt: str) -> list[int]:
    return structspec.generate_result(lm, spec, prompt, fast_forward="off", max_new_tokens=MAX_NEW).token_ids


def hf_generate(
    lm, processor: LogitsProcessor, prompts: list[str], generate_kwargs: dict | None = None,
    max_new_tokens: int = MAX_NEW, **config_fields
) -> list[list[int]]:
    """transformers' greedy generate with the processor and its stopping criterion (left-padded batch); each
    row's generated ids without trailing EOS or padding."""
    tokenizer = lm.tokenizer
    tokenizer.padding_side, tokenizer.pad_token = "left", tokenizer.eos_token
    batch = tokenizer(prompts, return_tensors="pt", padding=True).to(lm.device)
    eos = tokenizer.eos_token_id
    config = GenerationConfig(
        do_sample=False, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos, **config_fields
    )
    out = lm.model.generate(
        **batch, generation_config=config, logits_processor=[processor],
        stopping_criteria=[StopWhenComplete(processor)], **(generate_kwargs or {}),
    )
    rows = out[:, batch["input_ids"].shape[1] :].tolist()
    return [row[: row.index(eos)] if eos in row else row for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
@pytest.mark.parametrize("spec", SPECS, ids=["pydantic", "bounds", "regex", "array"])
def test_generate_with_the_processor_is_plain_masked_greedy(family, spec, request) -> None:
    lm = request.getfixturevalue(family)
    processor = LogitsProcessor(spec, lm)
    for prompt in PROMPTS:  # one processor over several generate calls
        assert hf_generate(lm, processor, [prompt]) == [plain_greedy(lm, spec, prompt)]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
def test_one_processor_serves_a_generate_call_whose_prompt_extends_the_last(family, request) -> None:
    lm = request.getfixturevalue(family)
    first, second = "Bob", "Bob is 45. As JSON:"  # a chat's next turn starts with the last prompt
    assert lm.encode_prompt(second)[: len(lm.encode_prompt(first))] == lm.encode_prompt(first)
    processor = LogitsProcessor(Box, lm)
    for prompt in (first, second):
        assert hf_generate(lm, processor, [prompt]) == [plain_greedy(lm, Box, prompt)]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
@pytest.mark.parametrize("drafting", ["prompt_lookup", "assistant"])
def test_drafting_calls_per_candidate_position_and_stays_plain_masked_greedy(family, drafting, request) -> None:
    lm = request.getfixturevalue(family)
    # prompt lookup calls the processor on unverified candidates; an assistant model runs it too
    kwargs = {"prompt_lookup_num_tokens": 10} if drafting == "prompt_lookup" else {}
    assistant = {"assistant_model": lm.early_exit(1).model} if drafting == "assistant" else {}
    prompt = 'Alice is 31. {"name":"Alice","age":31} Bob is 45. {"name":"Bob","age":45} Carol:'
    for spec in (Person, Box):
        processor = LogitsProcessor(spec, lm)
        out = hf_generate(lm, processor, [prompt], generate_kwargs=assistant, **kwargs)
        assert out == [plain_greedy(lm, spec, prompt)]


@pytest.mark.slow
@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
def test_a_left_padded_batch_gives_each_row_its_own_output(family, request) -> None:
    lm = request.getfixturevalue(family)
    prompts = ["Alice is 31 years old. As JSON:", "Bob", "The order has three items: a red shirt", "x"]
    for spec in (Box, Person):
        processor = LogitsProcessor(spec, lm.tokenizer)  # the tokenizer alone: masks still cover the logits
        assert hf_generate(lm, processor, prompts) == [plain_greedy(lm, spec, p) for p in prompts]


NEAR_TIE = 0.05  # as in tests/decoding/test_batch.py: another pass shape may flip a masked-logit gap this small


@pytest.mark.real_model
def test_smollm2_generate_with_the_processor_is_plain_masked_greedy(smollm2) -> None:
    """Six example tasks, one per schema: transformers' greedy generate with the processor equals structspec's
    plain masked greedy, alone, with transformers' prompt lookup, and in a left-padded batch of four."""
    tasks = load_tasks()
    six = [next(t for t in tasks if t.schema_name == name) for name in dict.fromkeys(t.schema_name for t in tasks)]
    assert len(six) == 6

    def text(task) -> str:  # the chat prompt as one string, tokenized alike by both loops
        messages = extraction_prompt(task.text, task.schema)
        return smollm2.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def same_or_near_tie(spec, prompt: str, ours: list[int], theirs: list[int]) -> None:
        margin = divergence_margin(smollm2, structspec.compile(spec, smollm2).fsm, smollm2.encode_prompt(prompt),
                                   ours, theirs)
        assert margin is None or margin < NEAR_TIE, f"diverged where the masked-logit margin is {margin:.3f}"

    budget = 120
    for task in six:
        prompt = text(task)
        ours = structspec.generate_result(smollm2, task.schema, prompt, fast_forward="off",
                                          max_new_tokens=budget).token_ids
        for kwargs in ({}, {"prompt_lookup_num_tokens": 10}):
            [theirs] = hf_generate(smollm2, LogitsProcessor(task.schema, smollm2), [prompt],
                                   max_new_tokens=budget, **kwargs)
            same_or_near_tie(task.schema, prompt, ours, theirs)
    four = [t for t in tasks if t.schema_name == six[1].schema_name][:4]
    prompts = [text(t) for t in four]
    batch = hf_generate(smollm2, LogitsProcessor(four[0].schema, smollm2), prompts, max_new_tokens=budget)
    for prompt, theirs in zip(prompts, batch):
        ours = structspec.generate_result(smollm2, four[0].schema, prompt, fast_forward="off",
                                          max_new_tokens=budget).token_ids
        same_or_near_tie(four[0].schema, prompt, ours, theirs)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
def test_every_beam_search_output_parses(family, request) -> None:
    lm = request.getfixturevalue(family)
    processor = LogitsProcessor(Box, lm)
    for ids in hf_generate(lm, processor, ["Alice is 31. As JSON:", "Bob"], num_beams=2, num_return_sequences=2):
        Box.model_validate_json(lm.vocab.decode(ids))


def test_eos_is_allowed_where_the_output_may_end_and_alone_once_it_is_complete(byte_lm) -> None:
    processor = LogitsProcessor(Regex(r"ab(c)?"), byte_lm)
    eos, width = byte_lm.vocab.eos_token_id, byte_lm.logits_width
    a, b, c = (byte_lm.vocab.single_byte_tokens[ord(x)] for x in "abc")
    prompt = [5, 6]
    # one token at a time, as transformers calls it; the FSM rejects the last row, which may only end
    calls = [([], False, False), ([a], False, False), ([a, b], True, False), ([a, b, c], True, True),
             ([c], True, True)]
    for generated, eos_allowed, only_eos in calls:
        scores = processor(torch.tensor([prompt + generated]), torch.zeros(1, width))
        allowed = torch.isfinite(scores[0]).nonzero().flatten().tolist()
        assert (eos in allowed) == eos_allowed
        assert (allowed == [eos]) == only_eos
        assert not torch.isfinite(scores[0, len(byte_lm.tokenizer) :]).any()  # ids no token owns stay masked


def lookup_draft(context: list[int], k: int = 6) -> list[int]:
    """An engine's n-gram drafter: what followed the last two tokens (else the last one) earlier in the context,
    unconstrained."""
    for n in (2, 1):
        tail = context[-n:]
        for i in range(len(context) - n):
            if context[i : i + n] == tail:
                return context[i + n : i + n + k]
    return []


def engine_greedy(
    lm, matcher: Matcher, prompt_ids: list[int], drafter: Callable[[list[int]], list[int]], counts: dict[str, int]
) -> list[int]:
    """A fake engine loop over the matcher: draft, keep the valid prefix, mask each draft position while
    accepting it, one target pass, verify greedily, roll back the rejected part, accept the target's token.
    Returns the output ids without EOS."""
    cache, fed, out = lm.new_cache(), list(prompt_ids), []  # the cache holds prompt + out[:-1]
    while not matcher.is_terminated() and not matcher.is_complete() and len(out) < MAX_NEW:
        draft = drafter(out)[: MAX_NEW - len(out) - 1]
        valid = matcher.validate_tokens(draft)
        counts["cut"] += valid < len(draft)
        draft = draft[:valid]
        bitmask = matcher.fsm.allocate_token_bitmask(len(draft) + 1)
        for i, token in enumerate(draft):
            matcher.fill_next_token_bitmask(bitmask, i)
            assert matcher.accept_tokens([token])
        matcher.fill_next_token_bitmask(bitmask, len(draft))
        logits = lm.forward(fed + draft, cache, logits_to_keep=len(draft) + 1)  # [draft + 1, width]
        apply_token_bitmask_inplace(logits, bitmask)
        choice = logits.argmax(-1).tolist()
        accepted = next((i for i, (d, c) in enumerate(zip(draft, choice)) if d != c), len(draft))
        matcher.rollback(len(draft) - accepted)
        counts["rolled_back"] += len(draft) - accepted
        counts["accepted"] += accepted
        assert matcher.accept_tokens([choice[accepted]])
        out += draft[:accepted] + [choice[accepted]]
        fed = [choice[accepted]]
        cache.crop_slots(len(prompt_ids) + len(out) - 1)
    # structspec's loop stops once the output is complete, without asking for EOS
    return out[:-1] if matcher.is_terminated() else out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
def test_the_matcher_in_a_fake_engine_loop_is_plain_masked_greedy(family, request) -> None:
    lm = request.getfixturevalue(family)
    counts = {"cut": 0, "rolled_back": 0, "accepted": 0}
    prompt = 'Alice is 31. {"name":"Alice","age":31} Bob is 45. {"name":"Bob","age":45} Carol:'
    prompt_ids = lm.encode_prompt(prompt)
    for spec in (*SPECS, Regex(r"[a-z]{3,30}")):
        expected = plain_greedy(lm, spec, prompt)
        fsm = structspec.compile(spec, lm).fsm

        def drafter(out: list[int]) -> list[int]:
            """Prompt lookup at odd lengths; else the next three expected tokens (accepted), a token the FSM
            allows after them but the target does not choose (rolled back) and one the FSM rejects (cut)."""
            head = expected[len(out) : len(out) + 4]
            if len(out) % 2 or len(head) < 4:
                return lookup_draft(prompt_ids + out)
            state = fsm.walk(fsm.initial_state, out + head[:3])[-1]
            allowed = fsm.allowed_token_ids(state)
            wrong = [int(t) for t in allowed if t not in (head[3], fsm.eos_token_id)][:1]
            rejected = next(t for t in range(fsm.logits_width) if t not in allowed)
            return head[:3] + wrong + [rejected]

        matcher = Matcher(fsm)
        assert engine_greedy(lm, matcher, prompt_ids, drafter, counts) == expected
    assert counts["cut"] and counts["rolled_back"] and counts["accepted"]


def test_accept_is_all_or_nothing_and_validate_changes_nothing(byte_lm) -> None:
    matcher = Matcher(Regex(r'\{"a":[0-9]\}'), byte_lm)
    ids = byte_lm.tokenizer.encode('{"a":7}', add_special_tokens=False)
    eos = byte_lm.vocab.eos_token_id
    assert matcher.validate_tokens(ids + [eos, ids[0]]) == len(ids) + 1
    assert matcher.validate_tokens(ids[:2] + [eos]) == 2
    assert not matcher.accept_tokens(ids[:2] + [eos])
    assert matcher.state == matcher.fsm.initial_state
    assert matcher.accept_tokens(ids) and matcher.is_complete() and not matcher.is_terminated()
    assert matcher.accept_tokens([eos]) and matcher.is_terminated()
    assert not matcher.accept_tokens([eos]) and matcher.validate_tokens([eos]) == 0
    matcher.rollback(len(ids) + 1)
    assert matcher.state == matcher.fsm.initial_state
    with pytest.raises(OptionError, match="roll back 1 tokens: 0 were accepted"):
        matcher.rollback(1)
    matcher.accept_tokens(ids[:1])
    matcher.reset()
    assert matcher.state == matcher.fsm.initial_state


def test_the_bitmask_row_is_the_fsm_mask_and_eos_alone_once_terminated(byte_lm) -> None:
    matcher = Matcher(structspec.compile(Regex(r"(yes|no)"), byte_lm))
    bitmask = matcher.fsm.allocate_token_bitmask(2)
    matcher.fill_next_token_bitmask(bitmask, 1)
    logits = torch.zeros(2, byte_lm.logits_width)
    apply_token_bitmask_inplace(logits, bitmask)
    allowed = matcher.fsm.allowed_token_ids(matcher.fsm.initial_state).tolist()
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == allowed
    assert torch.isfinite(logits[0]).all()  # an unfilled row masks nothing
    no = byte_lm.tokenizer.encode("no", add_special_tokens=False)
    assert matcher.accept_tokens(no + [byte_lm.vocab.eos_token_id])
    matcher.fill_next_token_bitmask(bitmask, 0)
    logits = torch.zeros(1, byte_lm.logits_width)
    apply_token_bitmask_inplace(logits, bitmask[:1])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [byte_lm.vocab.eos_token_id]
    with pytest.raises(OptionError, match="allocate it with matcher.fsm.allocate_token_bitmask"):
        matcher.fill_next_token_bitmask(torch.zeros(1, 3, dtype=torch.int32), 0)


@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
def test_forced_text_is_what_every_continuation_starts_with(family, request) -> None:
    lm = request.getfixturevalue(family)
    byte = lm.vocab.single_byte_tokens
    schema = {"type": "object", "properties": {"city": {"enum": ["Zürich", "Zug"]}}, "required": ["city"]}
    matcher = Matcher(schema, lm)
    assert matcher.forced_text() == '{"city":"Z'
    assert matcher.accept_tokens([byte[b] for b in b'{"city":"'])
    assert matcher.forced_text() == "Z"
    assert matcher.accept_tokens([byte[ord("Z")]]) and matcher.forced_text() == ""
    assert Matcher(Regex(r"é[ab]"), lm).forced_text() == "é"
    assert Matcher(Regex(r"[éè]x"), lm).forced_text() == ""  # ends before a character only half forced


@pytest.mark.parametrize("family", ["byte_lm", "sp_lm"])
def test_forced_tokens_are_the_single_choice_chain(family, request) -> None:
    lm = request.getfixturevalue(family)
    matcher = Matcher(Regex(r"QK[0-9]"), lm)  # in both vocabularies only one token starts with Q, and with K
    forced = matcher.forced_tokens()
    assert lm.vocab.spell(forced) == b"QK" and matcher.state == matcher.fsm.initial_state
    assert matcher.accept_tokens(forced) and matcher.forced_tokens() == []
    assert Matcher(Regex(r"(yes|no)"), lm).forced_tokens() == []


def test_a_model_without_its_tokenizer_is_refused_with_the_fix(byte_lm) -> None:
    with pytest.raises(OptionError, match="a model alone has no tokenizer"):
        LogitsProcessor(Box, byte_lm.model)
    with pytest.raises(OptionError, match="pass a structspec LM"):
        Matcher(Box)


def test_a_spec_error_is_raised_before_generation(byte_lm) -> None:
    with pytest.raises(structspec.RegexError):
        LogitsProcessor(Regex("(ab"), byte_lm)


@pytest.mark.parametrize("width", [-1, 0, 1.5, True, "504", 2**24 + 1, 2**70, 1, 499])
def test_a_logits_width_that_is_no_model_width_is_refused(byte_lm, width) -> None:
    # -1 raised IndexError, 1.5 TypeError; 0 was taken for the default and True for 1, refused later as the spec's
    small = isinstance(width, int) and not isinstance(width, bool) and 1 <= width < len(byte_lm.tokenizer)
    message = f"logits_width={width} is narrower than the tokenizer's {len(byte_lm.tokenizer)} tokens" if small \
        else "logits_width must be an int in [1, 2**24]"
    with pytest.raises(OptionError, match=rf"^{re.escape(message)}.*: pass the model's vocabulary size"):
        Matcher(Regex("ab"), byte_lm.tokenizer, logits_width=width)


def test_a_logits_width_unlike_the_compiled_ones_is_refused(byte_lm) -> None:
    compiled = structspec.compile(Regex("ab"), byte_lm)
    for given in (compiled, compiled.fsm):
        with pytest.raises(OptionError, match=f"^logits_width=600, but this FSM was compiled for logits "
                                              f"{byte_lm.logits_width} wide"):
            Matcher(given, logits_width=600)
        assert Matcher(given, logits_width=byte_lm.logits_width).fsm is compiled.fsm
    with pytest.raises(OptionError, match="^logits_width=600, but"):
        Matcher(Regex("ab"), byte_lm, logits_width=600)


def test_a_wider_logits_width_masks_the_ids_no_token_owns(byte_lm) -> None:
    size = len(byte_lm.tokenizer)
    matcher = Matcher(Regex("[ab]+"), byte_lm.tokenizer, logits_width=size + 40)
    bitmask = matcher.fsm.allocate_token_bitmask(1)
    assert bitmask.shape == (1, -(-(size + 40) // 32))
    matcher.fill_next_token_bitmask(bitmask, 0)
    logits = torch.zeros(size + 40)
    apply_token_bitmask_inplace(logits, bitmask[0])
    allowed = torch.isfinite(logits).nonzero().flatten().tolist()
    assert allowed and max(allowed) < size
    assert matcher.fsm.logits_width == size + 40 and not matcher.accept_tokens([size + 1])


@pytest.mark.parametrize(("input_ids", "scores", "message"), [
    (torch.tensor([5, 6]), torch.zeros(1, 504), r"^input_ids must be an integer tensor \[rows, tokens\].*got a "
                                                r"torch.int64 tensor of shape \(2,\): pass a LongTensor, input_ids"),
    (torch.zeros(1, 2), torch.zeros(1, 504), "^input_ids must be an integer tensor .*torch.float32"),
    ([[5, 6]], torch.zeros(1, 504), "^input_ids must be an integer tensor .*got a list"),
    (torch.tensor([[5, 6]]), torch.zeros(504), r"^scores must be a floating tensor \[rows, vocabulary\]"),
    (torch.tensor([[5, 6]]), torch.zeros(2, 504), "^scores has 2 rows and input_ids 1: pass one row of scores"),
    (torch.tensor([[5, 6]]), torch.zeros(1, 10), r"^scores are 10 wide, narrower than this processor's FSM \(500"),
])
def test_the_processor_refuses_ids_and_scores_of_other_shapes(byte_lm, input_ids, scores, message) -> None:
    # 1-D ids raised IndexError; narrower scores came back all -inf
    processor = LogitsProcessor(Regex("ab"), byte_lm.tokenizer)
    with pytest.raises(OptionError, match=message):
        processor(input_ids, scores)
    done = processor(torch.tensor([[5, 6]]), torch.zeros(1, byte_lm.logits_width))  # unchanged by the refusal
    assert torch.isfinite(done[0]).nonzero().flatten().tolist() == [byte_lm.vocab.single_byte_tokens[ord("a")]]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_processors_guarantee_in_each_dtype(dtype: torch.dtype) -> None:
    """The module's stated guarantee, on a batch-invariant model as `load` makes them: in float32 greedy generate
    with the processor is structspec's plain masked greedy output; in bfloat16 (not guaranteed identical) every
    output still walks the FSM, ending complete or at the budget."""
    from structspec.testing import tiny_lm

    lm = tiny_lm("byte_level", dtype=dtype, batch_invariant=True)
    for spec in SPECS:
        fsm = structspec.compile(spec, lm).fsm
        for prompt in PROMPTS:
            [theirs] = hf_generate(lm, LogitsProcessor(spec, lm), [prompt])
            if dtype == torch.float32:
                assert theirs == plain_greedy(lm, spec, prompt)
            state = fsm.initial_state
            for token in theirs:
                state = fsm.next_state(state, token)
                assert state is not None
            assert fsm.is_final(state) or len(theirs) == MAX_NEW
