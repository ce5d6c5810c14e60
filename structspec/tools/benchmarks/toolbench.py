"""`structspec toolbench`: tool calls on a chat model, structspec's modes against transformers' own decoding.

Each conversation (a line of ``examples/toolcalls.jsonl``: tools, the user's message, ``choice``, ``parallel``
and the expected calls, arguments copied from the message) is decoded by every mode with the tools in the chat
template. transformers' rows are unconstrained: their tool-call text is parsed as Qwen's template writes it
(``<tool_call>{json}</tool_call>``). The report reads the results' own stats: seconds per call, target passes
per output token, the forced share, drafted acceptance, the valid-call rate and exact-argument accuracy; and
seconds per call after the prompt's prefill, which every mode pays alike (`prefill_seconds`, timed once per
conversation).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

import structspec
from structspec.events import chat_prompt_ids
from structspec.models.transformers_lm import LM
from structspec.tools.benchmarks.peers import PeerRun, hf_prompt_lookup, unconstrained_greedy
from structspec.tools.arguments import toolbench_arguments
from structspec.tools.command import drafting_curve
from structspec.tools.benchmarks.prefill import prefill_seconds
from structspec.tools.tasks import example_file

STRUCTSPEC_MODES: dict[str, dict[str, Any]] = {
    "plain masked": {"fast_forward": "off", "draft": None},
    "fast-forward": {"fast_forward": "exact", "draft": None},
    "+ prompt lookup": {"fast_forward": "exact", "draft": "prompt_lookup"},
    "+ lookahead": {"fast_forward": "exact", "draft": "lookahead"},
}
PEERS = {"transformers greedy": unconstrained_greedy, "transformers prompt lookup": hf_prompt_lookup}


def batch_label(batch_size: int) -> str:
    """The batched row's name in the table."""
    return f"batch {batch_size} (+ prompt lookup)"


@dataclass(frozen=True)
class Conversation:
    """One benchmark conversation: its tools, messages, ``choice``, ``parallel`` and the expected calls."""

    id: str
    tools: list[dict[str, Any]]
    messages: list[dict[str, str]]
    choice: str
    parallel: bool
    expected: list[dict[str, Any]]

    def spec(self) -> structspec.ToolCalls:
        return structspec.ToolCalls(self.tools, choice=self.choice, parallel=self.parallel)


def load_conversations(path: Path | None = None, limit: int | None = None) -> list[Conversation]:
    """The conversations of a JSONL file (default: the shipped ``toolcalls.jsonl``), the first ``limit`` of them.
    Reads the file, changes nothing."""
    path = example_file("toolcalls.jsonl") if path is None else path
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [Conversation(**line) for line in lines[:limit]]


@dataclass
class Tally:
    """One mode's totals over the conversations."""

    seconds: float = 0.0
    prefill_seconds: float = 0.0  # of ``seconds``: the prompts' prefill alone, the same in every mode
    calls_expected: int = 0
    output_tokens: int = 0
    passes: int = 0
    forced: int = 0
    drafted: int = 0
    accepted: int = 0
    valid_turns: int = 0
    exact_calls: int = 0
    turns: int = 0
    identical: int | None = None  # turns token-identical to plain masked decoding's (None: not compared)
    unmarked: int = 0  # calls an auto turn wrote as text without the markers (`ToolCallsValue.unmarked_calls`)

    def row(self) -> list[str]:
        per = lambda a, b: f"{a / b:.3f}" if b else "–"  # noqa: E731
        return [per(self.seconds, self.calls_expected), per(self.seconds - self.prefill_seconds, self.calls_expected),
                per(self.passes, self.output_tokens),
                per(self.forced, self.output_tokens), per(self.accepted, self.drafted),
                per(self.valid_turns, self.turns), per(self.exact_calls, self.calls_expected),
                "–" if self.identical is None else f"{self.identical}/{self.turns}"]


def parse_text_calls(text: str, tools: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The calls in unconstrained output (``<tool_call>{json}</tool_call>``), or None where one does not parse,
    names no tool, or its arguments fail the tool's schema."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    calls = []
    for body in re.findall(r"<tool_call>(.*?)</tool_call>", text, re.DOTALL):
        try:
            call = json.loads(body)
            jsonschema.validate(call["arguments"], schemas[call["name"]])
        except (ValueError, KeyError, TypeError, jsonschema.ValidationError):
            return None
        calls.append({"name": call["name"], "arguments": call["arguments"]})
    return calls


def value_calls(value: Any) -> list[dict[str, Any]]:
    """A `ToolCallsValue`'s calls as plain dicts."""
    return [{"name": c.name, "arguments": c.arguments.model_dump() if hasattr(c.arguments, "model_dump")
             else c.arguments} for c in value.calls]


def score(tally: Tally, conversation: Conversation, calls: list[dict[str, Any]] | None) -> None:
    """Count one turn into ``tally``: valid when its calls parse and validate and there are as many as expected;
    a call is exact when name and arguments equal the expected ones (numbers compared as numbers)."""
    tally.turns += 1
    tally.calls_expected += len(conversation.expected)
    if calls is None or len(calls) != len(conversation.expected):
        return
    tally.valid_turns += 1
    tally.exact_calls += sum(same_call(a, b) for a, b in zip(calls, conversation.expected))


def same_call(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two calls (plain dicts) name one tool with equal arguments, numbers compared as numbers."""
    return a["name"] == b["name"] and json.loads(json.dumps(a["arguments"])) == b["arguments"]


def add_result(tally: Tally, conversation: Conversation, r: structspec.Result, seconds: float,
               plain: list[int]) -> None:
    """Count a structspec result: its own stats, its calls when it completed, and whether its tokens are
    ``plain`` (plain masked decoding's)."""
    tally.identical = (tally.identical or 0) + (r.token_ids == plain)
    tally.seconds += seconds
    tally.output_tokens += r.stats.output_tokens
    tally.passes += r.stats.target_forward_passes
    tally.forced += r.stats.forced_tokens
    tally.drafted += sum(d.drafted for name, d in r.stats.drafts.items() if name != "forced")
    tally.accepted += sum(d.accepted for name, d in r.stats.drafts.items() if name != "forced")
    score(tally, conversation, value_calls(r.value) if r.complete and r.value is not None else None)
    tally.unmarked += len(r.value.unmarked_calls) if r.complete and r.value is not None else 0


def add_peer(tally: Tally, conversation: Conversation, run: PeerRun) -> None:
    tally.seconds += run.seconds
    tally.output_tokens += run.output_tokens
    tally.passes += run.forward_passes
    score(tally, conversation, parse_text_calls(run.text, conversation.tools))


def run(lm: LM, conversations: list[Conversation], max_new_tokens: int, batch_size: int,
        calibrate: bool = False) -> dict[str, Tally]:
    """Every mode over ``conversations`` (greedy), after the model's pass-cost curve (`drafting_curve`) and a warm-up
    of each mode (first calls' one-off costs); the tallies by mode. Runs the model; changes nothing else but the
    curve's cache."""
    drafting_curve(lm, calibrate)
    warm = conversations[0]
    for peer in PEERS.values():
        peer(lm, chat_prompt_ids(lm, warm.messages, warm.spec().chat_tools()), 2)
    for options in STRUCTSPEC_MODES.values():
        structspec.generate_result(lm, warm.spec(), warm.messages, max_new_tokens=2, **options)
    structspec.generate_batch(lm, [c.spec() for c in conversations[:2]], [c.messages for c in conversations[:2]],
                              batch_size=2, max_new_tokens=2)
    batched = batch_label(batch_size)
    tallies = {name: Tally() for name in [*PEERS, *STRUCTSPEC_MODES, batched]}
    plain: dict[str, list[int]] = {}
    for conversation in conversations:
        spec = conversation.spec()
        prompt_ids = chat_prompt_ids(lm, conversation.messages, spec.chat_tools())
        prefill = prefill_seconds(lm, [prompt_ids])
        for tally in tallies.values():
            tally.prefill_seconds += prefill
        for name, peer in PEERS.items():
            add_peer(tallies[name], conversation, peer(lm, prompt_ids, max_new_tokens))
        for name, options in STRUCTSPEC_MODES.items():  # plain masked first: the others are compared with it
            start = time.perf_counter()
            r = structspec.generate_result(lm, spec, conversation.messages, max_new_tokens=max_new_tokens, **options)
            plain.setdefault(conversation.id, r.token_ids)
            add_result(tallies[name], conversation, r, time.perf_counter() - start, plain[conversation.id])
    specs = [c.spec() for c in conversations]
    start = time.perf_counter()
    results = structspec.generate_batch(lm, specs, [c.messages for c in conversations], batch_size=batch_size,
                                        max_new_tokens=max_new_tokens)
    seconds = (time.perf_counter() - start) / max(len(conversations), 1)
    for conversation, r in zip(conversations, results):
        add_result(tallies[batched], conversation, r, seconds, plain[conversation.id])
    return tallies


HEADER = ["mode", "s / call", "s / call after prefill", "passes / output token", "forced share",
          "drafted acceptance", "valid calls", "exact arguments", "= plain masked"]


def markdown(tallies: dict[str, Tally]) -> str:
    """The report as a Markdown table (the docs page's), then the prefill every mode pays."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join([name, *t.row()]) + " |" for name, t in tallies.items()]
    any_tally = next(iter(tallies.values()), Tally())
    lines += ["", f"Prefill alone (each prompt but its last token in one pass, timed once per conversation; every "
                  f"mode pays it): {any_tally.prefill_seconds / max(any_tally.calls_expected, 1):.3f} s / call."]
    if unmarked := [f"{name} {t.unmarked}" for name, t in tallies.items() if t.unmarked]:
        lines += ["", "Calls written as text without the markers in `auto` turns (`ToolCallsValue.unmarked_calls`: "
                      "not counted as calls; use choice='required' or a tool's name where a call is needed): "
                      + ", ".join(unmarked) + "."]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run every mode over the conversations ``args`` names on the model it names (loaded on its device, dtype
    and threads) and print the Markdown table."""
    lm = structspec.load(args.model, args.device, args.dtype, args.kernels, threads=args.threads)
    conversations = load_conversations(args.data, args.limit)
    tallies = run(lm, conversations, args.max_new_tokens, args.batch_size, args.calibrate)
    print(f"{lm.name} ({str(lm.dtype).removeprefix('torch.')} on {lm.device}), {len(conversations)} conversations, "
          f"{sum(len(c.expected) for c in conversations)} expected calls, greedy\n")
    print(markdown(tallies))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    toolbench_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
