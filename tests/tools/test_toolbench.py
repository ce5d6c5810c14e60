"""The tool-call benchmark's data set and scoring (the benchmark itself runs on the real model, by hand)."""

from __future__ import annotations

import pytest

import structspec
from structspec.tools.benchmarks.toolbench import Tally, load_conversations, parse_text_calls, score, value_calls


def test_the_conversations_are_the_benchmark_the_issue_asks_for() -> None:
    conversations = load_conversations()
    assert len(conversations) >= 24
    assert all(2 <= len(c.tools) <= 4 for c in conversations)
    assert sum(len(c.expected) == 2 for c in conversations) >= 4  # some with two calls
    assert sum(c.choice not in ("auto", "required", "none") for c in conversations) >= 4  # some forced
    for c in conversations:
        c.spec()  # a valid ToolCalls: tools, choice
        for call in c.expected:
            for value in call["arguments"].values():  # every argument copied from the user's message
                assert str(value) in c.messages[-1]["content"], (c.id, value)


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]


def test_unconstrained_text_is_parsed_as_the_template_writes_calls() -> None:
    assert parse_text_calls('ok <tool_call>\n{"name": "f", "arguments": {"n": 2}}\n</tool_call>', TOOLS) == [
        {"name": "f", "arguments": {"n": 2}}]
    assert parse_text_calls('<tool_call>{"name": "f", "arguments": {"n": "2"}}</tool_call>', TOOLS) is None
    assert parse_text_calls('<tool_call>{"name": "g", "arguments": {}}</tool_call>', TOOLS) is None
    assert parse_text_calls("no call", TOOLS) == []


def test_scoring_counts_valid_turns_and_exact_calls() -> None:
    (conversation,) = [c for c in load_conversations() if len(c.expected) == 2][:1]
    tally = Tally()
    score(tally, conversation, conversation.expected)
    score(tally, conversation, [conversation.expected[0], {**conversation.expected[1], "arguments": {}}])
    score(tally, conversation, None)
    assert (tally.turns, tally.valid_turns, tally.exact_calls, tally.calls_expected) == (3, 2, 3, 6)
    value = structspec.ToolCallsValue("", [structspec.ToolCall("f", {"n": 1})])
    assert value_calls(value) == [{"name": "f", "arguments": {"n": 1}}]


def test_the_command_loads_the_model_on_the_device_dtype_and_threads_it_names(monkeypatch) -> None:
    import argparse

    from structspec.tools.benchmarks import toolbench
    from structspec.tools.arguments import toolbench_arguments

    asked = []

    def load(*args, **kwargs):
        asked.append((args, kwargs))
        raise structspec.ModelNotFoundError("stop here")

    monkeypatch.setattr(structspec, "load", load)
    parser = argparse.ArgumentParser()
    toolbench_arguments(parser)
    args = parser.parse_args(["--model", "m", "--device", "cpu", "--dtype", "bfloat16", "--threads", "3"])
    with pytest.raises(structspec.ModelNotFoundError, match="stop here"):
        toolbench.main(args)
    assert asked == [(("m", "cpu", "bfloat16", "auto"), {"threads": 3})]


# A chat template of Qwen's shape (tools in the system turn), for the tiny model with Qwen2.5's tokenizer.
TEMPLATE = ("{%- if tools %}<|im_start|>system\n# Tools\n<tools>{% for tool in tools %}\n{{ tool | tojson }}"
            "{% endfor %}\n</tools><|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
            "{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_the_benchmark_runs_every_mode_end_to_end(qwen_lm, monkeypatch) -> None:
    from structspec.tools.benchmarks import toolbench

    monkeypatch.setattr(qwen_lm.tokenizer, "chat_template", TEMPLATE, raising=False)
    conversations = [c for c in load_conversations() if len(c.expected) == 2][:1] + [
        c for c in load_conversations() if c.choice not in ("auto", "required", "none")][:2]
    tallies = toolbench.run(qwen_lm, conversations, max_new_tokens=48, batch_size=2)
    assert list(tallies) == [*toolbench.PEERS, *toolbench.STRUCTSPEC_MODES, toolbench.batch_label(2)]
    for name, tally in tallies.items():
        assert tally.turns == len(conversations) and tally.output_tokens > 0 and tally.seconds > 0
        assert tally.passes >= 1 and tally.calls_expected == 4
        if name in toolbench.PEERS:
            assert tally.identical is None and tally.forced == 0
        else:  # lossless: every mode's turns are plain masked decoding's, tokens and calls
            assert tally.identical == len(conversations), name
            assert tally.valid_turns == tallies["plain masked"].valid_turns
            assert (tally.forced > 0) == (name != "plain masked"), name
    # a forced choice writes its call's skeleton without the model: fewer passes than tokens
    assert tallies["fast-forward"].passes < tallies["fast-forward"].output_tokens
    assert tallies["plain masked"].passes >= tallies["plain masked"].output_tokens
    # one prefill per conversation, timed apart, counted alike in every mode and taken off its seconds per call
    prefill = tallies["plain masked"].prefill_seconds
    assert prefill > 0 and all(t.prefill_seconds == prefill for t in tallies.values())
    table = toolbench.markdown(tallies).splitlines()
    assert table[0].startswith("| mode | s / call | s / call after prefill |") and len(table) == 2 + len(tallies) + 2
    assert table[1 + len(tallies)].endswith(f"| {len(conversations)}/{len(conversations)} |")
    for line, tally in zip(table[2:], tallies.values()):
        cells = line.split(" | ")
        assert cells[2] == f"{(tally.seconds - prefill) / tally.calls_expected:.3f}"
    assert table[-1].startswith("Prefill alone") and f"{prefill / 4:.3f} s / call" in table[-1]
