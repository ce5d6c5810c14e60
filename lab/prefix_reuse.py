"""Prefix reuse, measured on two workloads whose prompts repeat their start:

(a) an extraction job: the shipped support tickets (``examples/tickets.jsonl``), each prompt the same instruction
    and the ticket schema's JSON before the ticket (`job_prompts`), seconds per record;
(b) an agent: the shipped tool-call conversations (``examples/agent_conversations.jsonl``, `conversations`), each
    run for `TURNS` calls with ``choice="required"``, every turn's prompt the one before it plus the assistant's
    call and the tool's fixed result, seconds per call.

    python -m lab.prefix_reuse --model qwen2.5-coder-0.5b
    python -m lab.prefix_reuse --model smollm2-135m --part b --records 2   # a quick check

Each part decodes the same calls on one loaded model, greedy with the default options: without reuse (the model's
prefix cache bound 0), then with it (its default bound), each after `structspec.clear_cache` and its compiles;
then transformers greedy (``model.generate``, unconstrained) on the same prompt ids. The outputs with and without
reuse must be token-identical (exit status 1 otherwise). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import torch

import structspec
from structspec.events import chat_prompt_ids
from structspec.models.transformers_lm import LM
from structspec.tools.benchmarks.peers import unconstrained_greedy
from structspec.tools.command import drafting_curve
from structspec.tools.tasks import example_file

INSTRUCTION = ("You file support tickets for a help desk. Read the ticket below and return it as JSON matching this "
               "schema: the ticket id, the date it was reported (YYYY-MM-DD), the customer, its category and "
               "priority, a one-sentence summary and the components it affects; the product, order number and "
               "whether a refund is asked for only where the ticket says so.\n")
TURNS = 3  # calls per conversation in part (b)


def job_prompts() -> tuple[dict, list[list[dict]]]:
    """The extraction job the benchmarks run: the shipped ticket schema and, for each of the shipped support
    tickets (``examples/tickets.jsonl``), one user message of the same instruction and the schema's JSON before the
    ticket. Reads the files; changes nothing."""
    schema = json.loads(example_file("ticket.schema.json").read_text())
    head = INSTRUCTION + json.dumps(schema, indent=1) + "\n\nTicket:\n"
    lines = example_file("tickets.jsonl").read_text().splitlines()
    return schema, [[{"role": "user", "content": head + json.loads(line)["text"]}] for line in lines if line.strip()]


def conversations(limit: int | None = None) -> list[dict[str, Any]]:
    """The first ``limit`` (all: None) of the shipped agent conversations (``examples/agent_conversations.jsonl``):
    each an ``id``, its ``tools`` (OpenAI-style dicts; conversations of one agent share them), its first
    ``messages`` (system and user) and ``results``, the fixed result of each tool, whatever its arguments. Reads
    the file; changes nothing."""
    lines = example_file("agent_conversations.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()][:limit]


def next_messages(conversation: dict[str, Any], messages: list[dict[str, Any]],
                  turn: structspec.ToolCallsValue) -> list[dict[str, Any]]:
    """The next turn's prompt: ``messages``, the assistant's ``turn`` and a tool message answering each of its calls
    with the tool's fixed result. Returns new messages; changes nothing."""
    return [*messages, turn.assistant_message(),
            *turn.tool_messages([conversation["results"][call.name] for call in turn.calls])]


@dataclass
class Calls:
    """One setting's calls in order: their output ids, prompt ids and reused prompt tokens, and the seconds of all."""

    outputs: list[list[int]] = field(default_factory=list)
    prompts: list[list[int]] = field(default_factory=list)
    reused: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, result: structspec.Result, prompt_ids: list[int], seconds: float) -> None:
        self.outputs.append(result.token_ids)
        self.prompts.append(prompt_ids)
        self.reused.append(result.stats.prefix_tokens_reused)
        self.seconds += seconds


def run_job(lm: LM, schema: dict, prompts: list[list[dict]], max_new_tokens: int) -> Calls:
    """Decode each of ``prompts`` under ``schema`` one at a time (compiled first, untimed). Runs the model; holds
    prompt chunks in its prefix cache where its bound allows."""
    compiled = structspec.compile(schema, lm)
    calls = Calls()
    for prompt in prompts:
        start = time.perf_counter()
        result = compiled.result(prompt, max_new_tokens=max_new_tokens)
        calls.add(result, chat_prompt_ids(lm, prompt, None), time.perf_counter() - start)
    return calls


def run_conversations(lm: LM, chats: list[dict[str, Any]], max_new_tokens: int) -> Calls:
    """Each conversation for `TURNS` calls (fewer where a turn stops before its call is complete), every spec
    compiled first, untimed. Runs the model; holds prompt chunks in its prefix cache where its bound allows."""
    specs = [structspec.compile(structspec.ToolCalls(chat["tools"], choice="required"), lm) for chat in chats]
    calls = Calls()
    for chat, compiled in zip(chats, specs):
        messages = chat["messages"]
        for _ in range(TURNS):
            start = time.perf_counter()
            result = compiled.result(messages, max_new_tokens=max_new_tokens)
            calls.add(result, chat_prompt_ids(lm, messages, compiled.tools), time.perf_counter() - start)
            if not result.complete:
                break
            messages = next_messages(chat, messages, result.value)
        # what the next prompt would reuse is the next chat's business: the caches are per model, not per chat
    return calls


def compare(lm: LM, label: str, unit: str, run: Callable[[], Calls], max_new_tokens: int) -> dict[str, Calls]:
    """Run ``run`` without, then with reuse, time transformers greedy on the same prompts and print the part's
    table; the calls of each setting, by name. Runs the model; leaves its prefix cache's bound as it was."""
    bound = lm.prefix_cache.max_bytes
    settings = {}
    for name, max_bytes in (("without reuse", 0), ("with reuse", bound)):
        structspec.clear_cache()  # automata and held chunks: each setting compiles and fills its cache alike
        lm.prefix_cache.max_bytes = max_bytes
        settings[name] = run()
    lm.prefix_cache.max_bytes = bound
    prompts = settings["without reuse"].prompts
    greedy = [unconstrained_greedy(lm, ids, max_new_tokens) for ids in prompts]
    peer = sum(r.seconds for r in greedy) / len(prompts)
    print(f"\n## {label}: {len(prompts)} {unit}s, {sum(map(len, prompts)):,} prompt tokens, "
          f"max_new_tokens={max_new_tokens}\n")
    print(f"| run | s / {unit} | × transformers greedy | prompt tokens reused | output tokens / {unit} |")
    print("|---|---|---|---|---|")
    for name, calls in settings.items():
        per = calls.seconds / len(prompts)
        print(f"| structspec, {name} | {per:.2f} | {peer / per:.2f}× | {sum(calls.reused):,} | "
              f"{sum(map(len, calls.outputs)) / len(prompts):.1f} |")
    print(f"| transformers greedy (unconstrained) | {peer:.2f} | 1.00× | 0 | "
          f"{sum(r.output_tokens for r in greedy) / len(prompts):.1f} |")
    print(f"\ntoken-identical with and without reuse: {identical(settings)} "
          f"({sum(a == b for a, b in zip(*(c.outputs for c in settings.values())))} of {len(prompts)} {unit}s)")
    return settings


def identical(settings: dict[str, Calls]) -> bool:
    """Whether every output with reuse is the output without."""
    return settings["with reuse"].outputs == settings["without reuse"].outputs


def turn_table(calls: Calls) -> None:
    """Per turn of the conversations: mean prompt tokens, reused, and recomputed (prefilled again although an
    earlier prompt of the conversation had them) against the tokens new since the turn before. Prints."""
    print("\n| turn | prompt tokens | reused | prefilled | of which new since the turn before |")
    print("|---|---|---|---|---|")
    by_turn: dict[int, list[tuple[int, int, int]]] = {}
    turn, previous = 0, None
    for ids, reused in zip(calls.prompts, calls.reused):
        extends = previous is not None and ids[:len(previous)] == previous
        turn = turn + 1 if extends else 1
        new = len(ids) - len(previous) if extends else len(ids)
        by_turn.setdefault(turn, []).append((len(ids), reused, new))
        previous = ids
    for turn, rows in sorted(by_turn.items()):
        mean = [sum(column) / len(rows) for column in zip(*rows)]
        print(f"| {turn} | {mean[0]:.0f} | {mean[1]:.0f} | {mean[0] - mean[1]:.0f} | {mean[2]:.0f} |")


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``, else `platform.processor`) and core count. Reads; changes nothing."""
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> int:
    """Parse the options, load the model, run the parts asked for and print their tables; exit status 1 where an
    output with reuse differs from the output without. Loads and runs a model; prints."""
    parser = argparse.ArgumentParser(prog="python -m lab.prefix_reuse", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b", help="a shipped model name or model directory")
    parser.add_argument("--part", choices=("a", "b", "both"), default="both",
                        help="a: the extraction job; b: the tool-call conversations")
    parser.add_argument("--records", type=int, default=None, metavar="N",
                        help="the first N tickets of (a) and conversations of (b) (default: all)")
    parser.add_argument("--dtype", default=None, help="the model's dtype (default: structspec.load's for the CPU)")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="per call (default: 300 for (a), 120 for (b))")
    args = parser.parse_args(argv)
    if args.records is not None and args.records < 1:
        parser.error(f"--records must be ≥ 1, got {args.records}; leave it out to run every record")
    lm = structspec.load(args.model, dtype=args.dtype)
    drafting_curve(lm, calibrate=True)  # the pass-cost curve drafting reads, stored before anything is timed
    schema, prompts = job_prompts()
    chats = conversations(args.records)
    prompts = prompts[:args.records]
    print(f"# structspec prefix reuse, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC\n\n"
          "command: python -m lab.prefix_reuse "
          f"{' '.join(sys.argv[1:] if argv is None else argv)}\n"
          f"machine: {cpu_name()}, {torch.get_num_threads()} torch threads, load average "
          f"{os.getloadavg()[0]:.2f} at the start\n"
          f"model: {lm.name}, {str(lm.dtype).removeprefix('torch.')}, prefix cache bound "
          f"{lm.prefix_cache.max_bytes / 2**20:.0f} MiB")
    # one-off costs of the first calls (kernels, the pass-cost curve), paid before any timed run
    structspec.compile(schema, lm).result(prompts[0], max_new_tokens=4)
    unconstrained_greedy(lm, chat_prompt_ids(lm, prompts[0], None), 2)
    same = True
    if args.part in ("a", "both"):
        tokens = args.max_new_tokens or 300
        same &= identical(compare(lm, "(a) extraction job", "record",
                                  lambda: run_job(lm, schema, prompts, tokens), tokens))
    if args.part in ("b", "both"):
        tokens = args.max_new_tokens or 120
        settings = compare(lm, f"(b) tool-call conversations, {TURNS} calls each", "call",
                           lambda: run_conversations(lm, chats, tokens), tokens)
        same &= identical(settings)
        turn_table(settings["with reuse"])
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (other processes skew timings)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
