"""The bare-calls benchmark's turns (16 of the Berkeley Function Calling Leaderboard's, converted) and its run
end to end on a tiny model (the measurement itself runs on the real model, by hand)."""

from __future__ import annotations

import jsonschema

import structspec
from lab import barecalls
from structspec.tools.benchmarks.toolbench import load_conversations


def test_the_turns_are_agent_turns_written_by_others() -> None:
    conversations = load_conversations(barecalls.BFCL)
    assert len(conversations) >= 10
    assert (barecalls.BFCL.parent / "README.md").read_text().count("bfcl_multiple.jsonl") == 1  # its source
    for c in conversations:
        assert c.choice == "auto" and 2 <= len(c.tools) <= 4 and c.messages[-1]["role"] == "user"
        c.spec()  # a valid ToolCalls
        (call,) = c.expected
        schemas = {t["function"]["name"]: t["function"]["parameters"] for t in c.tools}
        jsonschema.validate(call["arguments"], schemas[call["name"]])  # the expected call is a call of its tool


def test_the_benchmark_runs_both_modes_end_to_end(byte_lm) -> None:
    conversations = load_conversations(barecalls.BFCL, 2)
    counts, lines = barecalls.run(byte_lm, conversations, max_new_tokens=12)
    assert list(counts) == list(barecalls.MODES) and len(lines) == 2 * len(conversations)
    for c in counts.values():
        assert c.turns == 2 and c.calls + c.text_turns + c.incomplete >= c.turns and c.output_tokens > 0
    table = barecalls.markdown(counts).splitlines()
    assert table[0].startswith("| mode | calls made |") and len(table) == 2 + len(barecalls.MODES)
    assert structspec.ToolCalls(conversations[0].tools).bare_calls  # "after" is the default
