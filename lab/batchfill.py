"""`python -m lab.batchfill`: one step's masks for a batch of different tool sets (a server's requests, each with
its own tools), filled on 1 thread and on several, structspec against xgrammar's batch fill, in one run.

The batch is ``--tool-sets`` (32) different sets of 2–5 of the tools in examples/toolcalls.jsonl, each the
schema of one call (``{"name": one of the set's tools, "arguments": its parameters}``), with one valid call each
(the example's arguments where it has some). Per repeat and thread count, every schema is compiled afresh
(structspec's compile cache cleared; the tokenizer's region shapes kept, as in a server) and the batch replays
its calls token by token in lockstep for ``--steps`` steps: per step each output accepts its token (not timed),
then the step's masks are filled (timed): structspec's `structspec.decoding.fill_bitmasks` (*first visit*: over
automata compiled afresh, so most masks are new, the count printed; *warm*: the same steps replayed, every mask
cached) and xgrammar's
``BatchGrammarMatcher.batch_fill_next_token_bitmask`` (its masks are prepared at compile). Masks only: no model,
no logits, no dtype. Every structspec fill is checked equal to the 1-thread one of its repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

import structspec
from lab.maskbench import TOKENIZER, compact, load_tokenizer
from lab.maskbench_engines import StructspecEngine, XgrammarEngine
from structspec.decoding import Cursor, fill_bitmasks
from structspec.tools.tasks import example_file

_ARGUMENTS = {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "null": None}


@dataclass(frozen=True)
class Request:
    """One tool set's call schema and the tokens of one valid call (no EOS: the steps stop before it)."""

    tools: tuple[str, ...]
    schema: dict[str, Any]
    token_ids: list[int]


@dataclass
class Seconds:
    """Per thread count, the mean seconds of one step's fill, one value per repeat."""

    by_threads: dict[int, list[float]] = field(default_factory=dict)

    def add(self, threads: int, steps: list[float]) -> None:
        self.by_threads.setdefault(threads, []).append(sum(steps) / len(steps))

    def median(self, threads: int) -> float:
        return statistics.median(self.by_threads[threads])


def load_tools() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """examples/toolcalls.jsonl's tools by name (their parameter schemas) and, per tool with an expected call,
    that call's arguments."""
    tools: dict[str, dict[str, Any]] = {}
    calls: dict[str, dict[str, Any]] = {}
    for line in example_file("toolcalls.jsonl").read_text().splitlines():
        record = json.loads(line)
        for tool in record["tools"]:
            tools.setdefault(tool["function"]["name"], tool["function"]["parameters"])
        for call in record.get("expected") or []:
            calls.setdefault(call["name"], call["arguments"])
    return tools, calls


def arguments_of(schema: dict[str, Any]) -> Any:
    """A small valid instance of a tool's parameter ``schema`` (its required properties, first enum values)."""
    if "enum" in schema:
        return schema["enum"][0]
    if schema.get("type") == "object":
        properties = schema.get("properties", {})
        return {name: arguments_of(properties[name]) for name in schema.get("required", [])}
    if schema.get("type") == "array":
        return []
    return _ARGUMENTS[schema.get("type", "string")]


def call_schema(tools: dict[str, dict[str, Any]], names: tuple[str, ...]) -> dict[str, Any]:
    """The schema of one call of a tool of ``names``, as an engine constrains a required tool call."""
    return {"anyOf": [{"type": "object", "properties": {"name": {"enum": [name]}, "arguments": tools[name]},
                       "required": ["name", "arguments"]} for name in names]}


def requests(tokenizer: Any, count: int, seed: int = 0) -> list[Request]:
    """``count`` different tool sets (2–5 tools each, drawn at random), each with the tokens of a call of its
    first tool."""
    tools, calls = load_tools()
    rng = np.random.default_rng(seed)
    names, seen, found = sorted(tools), set(), []
    while len(found) < count:
        picked = tuple(names[i] for i in rng.choice(len(names), size=int(rng.integers(2, 6)), replace=False))
        if frozenset(picked) in seen:
            continue
        seen.add(frozenset(picked))
        first = picked[0]
        call = {"name": first, "arguments": calls.get(first) or arguments_of(tools[first])}
        found.append(Request(picked, call_schema(tools, picked),
                             list(tokenizer.encode(compact(call), add_special_tokens=False))))
    return found


@dataclass
class Run:
    """One structspec run: seconds per step at first visit and warm, each step's masks, and how many of the
    masks were new (not computed before in the run)."""

    fresh: list[float] = field(default_factory=list)
    warm: list[float] = field(default_factory=list)
    masks: list[torch.Tensor] = field(default_factory=list)
    new: int = 0


def run_structspec(engine: StructspecEngine, batch: list[Request], steps: int, threads: int,
                   reference: list[torch.Tensor] | None) -> Run:
    """Compile every schema afresh, then per step accept each output's token and fill the batch's masks on
    ``threads`` threads, at first visit and then replayed warm; every step's masks checked equal to
    ``reference``'s."""
    structspec.clear_cache()  # (memory only: the disk holds automata as compiled, with no row or mask built)
    fsms = [engine.compile(request.schema) for request in batch]
    bitmask = fsms[0].allocate_token_bitmask(len(batch))
    run = Run()
    for timed in (run.fresh, run.warm):
        cursors = [Cursor(fsm) for fsm in fsms]
        for k in range(steps):
            if k and not all(c.accept([r.token_ids[k - 1]]) for c, r in zip(cursors, batch)):
                raise RuntimeError(f"structspec rejected step {k - 1} of a tool call")
            run.new += sum(not c.fsm.mask_ready(c.state) for c in cursors)
            start = time.perf_counter()
            fill_bitmasks(cursors, bitmask, threads=threads)
            timed.append(time.perf_counter() - start)
            if timed is run.fresh:
                run.masks.append(bitmask.clone())
            if reference is not None and not torch.equal(bitmask, reference[k]):
                raise RuntimeError(f"structspec's masks at step {k} on {threads} threads differ from 1 thread's")
    return run


def run_xgrammar(engine: XgrammarEngine, compiled: list[Any], batch: list[Request], steps: int,
                 threads: int) -> list[float]:
    """xgrammar's batch fill over fresh matchers of ``compiled``, per step after each accepts its token: seconds
    per step."""
    xgr = engine.xgr
    matchers = [xgr.GrammarMatcher(c) for c in compiled]
    filler = xgr.BatchGrammarMatcher(max_threads=threads)
    bitmask = xgr.allocate_token_bitmask(len(batch), engine.width)
    timed = []
    for k in range(steps):
        if k and not all(m.accept_token(r.token_ids[k - 1]) for m, r in zip(matchers, batch)):
            raise RuntimeError(f"xgrammar rejected step {k - 1} of a tool call")
        start = time.perf_counter()
        filler.batch_fill_next_token_bitmask(matchers, bitmask)
        timed.append(time.perf_counter() - start)
    return timed


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and the CPUs this process may use."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            name = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {len(os.sched_getaffinity(0))} CPUs usable"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def table(results: dict[str, Seconds], threads: list[int]) -> str:
    """The medians over repeats as Markdown: per engine and kind, ms per step at each thread count and the
    speed-up over the first count; then structspec ÷ xgrammar at each count."""
    first = threads[0]
    lines = ["| masks of one step | " + " | ".join(f"{t} thread{'s' * (t > 1)}" for t in threads) + " | "
             + " | ".join(f"speed-up {first} → {t}" for t in threads[1:]) + " |",
             "|---" * (1 + 2 * len(threads) - 1) + "|"]
    for name, seconds in results.items():
        lines.append(f"| {name} | " + " | ".join(_ms(seconds.median(t)) for t in threads) + " | "
                     + " | ".join(f"{seconds.median(first) / seconds.median(t):.2f}×" for t in threads[1:]) + " |")
    peer = results.get("xgrammar batch fill")
    if peer is not None:
        for name in [n for n in results if n.startswith("structspec")]:
            lines.append(f"| {name} ÷ xgrammar | " + " | ".join(
                f"{results[name].median(t) / peer.median(t):.2f}×" for t in threads) + " |" + " |" * (len(threads) - 1))
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", type=Path, default=TOKENIZER,
                   help="a directory with tokenizer.json(.gz) and tokenizer_config.json (default: Qwen2.5's)")
    p.add_argument("--logits-width", type=int, default=151936, help="the model's logits size (Qwen2.5: 151936)")
    p.add_argument("--tool-sets", type=int, default=32, help="requests in the batch, each with its own tool set")
    p.add_argument("--steps", type=int, default=16, help="steps replayed (at most the shortest call's tokens)")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts, the first the baseline")
    p.add_argument("--repeats", type=int, default=5, help="runs per thread count (the table shows medians)")
    p.add_argument("--no-xgrammar", dest="xgrammar", action="store_false", help="structspec alone")


def measure(tokenizer: Any, width: int, args: argparse.Namespace) -> tuple[dict[str, Seconds], str]:
    """Build the batch, learn the tokenizer's region shapes once, time every thread count in turn per repeat:
    the seconds by engine and kind, and a line saying what was run (the CPU, the batch, the load)."""
    engine = StructspecEngine(tokenizer, width, cold=False)
    batch = requests(tokenizer, args.tool_sets)
    steps = min(args.steps, *(len(r.token_ids) for r in batch))
    peer = XgrammarEngine(tokenizer, width) if args.xgrammar else None
    compiled = [peer.compiler.compile_json_schema(json.dumps(r.schema), any_whitespace=False,
                                                  separators=(",", ":")) for r in batch] if peer else []
    first = run_structspec(engine, batch, steps, 1, None)  # (also learns the region shapes, untimed)
    results = {"structspec first visit": Seconds(), "structspec warm": Seconds()}
    if peer:
        results["xgrammar batch fill"] = Seconds()
    loads = [os.getloadavg()[0]]
    for repeat in range(args.repeats):
        for threads in args.threads if repeat % 2 == 0 else args.threads[::-1]:  # (alternated: drift hits both)
            run = run_structspec(engine, batch, steps, threads, first.masks)
            results["structspec first visit"].add(threads, run.fresh)
            results["structspec warm"].add(threads, run.warm)
            if peer:
                results["xgrammar batch fill"].add(threads, run_xgrammar(peer, compiled, batch, steps, threads))
        loads.append(os.getloadavg()[0])
    return results, (f"{cpu_name()}; {len(batch)} tool sets, {steps} steps ({first.new} of {len(batch) * steps} "
                     f"masks new at first visit), {args.repeats} repeats, {width} logits; load (1 min) "
                     f"{min(loads):.2f}–{max(loads):.2f}; masks equal on every thread count (checked per step)")


def main(args: argparse.Namespace) -> int:
    """Measure on the tokenizer given and print the table (xgrammar left out, and named, where not installed)."""
    tokenizer = load_tokenizer(args.tokenizer)
    try:
        import xgrammar  # noqa: F401
    except ImportError as error:
        print(f"xgrammar is not installed ({error.name}): pip install xgrammar; structspec alone\n")
        args.xgrammar = False
    results, header = measure(tokenizer, args.logits_width, args)
    print(f"{header}\n\n{table(results, args.threads)}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
