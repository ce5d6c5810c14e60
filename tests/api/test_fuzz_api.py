"""Fuzzing the option surface and the engine API: random option dicts (with drafter classes, generation configs
and streamers), random `Matcher` call sequences, random logits widths, random shapes of the logits processor's
ids and scores, `Regex` patterns of every type, and random chat-message shapes end in a valid result or a
`StructspecError`, never another exception or a hang.

Each case has an oracle written here, apart from the code it checks: an option dict is valid exactly when
`valid_options` takes it (then a `Result`, else an error); a `Matcher` follows `Reference`, which keeps the
accepted ids and answers with Python's ``re`` on their text; a logits width, the processor's inputs and a prompt
are valid exactly when `valid_width`, `valid_processor_inputs` and `valid_prompt` say so. Runs derandomized;
each case under `test_fuzz.outcome`'s per-case time limit (a case past it fails as a hang), each test under
``pytest.mark.timeout`` in a thread (a hang inside a C call, where the case's alarm cannot land, fails too):
1,200 cases in all (`CASES`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.schema.test_fuzz import FUZZ, outcome
from transformers import GenerationConfig

import structspec
from structspec import Regex, Result, SelfDraft, Staged, TreeDrafter
from structspec.automaton import apply_token_bitmask_inplace
from structspec.checks import MAX_TEMPERATURE
from structspec.errors import OptionError, PromptError, RegexError, SpecError, StructspecError
from structspec.integrations.matcher import MAX_LOGITS_WIDTH, Matcher
from structspec.integrations.transformers import LogitsProcessor

CASES = {"options": 300, "matcher": 300, "widths": 150, "processor": 150, "regexes": 100, "prompts": 200}
"""Examples per fuzz test (the docs quote their sum)."""
# Seconds per fuzz test, all its cases: a hang where a case's alarm cannot land ends the run with every thread's
# stack. The thread method: `outcome`'s per-case alarm re-arms SIGALRM, which would cancel the signal method's.
WATCHDOG = 900

SPEC = Regex(r"[ab]{1,4}c?")  # short outputs whatever the options: every case decodes a few tokens at most
FULL = re.compile(rb"[ab]{1,4}c?")
PREFIX = re.compile(rb"([ab]{1,4}c?)?")  # the prefixes of SPEC's strings
OK_STOPS = ("eos", "fsm_complete", "max_new_tokens")

NOT_STR = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
                    st.lists(st.integers(-3, 3), max_size=2))
JUNK = st.one_of(NOT_STR, st.text(max_size=3))
VALUES: dict[str, st.SearchStrategy[Any]] = {
    "max_new_tokens": st.one_of(st.integers(1, 6), st.sampled_from([10**18, np.int64(3)]), JUNK),
    "do_sample": st.one_of(st.sampled_from([True, False, None]), JUNK),
    "temperature": st.one_of(st.floats(1e-5, 50), st.sampled_from([1, 0, -1.0, 1e-6, 5e-324, 1e308, 3.5e38,
                                                                   MAX_TEMPERATURE]), JUNK),
    "top_k": st.one_of(st.integers(1, 600), st.sampled_from([None, 2**70]), JUNK),
    "top_p": st.one_of(st.floats(1e-9, 1.0), st.sampled_from([None, 1, 0, 1.0000001]), JUNK),
    "seed": st.one_of(st.integers(-(2**63), 2**63 - 1), JUNK),
    "eos_token_id": st.one_of(st.sampled_from([None, 0, [0], (0,), np.int64(0), 5, [0, None], -1]), JUNK),
    "strict": st.one_of(st.booleans(), JUNK),
    "output_logprobs": st.one_of(st.booleans(), JUNK),
    "whitespace_pattern": st.one_of(st.just(r"[ ]?"), NOT_STR),
    "fast_forward": st.one_of(st.sampled_from(["off", "exact", "canonical"]), JUNK),
    "draft": st.one_of(st.sampled_from([None, "prompt_lookup", "tree", "lookahead", "self", "auto", "lookhead", "x",
                                        TreeDrafter, SelfDraft, Staged, structspec.LM, SelfDraft(), Staged()]), JUNK),
    "max_recursion_depth": st.one_of(st.integers(1, 5), JUNK),
    "open_objects": st.one_of(st.sampled_from([True, False, None]), JUNK),
}


def _is_int(value: Any, low: float, high: float = math.inf) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and low <= value <= high


def _is_number(value: Any, low: float, high: float = math.inf) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high)


class Recorder:
    """A streamer (transformers' ``put``/``end``) that keeps what it is given."""

    def __init__(self) -> None:
        self.put_ids: list[list[int]] = []
        self.ended = 0

    def put(self, value: torch.Tensor) -> None:
        self.put_ids.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended += 1


class PutOnly:
    def put(self, value: torch.Tensor) -> None:
        pass


# (made per case by `_made`: a recorder keeps one case's ids, and a GenerationConfig is built as drawn)
EXTRAS: dict[str, st.SearchStrategy[Any]] = {
    "streamer": st.one_of(st.sampled_from([None, Recorder, object, PutOnly]), JUNK),
    "generation_config": st.one_of(
        st.fixed_dictionaries({}, optional={"max_new_tokens": VALUES["max_new_tokens"],
                                            "num_beams": st.sampled_from([1, 2]), "do_sample": st.booleans()}),
        st.builds(lambda n: lambda: GenerationConfig(max_new_tokens=n), st.integers(1, 6)), JUNK),
}


def _made(value: Any) -> Any:
    """A drawn class or builder made into its value (a class as `draft=` stays one: that is what is tried)."""
    return value() if value in (Recorder, object, PutOnly) or getattr(value, "__name__", "") == "<lambda>" else value


def valid_options(options: dict[str, Any]) -> bool:
    """Whether every value of ``options`` is one its option takes, as the docs state it."""
    config = options.get("generation_config")
    do_sample = options.get("do_sample", config.get("do_sample") if isinstance(config, dict) else None)
    greedy = do_sample is False  # then the temperature is not read: any from 0 up
    for name, value in options.items():
        if name == "temperature":
            ok = _is_number(value, 0 if greedy else 1e-5, MAX_TEMPERATURE)
        elif name == "streamer":
            ok = value is None or callable(getattr(value, "put", None)) and callable(getattr(value, "end", None))
        elif name == "generation_config":
            ok = value is None or isinstance(value, GenerationConfig) or isinstance(value, dict) and (
                value.get("num_beams", 1) == 1 and ("max_new_tokens" in options or "max_new_tokens" not in value
                                                    or _is_int(value["max_new_tokens"], 1)))
        else:
            ok = valid_option(name, value)
        if not ok:
            return False
    return True


def valid_option(name: str, value: Any) -> bool:
    """Whether ``value`` is one ``name`` takes, as the docs state it (the temperature: when sampling)."""
    if name == "max_new_tokens":
        return _is_int(value, 1)
    if name == "temperature":
        return _is_number(value, 1e-5, MAX_TEMPERATURE)
    if name in ("top_k", "top_p", "seed") and value is None:
        return True
    if name == "top_k":
        return _is_int(value, 1)
    if name == "top_p":
        return _is_number(value, 0, 1) and value > 0
    if name == "seed":
        return _is_int(value, -(2**63), 2**63 - 1)
    if name == "eos_token_id":  # byte_lm's EOS is id 0, and ids 1 and 2 are its other special tokens
        ids = value if isinstance(value, (list, tuple)) else [value]
        return value is None or bool(ids) and all(_is_int(i, 0, 2) for i in ids)
    if name in ("do_sample", "open_objects"):
        return value is None or isinstance(value, bool)
    if name in ("strict", "output_logprobs"):
        return isinstance(value, bool)
    if name == "whitespace_pattern":
        return isinstance(value, str)
    if name == "fast_forward":
        return value in ("off", "exact") and isinstance(value, str)
    if name == "draft":
        if isinstance(value, (SelfDraft, Staged)):
            return True
        return value is None or value in ("prompt_lookup", "lookahead", "auto") and isinstance(value, str)
    return _is_int(value, 1)  # max_recursion_depth


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG, method="thread")
@settings(FUZZ, max_examples=CASES["options"])
@given(st.fixed_dictionaries({}, optional={**VALUES, **EXTRAS}))
def test_random_options_give_a_result_or_an_error(byte_lm: structspec.LM, options: dict[str, Any]) -> None:
    options = {name: _made(value) for name, value in options.items()}
    config = options.get("generation_config")
    # (a small budget unless drawn: the default 512 costs the budget's planning time, not coverage)
    budget = {} if isinstance(config, dict) and "max_new_tokens" in config else {"max_new_tokens": 6}
    found = outcome(lambda: structspec.generate_result(byte_lm, SPEC, "ab", **{**budget, **options}))
    if valid_options(options):
        assert isinstance(found, Result), (options, found)
        assert found.stop_reason in OK_STOPS and PREFIX.fullmatch(found.text.encode())
        assert found.stop_reason == "max_new_tokens" or FULL.fullmatch(found.text.encode())
        streamer = options.get("streamer")
        if isinstance(streamer, Recorder):  # the prompt's ids, then the output's, then end()
            assert sum(streamer.put_ids[1:], []) == found.token_ids and streamer.ended == 1
    else:
        assert isinstance(found, StructspecError), (options, found)


class Reference:
    """What a `Matcher` over `SPEC` must answer, kept as the list of accepted ids and read with ``re``."""

    def __init__(self, lm: structspec.LM) -> None:
        self.lm, self.ids = lm, []
        self.eos, self.width = lm.vocab.eos_token_id, lm.logits_width

    def text(self, ids: list[int]) -> bytes:
        return b"".join(self.lm.vocab.token_bytes[i] for i in ids if i != self.eos)

    def accepted(self, ids: list[int]) -> int:
        """How many leading ``ids`` may follow the accepted ones."""
        count, ended = 0, self.eos in self.ids
        for i in ids:
            text = self.text(self.ids + ids[:count])
            if ended:
                break
            if i == self.eos:
                if not FULL.fullmatch(text):
                    break
                ended = True
            elif i >= len(self.lm.vocab) or self.lm.vocab.token_bytes[i] is None:
                break
            elif not PREFIX.fullmatch(text + self.lm.vocab.token_bytes[i]):
                break
            count += 1
        return count

    def allowed(self) -> list[int]:
        """The ids a filled mask row allows: EOS alone once ended."""
        if self.eos in self.ids:
            return [self.eos]
        key = self.text(self.ids)
        if key not in _ALLOWED:  # (every id is tried: the same few texts recur across cases)
            _ALLOWED[key] = [t for t in range(self.width) if self.accepted([t]) == 1]
        return _ALLOWED[key]


_ALLOWED: dict[bytes, list[int]] = {}  # `Reference.allowed` by the accepted text: what is allowed depends on it alone


def _is_id(value: Any, width: int) -> bool:
    return _is_int(value, 0, width - 1)


TOKENS = st.sampled_from([67, 68, 69, 269, 0, 1, 2, 70, 501, -1, 504, 1.5, True, None])  # a, b, c, ac, EOS, ...
CALLS = st.one_of(
    st.tuples(st.just("accept"), st.lists(TOKENS, max_size=4)),
    st.tuples(st.just("validate"), st.lists(TOKENS, max_size=4)),
    st.tuples(st.just("rollback"), st.sampled_from([0, 1, 2, 3, 7, -1, 1.5, True])),
    st.tuples(st.just("fill"), st.sampled_from([0, 1, 2, -1, 0.0])),
    st.tuples(st.just("reset"), st.none()),
)


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG, method="thread")
@settings(FUZZ, max_examples=CASES["matcher"])
@given(st.lists(CALLS, max_size=12))
def test_random_matcher_calls_follow_the_reference(byte_lm: structspec.LM, calls: list[tuple[str, Any]]) -> None:
    matcher, ref = Matcher(structspec.compile(SPEC, byte_lm)), Reference(byte_lm)
    fsm = matcher.fsm
    bitmask = fsm.allocate_token_bitmask(2)
    for name, arg in calls:
        if name in ("accept", "validate"):
            found = outcome(lambda: getattr(matcher, f"{name}_tokens")(arg))
            if not all(_is_id(t, ref.width) for t in arg):
                assert isinstance(found, OptionError), found
                continue
            n = ref.accepted(arg)
            if name == "validate":
                assert found == n
            else:
                assert found == (n == len(arg))
                if found:
                    ref.ids += arg
        elif name == "rollback":
            found = outcome(lambda: matcher.rollback(arg))
            if _is_int(arg, 0, len(ref.ids)):
                assert found is None
                ref.ids = ref.ids[: len(ref.ids) - arg]
            else:
                assert isinstance(found, OptionError), found
        elif name == "fill":
            found = outcome(lambda: matcher.fill_next_token_bitmask(bitmask, arg))
            if _is_int(arg, 0, 1):
                logits = torch.zeros(byte_lm.logits_width)
                apply_token_bitmask_inplace(logits, bitmask[arg])
                assert torch.isfinite(logits).nonzero().flatten().tolist() == ref.allowed()
            else:
                assert isinstance(found, OptionError), found
        else:
            matcher.reset()
            ref.ids = []
        # the state is the FSM's walk over the accepted ids from the initial state
        ended = ref.eos in ref.ids
        assert matcher.is_terminated() == ended
        if not ended:
            walked = fsm.walk(fsm.initial_state, ref.ids)
            assert len(walked) == len(ref.ids) and matcher.state == (walked[-1] if walked else fsm.initial_state)
            assert matcher.is_complete() == (ref.allowed() == [ref.eos])


WIDTHS = st.one_of(st.none(), st.integers(-3, 600), st.sampled_from([MAX_LOGITS_WIDTH + 1, 2**70]),
                   st.sampled_from([True, False, 500.0, 1.5, np.int64(504), np.int32(520), "504"]), JUNK)


def valid_width(width: Any, least: int, exactly: int | None = None) -> bool:
    """A logits width: None, or an int (not a bool) from the tokenizer's size ``least`` to `MAX_LOGITS_WIDTH`;
    ``exactly`` that where the FSM is compiled already."""
    if width is None:
        return True
    if exactly is not None:
        return _is_int(width, exactly, exactly)
    return _is_int(width, least, MAX_LOGITS_WIDTH)


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG, method="thread")
@settings(FUZZ, max_examples=CASES["widths"])
@given(WIDTHS, st.booleans())
def test_random_logits_widths_are_taken_or_refused(byte_lm: structspec.LM, width: Any, compiled: bool) -> None:
    size = len(byte_lm.tokenizer)
    source = (structspec.compile(SPEC, byte_lm),) if compiled else (SPEC, byte_lm.tokenizer)
    found = outcome(lambda: Matcher(*source, logits_width=width))
    if not valid_width(width, size, byte_lm.logits_width if compiled else None):
        assert isinstance(found, OptionError) and "logits_width" in str(found), (width, found)
        return
    assert isinstance(found, Matcher), (width, found)
    taken = byte_lm.logits_width if compiled else size if width is None else int(width)
    assert found.fsm.logits_width == taken
    bitmask = found.fsm.allocate_token_bitmask(1)
    found.fill_next_token_bitmask(bitmask, 0)
    logits = torch.zeros(taken)
    apply_token_bitmask_inplace(logits, bitmask[0])
    allowed = torch.isfinite(logits).nonzero().flatten().tolist()
    assert allowed == Reference(byte_lm).allowed() and max(allowed) < size  # ids no token owns stay masked
    assert isinstance(outcome(lambda: found.accept_tokens([taken])), OptionError)


ID_SHAPES = st.sampled_from([(2,), (1, 2), (2, 2), (3, 1), (1, 1, 2), ()])
SCORE_WIDTHS = st.sampled_from([10, 499, 500, 504, 540])
DTYPES = st.sampled_from([torch.long, torch.int32, torch.float32, torch.bool, torch.bfloat16])


def valid_processor_inputs(ids: torch.Tensor, scores: torch.Tensor, width: int) -> bool:
    """Integer ids [rows, tokens], floating scores [rows, at least ``width``] (the processor's FSM's)."""
    integer = not (ids.dtype.is_floating_point or ids.dtype == torch.bool)
    return (integer and ids.dim() == 2 and scores.dtype.is_floating_point and scores.dim() == 2
            and scores.shape[0] == ids.shape[0] and scores.shape[1] >= width)


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG, method="thread")
@settings(FUZZ, max_examples=CASES["processor"])
@given(ID_SHAPES, DTYPES, st.integers(0, 3), SCORE_WIDTHS, DTYPES, st.booleans())
def test_random_processor_inputs_are_masked_or_refused(byte_lm: structspec.LM, id_shape: tuple[int, ...],
                                                       id_dtype: torch.dtype, score_rows: int, score_width: int,
                                                       score_dtype: torch.dtype, two_dims: bool) -> None:
    # a fresh processor per case: its first call reads every row's ids as the prompt, so each row is at the start
    processor = LogitsProcessor(SPEC, byte_lm.tokenizer)
    ids = torch.full(id_shape, 67).to(id_dtype)  # 67: 'a'
    scores = torch.zeros((score_rows, score_width) if two_dims else (score_width,)).to(score_dtype)
    found = outcome(lambda: processor(ids, scores))
    if not valid_processor_inputs(ids, scores, processor.fsm.logits_width):
        assert isinstance(found, OptionError), (id_shape, id_dtype, scores.shape, score_dtype, found)
        return
    assert isinstance(found, torch.Tensor) and found.shape == scores.shape and not scores.isinf().any()
    start = processor.fsm.allowed_token_ids(processor.fsm.initial_state).tolist()
    for row in found:
        assert torch.isfinite(row).nonzero().flatten().tolist() == start
    ids = torch.cat([ids, torch.full((ids.shape[0], 1), 67, dtype=ids.dtype)], 1)  # one more token: 'a'
    after = processor(ids, scores)
    state = processor.fsm.walk(processor.fsm.initial_state, [67])[-1]
    assert torch.isfinite(after[0]).nonzero().flatten().tolist() == processor.fsm.allowed_token_ids(state).tolist()


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG, method="thread")
@settings(FUZZ, max_examples=CASES["regexes"])
@given(st.one_of(st.text(max_size=6), NOT_STR, st.binary(max_size=3)))
def test_random_regex_patterns_compile_or_are_refused(byte_lm: structspec.LM, pattern: Any) -> None:
    found = outcome(lambda: structspec.compile(Regex(pattern), byte_lm))
    if not isinstance(pattern, str):  # None raised TypeError from deep in the automaton
        assert isinstance(found, SpecError) and "not a str" in str(found), (pattern, found)
    else:  # a str compiles, or is a regex structspec does not read
        assert isinstance(found, (structspec.Compiled, RegexError)), (pattern, found)


TEXT = st.text(max_size=8)
FIELD = st.one_of(TEXT, TEXT, JUNK)
MESSAGE = st.one_of(st.fixed_dictionaries({}, optional={"role": FIELD, "content": FIELD, "name": FIELD}),
                    st.fixed_dictionaries({"role": st.sampled_from(["user", "system"]), "content": TEXT}), JUNK)
PROMPTS = st.one_of(TEXT, st.lists(MESSAGE, max_size=3), MESSAGE, st.tuples(MESSAGE), JUNK)


def valid_prompt(prompt: Any) -> bool:
    """A non-empty str, or a non-empty list of dicts whose role and content are str."""
    if isinstance(prompt, str):
        return bool(prompt)
    return isinstance(prompt, list) and bool(prompt) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)


@pytest.mark.slow
@pytest.mark.timeout(WATCHDOG, method="thread")
@settings(FUZZ, max_examples=CASES["prompts"])
@given(PROMPTS)
def test_random_chat_shapes_give_a_result_or_a_prompt_error(byte_lm: structspec.LM, prompt: Any) -> None:
    found = outcome(lambda: structspec.generate_result(byte_lm, SPEC, prompt, max_new_tokens=2))
    if valid_prompt(prompt):
        assert isinstance(found, Result) and found.stop_reason in OK_STOPS, found
    else:
        assert isinstance(found, PromptError), (prompt, found)


@pytest.mark.parametrize("prompt", [None, 3, [{"role": "user", "content": 4}]])
def test_a_bad_prompt_in_a_batch_fails_that_row_alone(byte_lm: structspec.LM, prompt: Any) -> None:
    results = structspec.generate_batch(byte_lm, SPEC, [prompt, "ab"], max_new_tokens=3)
    assert results[0].stop_reason == "error" and str(results[0].error).startswith("row 0: ")
    assert results[1].stop_reason in OK_STOPS
