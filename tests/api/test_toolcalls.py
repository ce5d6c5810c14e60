"""`ToolCalls`: the turn's language per choice, validated calls, tools given to the chat template, bad tool sets
before any model call, every accelerated and batched mode token-identical to plain masked decoding, and
sampling that keeps the constrained distribution."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Literal, get_args

import pytest
import torch
from pydantic import BaseModel

import structspec
from structspec import SchemaError, ToolCall, ToolCalls, ToolCallsValue, ToolError, ToolSchemaError
from structspec.events import chat_prompt_ids
from structspec.testing.models import FakeLM

TOOL_CALL, END_CALL = 151657, 151658


class GetWeather(BaseModel):
    """The weather in a city now."""

    city: str
    unit: Literal["C", "F"] = "C"


def send_email(to: str, subject: str) -> None:
    """Send an email."""


SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
CALL = '\n{"name": "GetWeather", "arguments": {"city": "Paris", "unit": "C"}}\n'
SEARCH_CALL = '\n{"name": "search", "arguments": {"query": "x"}}\n'


def accepts(compiled: structspec.Compiled, pieces: list[str | int]) -> bool:
    fsm, state = compiled.fsm, compiled.fsm.initial_state
    for piece in pieces:
        state = fsm.next_state(state, piece) if isinstance(piece, int) else fsm.index.dfa.step(state, piece.encode())
        if not state:
            return False
    return fsm.is_final(state)


@pytest.mark.parametrize("choice, parallel, table", [
    ("auto", False, [(["Sure."], True), ([TOOL_CALL, CALL, END_CALL], True), (["Let me look.", TOOL_CALL, CALL, END_CALL], True),
                     ([TOOL_CALL, CALL, END_CALL, "\n", TOOL_CALL, SEARCH_CALL, END_CALL], False),
                     ([TOOL_CALL, CALL.replace("Paris", "Par\\nis"), END_CALL], True),
                     ([TOOL_CALL, CALL.replace('"C"', '"K"'), END_CALL], False),
                     ([TOOL_CALL, CALL.replace("GetWeather", "GetTime"), END_CALL], False),
                     (["<tool_call>", CALL, "</tool_call>"], False), (["say <tool_call> here"], False)]),
    ("required", True, [(["Sure."], False), ([TOOL_CALL, CALL, END_CALL], True), (["Hi", TOOL_CALL, CALL, END_CALL], False),
                        ([TOOL_CALL, CALL, END_CALL, "\n", TOOL_CALL, SEARCH_CALL, END_CALL], True)]),
    ("none", False, [(["Sure."], True), ([TOOL_CALL, CALL, END_CALL], False), (["Sure. <tool_call>"], False)]),
    ("search", True, [([TOOL_CALL, SEARCH_CALL, END_CALL], True), ([TOOL_CALL, CALL, END_CALL], False),
                      (["Hi", TOOL_CALL, SEARCH_CALL, END_CALL], False),
                      ([TOOL_CALL, SEARCH_CALL, END_CALL, "\n", TOOL_CALL, SEARCH_CALL, END_CALL], False)]),
])
def test_the_turns_language_per_choice(qwen_lm, choice, parallel, table) -> None:
    compiled = structspec.compile(ToolCalls([GetWeather, send_email, SEARCH], choice=choice, parallel=parallel), qwen_lm)
    for pieces, expected in table:
        assert accepts(compiled, pieces) == expected, pieces


def test_the_value_is_the_text_and_the_validated_calls(qwen_lm) -> None:
    compiled = structspec.compile(ToolCalls([GetWeather, send_email, SEARCH], parallel=True), qwen_lm)
    text = ("Checking.<tool_call>" + CALL + "</tool_call>\n<tool_call>"
            + '\n{"name": "send_email", "arguments": {"to": "a@b.c", "subject": "Hi"}}\n</tool_call>')
    value = compiled.constraint.parse(text)
    assert value.text == "Checking."
    assert value.calls[0] == ToolCall("GetWeather", GetWeather(city="Paris", unit="C"))
    assert value.calls[1].name == "send_email" and value.calls[1].arguments.to == "a@b.c"
    assert type(value.calls[1].arguments).__name__ == "send_email"  # the function's parameters as a model


def test_a_forced_call_is_generated_with_its_skeleton_forced(qwen_lm) -> None:
    def set_alarm(hour: Literal[6, 7, 8], repeat: bool) -> None: ...

    result = structspec.generate_result(qwen_lm, ToolCalls([set_alarm, SEARCH], choice="set_alarm"),
                                        "Wake me at 7 every day.", max_new_tokens=60)
    assert result.complete, result.text
    assert isinstance(result.value, ToolCallsValue) and result.value.text == ""
    (call,) = result.value.calls
    assert call.name == "set_alarm" and call.arguments.hour in (6, 7, 8)
    assert result.token_ids[0] == TOOL_CALL and result.token_ids[-1] == END_CALL
    assert result.text.startswith('<tool_call>\n{"name": "set_alarm", "arguments": ')
    assert result.sources[0] == "forced" and result.stats.forced_tokens >= 8  # marker, skeleton, keys


def test_the_chat_template_gets_the_tools(qwen_lm, monkeypatch) -> None:
    template = ("{% for t in tools %}[{{ t.function.name }}: {{ t.function.description }}]{% endfor %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    monkeypatch.setattr(qwen_lm.tokenizer, "chat_template", template, raising=False)
    spec = ToolCalls([GetWeather, send_email], choice="none")
    result = structspec.generate_result(qwen_lm, spec, [{"role": "user", "content": "Hi"}], max_new_tokens=2,
                                        draft=None)
    shown = qwen_lm.tokenizer.decode(qwen_lm.encode_prompt([{"role": "user", "content": "Hi"}],
                                                           tools=spec.chat_tools()))
    assert shown == "[GetWeather: The weather in a city now.][send_email: Send an email.]Hi"
    # the same ids fed the model: a prompt without tools is shorter
    assert result.stats.prompt_tokens == len(qwen_lm.encode_prompt([{"role": "user", "content": "Hi"}],
                                                                   tools=spec.chat_tools()))


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
])
def test_a_template_that_ignores_tools_gets_them_in_the_system_message(qwen_lm, monkeypatch, messages) -> None:
    # SmolLM2's shipped template renders the messages alone: the model would never see the tools
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    monkeypatch.setattr(qwen_lm.tokenizer, "chat_template", template, raising=False)
    spec = ToolCalls([GetWeather, SEARCH])
    result = structspec.generate_result(qwen_lm, spec, messages, max_new_tokens=2, draft=None)
    ids = chat_prompt_ids(qwen_lm, messages, spec.chat_tools())
    shown = qwen_lm.tokenizer.decode(ids)
    assert result.stats.prompt_tokens == len(ids)
    assert shown.count("<system>") == 1 and shown.index("<system>") == 0  # one system message, first
    assert shown.startswith("<system>Be brief.\n\nYou may call") == (messages[0]["role"] == "system")
    listed = shown.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()
    assert [json.loads(line) for line in listed] == spec.chat_tools()
    assert shown.endswith("<user>Hi") and "<tool_call>" in shown


@pytest.mark.parametrize("make, error, words", [
    (lambda: ToolCalls([GetWeather, GetWeather]), ToolError, "two tools are named 'GetWeather'"),
    (lambda: ToolCalls([GetWeather], choice="get_time"), ToolError, "choice='get_time' names no tool"),
    (lambda: ToolCalls([]), ToolError, "non-empty list"),
    (lambda: ToolCalls([{"type": "function", "function": {"parameters": {}}}]), ToolError, "tools[0] has no name"),
    (lambda: ToolCalls([lambda city: None]), ToolError, "no type annotation"),
    (lambda: ToolCalls([42]), ToolError, "tools[0] is a int"),
    (lambda: ToolCalls([GetWeather], parallel="no"), ToolError, "parallel='no': pass True"),
    (lambda: ToolCalls([GetWeather], bare_calls="yes"), ToolError, "bare_calls='yes': pass True"),
])
def test_bad_tool_sets_fail_when_made(make, error, words) -> None:
    with pytest.raises(error, match=re.escape(words)):
        make()


def test_a_tool_schema_that_does_not_compile_names_the_tool_and_pointer(qwen_lm) -> None:
    bad = {"name": "lookup", "parameters": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "(?<=a)b"}}}}
    with pytest.raises(ToolSchemaError, match=r"tool 'lookup': .*'pattern' at /properties/code") as info:
        structspec.compile(ToolCalls([GetWeather, bad]), qwen_lm)
    assert isinstance(info.value, SchemaError) and info.value.tool == "lookup"


PROMPT = ('User: weather in Paris, in C? Earlier: {"name": "GetWeather", "arguments": {"city": "Paris", '
          '"unit": "C"}} and {"name": "search", "arguments": {"query": "Paris weather"}}\nAssistant:')


@pytest.mark.parametrize("choice", ["GetWeather", "required", "auto"])
def test_accelerated_modes_are_token_identical_to_plain_masked_decoding(qwen_lm, choice) -> None:
    spec = ToolCalls([GetWeather, SEARCH], choice=choice)
    plain = structspec.generate_result(qwen_lm, spec, PROMPT, fast_forward="off", draft=None, max_new_tokens=40)
    # every mode against the one plain decoding (greedy: the same whichever mode it is compared with)
    for mode in [dict(fast_forward="exact", draft=None), dict(fast_forward="exact"), dict(draft="lookahead"),
                 dict(draft=structspec.TreeDrafter())]:
        fast = structspec.generate_result(qwen_lm, spec, PROMPT, max_new_tokens=40, **mode)
        assert fast.token_ids == plain.token_ids and fast.stop_reason == plain.stop_reason, mode
        assert fast.stats.target_forward_passes <= plain.stats.target_forward_passes, mode


def test_batches_with_a_tool_set_per_row_match_each_row_alone(qwen_lm) -> None:
    specs = [ToolCalls([GetWeather, SEARCH], choice="GetWeather"), ToolCalls([send_email], choice="required"),
             ToolCalls([SEARCH], choice="auto"), structspec.Reasoning(ToolCalls([GetWeather], choice="GetWeather"),
                                                                       max_thinking_chars=8)]
    prompts = [PROMPT, "Mail bob@x.org about lunch.", "Find cats.", "Think, then call."]
    alone = [structspec.generate_result(qwen_lm, s, p, fast_forward="off", draft=None, max_new_tokens=40)
             for s, p in zip(specs, prompts)]
    batched = structspec.generate_batch(qwen_lm, specs, prompts, batch_size=3, max_new_tokens=40)
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]
    assert [r.value for r in batched] == [r.value for r in alone]


@pytest.mark.slow  # a statistical test: 35 s alone on this 2-core machine
def test_sampling_a_small_tool_call_spec_keeps_the_distribution(byte_lm) -> None:
    """Accelerated sampling (fast-forward, prompt lookup) against plain masked sampling, each on its own seeds:
    a two-sample chi-square over the calls' arguments. (The exact distribution of a call over every spelling of
    its skeleton is too large a token tree to enumerate.)"""
    def pick(colour: Literal["red", "tan", "ash"], size: Literal["S", "L"]) -> None: ...

    spec = ToolCalls([pick], choice="pick", markers="text", whitespace_pattern="")
    prompt = 'pick {"colour":"red","size":"L"}:'

    def counts(seeds: range, **mode: object) -> Counter[tuple[str, str]]:
        out: Counter[tuple[str, str]] = Counter()
        for seed in seeds:
            r = structspec.generate_result(byte_lm, spec, prompt, temperature=1.5, seed=seed, max_new_tokens=120, **mode)
            (call,) = r.value.calls
            out[call.arguments.colour, call.arguments.size] += 1
        return out

    fast = counts(range(150))
    plain = counts(range(1000, 1150), fast_forward="off", draft=None)
    assert len(fast | plain) >= 4  # the sample spreads over the arguments
    assert two_sample_pvalue(fast, plain) > 0.001


def two_sample_pvalue(a: Counter, b: Counter) -> float:
    """Pearson's chi-square p-value that ``a`` and ``b`` are drawn from one distribution (a 2 × k table)."""
    na, nb = sum(a.values()), sum(b.values())
    pooled = {k: (a[k] + b[k]) / (na + nb) for k in a | b}
    stat = 0.0
    for counts, n in ((a, na), (b, nb)):
        stat += sum((counts[k] - n * p) ** 2 / (n * p) for k, p in pooled.items())
    dof = len(pooled) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def test_the_matcher_and_the_logits_processor_take_tool_calls(qwen_lm) -> None:
    from structspec.integrations.matcher import Matcher
    from structspec.integrations.transformers import LogitsProcessor

    spec = ToolCalls([GetWeather, SEARCH], choice="search")
    matcher = Matcher(spec, qwen_lm.tokenizer, logits_width=qwen_lm.logits_width)  # the tokenizer alone
    assert matcher.forced_tokens()[0] == TOOL_CALL
    call = [TOOL_CALL, *qwen_lm.tokenizer.encode(SEARCH_CALL, add_special_tokens=False), END_CALL]
    assert matcher.accept_tokens(call) and matcher.accept_tokens([qwen_lm.vocab.eos_token_id])
    matcher.reset()
    assert not matcher.accept_tokens([qwen_lm.vocab.ids_by_bytes[b"<"]])  # the marker's text is not the marker

    prompt = qwen_lm.encode_prompt(PROMPT)
    processor = LogitsProcessor(spec, qwen_lm)
    out = qwen_lm.model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False,
                                 logits_processor=[processor], pad_token_id=qwen_lm.vocab.eos_token_id)
    ours = structspec.generate_result(qwen_lm, spec, PROMPT, fast_forward="off", draft=None, max_new_tokens=40)
    assert out[0, len(prompt):].tolist()[: len(ours.token_ids)] == ours.token_ids


def test_stream_events_end_with_the_calls(qwen_lm) -> None:
    def set_alarm(hour: Literal[6, 7, 8], repeat: bool) -> None: ...

    events = list(structspec.stream(qwen_lm, ToolCalls([set_alarm, SEARCH], choice="set_alarm"), PROMPT,
                                    max_new_tokens=60))
    result = events[-1].result
    chunks = [e.text for e in events if isinstance(e, structspec.TextChunk)]
    assert "".join(chunks) == result.text and result.text.startswith("<tool_call>")
    assert result.value.calls[0].name == "set_alarm"
    (done,) = [e for e in events if isinstance(e, structspec.CallDone)]
    assert done.call == result.value.calls[0] and done.text_so_far == result.text
    assert all(isinstance(e, get_args(structspec.StreamEvent)) for e in events)  # the union names them all


@pytest.mark.real_model
def test_the_shipped_smollm2_template_gets_the_tools_in_its_system_message(smollm2) -> None:
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    tools = ToolCalls([GetWeather]).chat_tools()
    shown = smollm2.tokenizer.decode(chat_prompt_ids(smollm2, messages, tools))
    assert shown.startswith("<|im_start|>system\nYou may call these tools") and '"name": "GetWeather"' in shown
    assert shown.count("<|im_start|>system") == 1  # in place of the template's default system message


MARKED = ["a</tool_call>b", "<tool_call>", 'x<tool_call>\n{"name": "echo"}\n</tool_call>y']


def echo_tool(text: str) -> dict:
    """A tool whose one argument is ``text``, fixed: the grammar forces the whole call."""
    return {"type": "function", "function": {"name": "echo", "parameters": {
        "type": "object", "properties": {"text": {"const": text}}, "required": ["text"],
        "additionalProperties": False}}}


@pytest.mark.parametrize("family, markers", [("byte_lm", "auto"),  # (text: this vocabulary has no such token)
                                             pytest.param("qwen_lm", "auto", marks=pytest.mark.slow),  # special
                                             pytest.param("qwen_lm", "text", marks=pytest.mark.slow)])
@pytest.mark.parametrize("text", MARKED)
def test_marker_text_inside_an_argument_is_argument_text(family, markers, text, request) -> None:
    lm = request.getfixturevalue(family)
    spec = ToolCalls([echo_tool(text), SEARCH], choice="echo", markers=markers)
    result = structspec.generate_result(lm, spec, "Echo it.", max_new_tokens=120)
    assert result.complete and result.stop_reason != "invalid", result.error
    assert result.value.calls == [ToolCall("echo", {"text": text})]
    assert structspec.generate(lm, spec, "Echo it.", max_new_tokens=120) == result.value
    events = list(structspec.stream(lm, spec, "Echo it.", max_new_tokens=120))
    (done,) = [e for e in events if isinstance(e, structspec.CallDone)]
    assert done.call == result.value.calls[0] and events[-1].result.text == result.text
    assert result.text.startswith(done.text_so_far) and done.text_so_far.endswith("</tool_call>")


def test_parallel_calls_with_marker_text_are_read_alike_whole_and_streamed(byte_lm) -> None:
    from structspec.schema.toolcalls import CallReader

    compiled = structspec.compile(ToolCalls([echo_tool(MARKED[2]), SEARCH], parallel=True, markers="text"), byte_lm)
    calls = ['<tool_call>\n{"name": "echo", "arguments": ' + json.dumps({"text": MARKED[2]}) + "}\n</tool_call>",
             '<tool_call>\n{"name": "search", "arguments": {"query": "</tool_call>"}}\n</tool_call>']
    text = "Two calls." + calls[0] + "\n" + calls[1]
    assert accepts(compiled, [text])
    value = compiled.constraint.parse(text)
    assert value.text == "Two calls." and [c.arguments for c in value.calls] == [{"text": MARKED[2]},
                                                                                 {"query": "</tool_call>"}]
    reader = compiled.constraint.events()
    assert isinstance(reader, CallReader)
    streamed = [e for i in range(0, len(text), 7) for e in reader.read(text[i:i + 7])]  # 7 characters a chunk
    assert [e.call for e in streamed] == value.calls
    assert [e.text_so_far for e in streamed] == [text[: text.index(calls[0]) + len(calls[0])], text]


@pytest.mark.parametrize("name", ["a\\b", 'say "hi"', "two\nlines", "tab\there", "naïve"])
def test_a_tool_name_json_escapes_is_written_escaped(byte_lm, name) -> None:
    tool = {"type": "function", "function": {"name": name, "parameters": {
        "type": "object", "properties": {"n": {"enum": [7]}}, "required": ["n"], "additionalProperties": False}}}
    spec = ToolCalls([tool, SEARCH], choice=name, markers="text")
    result = structspec.generate_result(byte_lm, spec, "Call it.", max_new_tokens=80)
    assert result.complete, (result.stop_reason, result.text)
    assert result.value.calls == [ToolCall(name, {"n": 7})]
    assert json.loads(result.text.split("<tool_call>")[1].split("</tool_call>")[0])["name"] == name


BARE = '{"name": "GetWeather", "arguments": {"city": "Paris", "unit": "C"}}'
BARE_SEARCH = '{"name": "search", "arguments": {"query": "x"}}'


@pytest.mark.parametrize("parallel, table", [
    (False, [(BARE, True), (" \n" + BARE, True), ("```json\n" + BARE + "\n```", True), ("```\n" + BARE + "\n```", True),
             (BARE.replace('"C"', '"K"'), False), (BARE.replace("GetWeather", "GetTime"), False),
             ('{"a": 1}', False), ("{", False), ('```json\n{"a": 1}\n```', False), ("```json\n" + BARE, False),
             (BARE + "\n```", False), (BARE + " Done.", False), (BARE + "\n" + BARE_SEARCH, False),
             ("Sure {x}", True), ("```python\nx = {}\n```", True), ("```json\n[1]\n```", True), ("<b>hi</b>", True),
             ("", True), ("  ", True), ("<tool_call>", False), ("<tool_call>" + CALL + "</tool_call>", True),
             ("Let me look.<tool_call>" + CALL + "</tool_call>", True)]),
    (True, [(BARE + "\n" + BARE_SEARCH, True), ("```json\n" + BARE + "\n" + BARE_SEARCH + "\n```", True),
            (BARE + "\n\n" + BARE_SEARCH, False), (BARE + "\n", False)]),
])
def test_auto_takes_a_turn_opening_with_a_json_object_as_a_bare_call(byte_lm, parallel, table) -> None:
    # the choice falls on the first byte of the call's JSON: from there only calls to the given tools, whose
    # arguments match their schemas, alone or in a ```json fence; any other text is free
    compiled = structspec.compile(ToolCalls([GetWeather, send_email, SEARCH], parallel=parallel, markers="text"),
                                  byte_lm)
    for text, expected in table:
        assert accepts(compiled, [text]) == expected, text


def test_bare_calls_off_keeps_a_json_opening_text(byte_lm) -> None:
    compiled = structspec.compile(ToolCalls([GetWeather, SEARCH], markers="text", bare_calls=False), byte_lm)
    assert accepts(compiled, ['{"a": 1}']) and accepts(compiled, [BARE])
    with pytest.warns(UserWarning, match="unmarked_calls"):
        value = compiled.constraint.parse(BARE)
    assert value.calls == [] and value.unmarked_calls == [ToolCall("GetWeather", GetWeather(city="Paris"))]
    for choice in ("required", "GetWeather"):  # (bare calls are auto's: the others force the markers)
        forced = structspec.compile(ToolCalls([GetWeather, SEARCH], choice=choice, markers="text"), byte_lm)
        assert not accepts(forced, [BARE])


@pytest.mark.parametrize("text, opened", [
    (BARE, 0), ("\n" + BARE, 1), ("```json\n" + BARE + "\n" + BARE_SEARCH + "\n```", 0)])
def test_a_bare_turn_is_read_into_calls_whole_and_streamed(byte_lm, text, opened) -> None:
    compiled = structspec.compile(ToolCalls([GetWeather, SEARCH], parallel=True, markers="text"), byte_lm)
    value = compiled.constraint.parse(text)
    expected = [ToolCall("GetWeather", GetWeather(city="Paris")), ToolCall("search", {"query": "x"})]
    assert value == ToolCallsValue(text[:opened], expected[: 1 + ("search" in text)])
    ends = [text.index(BARE) + len(BARE)] + ([text.index(BARE_SEARCH) + len(BARE_SEARCH)] if "search" in text else [])
    for size in (1, 3, 7, len(text)):
        reader = compiled.constraint.events()
        done = [e for i in range(0, len(text), size) for e in reader.read(text[i:i + size])]
        assert [e.call for e in done] == value.calls and [len(e.text_so_far) for e in done] == ends


class OpensBraces(FakeLM):
    """A `FakeLM` that prefers ``{`` wherever it may write one, as a small model opening a call bare does."""

    def _logits(self, prefix_hash: int) -> torch.Tensor:
        logits = super()._logits(prefix_hash)
        logits[self.vocab.ids_by_bytes[b"{"]] += 50
        return logits


def test_a_bare_call_is_generated_with_its_skeleton_forced() -> None:
    def set_alarm(hour: Literal[6, 7, 8], repeat: bool) -> None: ...

    def snooze(minutes: Literal[5, 10]) -> None: ...

    lm, prompt = OpensBraces(), "Wake me at 7 every day."
    spec = ToolCalls([set_alarm, snooze])
    plain = structspec.generate_result(lm, spec, prompt, fast_forward="off", draft=None, max_new_tokens=60)
    result = structspec.generate_result(lm, spec, prompt, max_new_tokens=60)
    assert result.complete and result.token_ids == plain.token_ids, result.text
    (call,) = result.value.calls
    assert call.name in ("set_alarm", "snooze") and result.value.unmarked_calls == []
    assert result.text.startswith(f'{{"name": "{call.name}", "arguments": {{') and result.text.endswith("}")
    assert result.sources[0] == "model" and result.sources[1] == "forced"  # the model opens, the grammar goes on
    assert result.stats.forced_tokens >= 6 and plain.stats.target_forward_passes > result.stats.target_forward_passes
    # bare calls off: the same model's "{" is text, no call is made and nothing is forced
    before = structspec.generate_result(lm, ToolCalls([set_alarm, snooze], bare_calls=False), prompt,
                                        max_new_tokens=60)
    assert before.text.startswith("{{") and before.stats.forced_tokens == 0
    assert before.value is None or before.value.calls == []


@pytest.mark.real_model
def test_qwen_writes_an_auto_turn_as_a_bare_call(qwen_coder) -> None:
    # a turn of the Berkeley Function Calling Leaderboard's "multiple" set (tests/data/bfcl_multiple.jsonl): this
    # model answers it with the call in a ```json block, without <tool_call> markers
    conversation = json.loads((Path(__file__).parents[1] / "data" / "bfcl_multiple.jsonl").read_text().splitlines()[2])
    spec = ToolCalls(conversation["tools"], choice="auto")
    result = structspec.generate_result(qwen_coder, spec, conversation["messages"], max_new_tokens=80)
    assert result.complete, result.text
    assert result.value.calls == [ToolCall("country_info.capital", {"country": "Brazil"})]
    assert result.text.startswith("```json\n{") and result.stats.forced_tokens >= 8
    with pytest.warns(UserWarning, match="unmarked_calls"):  # bare calls off: the same call, as text
        before = structspec.generate_result(qwen_coder, ToolCalls(conversation["tools"], bare_calls=False),
                                            conversation["messages"], max_new_tokens=80)
    assert before.value.calls == [] and before.value.unmarked_calls == result.value.calls
    assert before.stats.forced_tokens == 0


def test_a_model_tool_without_a_docstring_has_no_description() -> None:
    """`inspect.getdoc` reads BaseModel's docstring (a page on Pydantic) into a model that has none."""

    class Undocumented(BaseModel):
        city: str

    tools = ToolCalls([Undocumented, GetWeather]).chat_tools()
    assert [t["function"]["description"] for t in tools] == ["", "The weather in a city now."]
